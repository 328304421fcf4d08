"""A draft policy inside transformers' own ``generate()`` (``custom_generate``): greedy output identical to
plain ``generate()``, sampled output exact (the decoder's statistical test, against a distribution computed
with transformers' own logits warpers), stopping criteria honoured, unsupported settings refused."""

from __future__ import annotations

import pytest
import torch
from conftest import brief_synthetic_config, tiny_head, tiny_llama
from test_decoder_exactness import N_SAMPLES, PROMPT, deviation_statistics
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from adaptive.decoder import generate_plain
from adaptive.engines import use_engine
from adaptive.integrations.transformers import generate as adaptive_generate
from adaptive.verification import naive_correction, residual_correction
from lab.config import config_from_dict
from lab.training import train
from policies import HeuristicSchedule, StaticDepth, make_policy


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """A policy trained briefly on the synthetic environment (what ``load_policy(RUN)`` gives a user)."""
    folder = tmp_path_factory.mktemp("learned") / "run"
    train(config_from_dict(brief_synthetic_config("tiny")), folder)
    return make_policy(str(folder))


@pytest.mark.parametrize("prompt", [[3], [7, 1, 3]])
def test_greedy_output_is_plain_generate_for_every_policy_and_draft(prompt, target, near_draft, far_draft, eagle_head, learned):
    ids = torch.tensor([prompt])
    plain = target.generate(ids, max_new_tokens=40, do_sample=False)
    for draft in (near_draft, far_draft, eagle_head):
        for policy in (StaticDepth(3), HeuristicSchedule(2), learned):
            out = target.generate(ids, custom_generate=adaptive_generate, draft=draft, policy=policy, max_new_tokens=40, do_sample=False)
            assert torch.equal(out, plain), (type(draft).__name__, policy.name)


def test_the_generate_route_runs_on_a_lean_target_and_keeps_plain_generates_tokens():
    """A target with a lean engine attached (int8 weights, the head drafting from its int8 copy): generate() with the
    policy runs the decoder on the lean forward and emits plain decoding's tokens on that engine."""
    target = tiny_llama(seed=0, dtype=torch.float32)
    head = tiny_head(target)
    use_engine((target, head), "lean-int8")
    ids = torch.tensor([[7, 1, 3]])
    out = target.generate(ids, custom_generate=adaptive_generate, draft=head, policy=StaticDepth(3), max_new_tokens=30, do_sample=False)
    assert out[0, 3:].tolist() == generate_plain(target, [7, 1, 3], max_new_tokens=30).token_ids


def test_eos_and_stopping_criteria_match_plain_generate(target, near_draft):
    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([int(input_ids[0, -1]) == 0])

    ids = torch.tensor([[3]])
    for eos in (6, 13, 11):
        plain = target.generate(ids, max_new_tokens=60, do_sample=False, eos_token_id=eos)
        out = target.generate(
            ids, custom_generate=adaptive_generate, draft=near_draft, policy=StaticDepth(4), max_new_tokens=60, do_sample=False, eos_token_id=eos
        )
        assert torch.equal(out, plain)
    stop = StoppingCriteriaList([StopAfter()])
    plain = target.generate(ids, max_new_tokens=60, do_sample=False, stopping_criteria=stop)
    out = target.generate(
        ids, custom_generate=adaptive_generate, draft=near_draft, policy=StaticDepth(4), max_new_tokens=60, do_sample=False, stopping_criteria=stop
    )
    assert torch.equal(out, plain) and plain.shape[1] < ids.shape[1] + 60
    result = target.generate(ids, custom_generate=adaptive_generate, draft=near_draft, policy=StaticDepth(4), max_new_tokens=8, return_dict_in_generate=True)
    assert result.sequences.shape == (1, ids.shape[1] + 8)


SETTINGS = {"temperature": 0.8, "top_k": 6, "top_p": 0.9}


def hf_two_token_distribution(target, prompt: list[int]) -> torch.Tensor:
    """P(x1, x2 | prompt) under plain ``generate(do_sample=True, **SETTINGS)``: the target's full forwards
    through transformers' own warpers (an independent path from the decoder's sampling code)."""
    warpers = LogitsProcessorList([TemperatureLogitsWarper(SETTINGS["temperature"]), TopKLogitsWarper(SETTINGS["top_k"]), TopPLogitsWarper(SETTINGS["top_p"])])
    vocab = target.config.vocab_size
    with torch.no_grad():
        first = warpers(torch.tensor([prompt]), target(torch.tensor([prompt])).logits[:, -1].double()).softmax(-1)[0]
        continuations = torch.tensor([prompt + [x] for x in range(vocab)])
        second = warpers(continuations, target(continuations).logits[:, -1].double()).softmax(-1)
    return first[:, None] * second


@pytest.mark.slow
@pytest.mark.parametrize("correction", [residual_correction, naive_correction], ids=["residual", "naive"])
def test_sampled_generate_follows_the_target_distribution_and_the_naive_rule_is_detected(target, far_draft, learned, correction):
    """N = 20,000 calls of ``generate(do_sample=True, T=0.8, top-k 6, top-p 0.9)`` with a learned policy and
    the far draft, seeded through ``torch.manual_seed``: every outcome and the Pearson statistic within 5σ of
    the exact two-token distribution; the naive rule, same call, beyond."""
    counts = torch.zeros(target.config.vocab_size, target.config.vocab_size, dtype=torch.float64)
    ids = torch.tensor([PROMPT])
    for seed in range(N_SAMPLES):
        torch.manual_seed(seed)
        out = target.generate(
            ids, custom_generate=adaptive_generate, draft=far_draft, policy=learned, correction=correction, max_new_tokens=2, do_sample=True, **SETTINGS
        )
        first, second = out[0, len(PROMPT) :].tolist()
        counts[first, second] += 1
    max_z, chi2_z = deviation_statistics(counts, hf_two_token_distribution(target, PROMPT))
    if correction is residual_correction:
        assert max_z < 5.0 and chi2_z < 5.0, (max_z, chi2_z)
    else:
        assert max_z > 5.0 and chi2_z > 5.0, "the naive rule should be detected as biased"


def test_sampled_calls_follow_torch_manual_seed(target, far_draft):
    def run(seed):
        torch.manual_seed(seed)
        return target.generate(
            torch.tensor([PROMPT]), custom_generate=adaptive_generate, draft=far_draft, policy=StaticDepth(2), max_new_tokens=20, do_sample=True
        )

    assert torch.equal(run(1), run(1)) and not torch.equal(run(1), run(2))


def test_draft_trees_through_generate_greedy_and_sampled(target, far_draft, eagle_head):
    """``tree="K,W,V"``: greedy output is plain ``generate()``'s for a draft model and a head; sampled calls follow
    ``torch.manual_seed``."""
    ids = torch.tensor([[7, 1, 3]])
    plain = target.generate(ids, max_new_tokens=30, do_sample=False)
    for draft in (far_draft, eagle_head):
        out = target.generate(ids, custom_generate=adaptive_generate, draft=draft, policy=StaticDepth(3), tree="2,2,4", max_new_tokens=30, do_sample=False)
        assert torch.equal(out, plain), type(draft).__name__

    def sampled(seed):
        torch.manual_seed(seed)
        return target.generate(ids, custom_generate=adaptive_generate, draft=far_draft, policy=StaticDepth(2), tree="3,2,5", max_new_tokens=20, do_sample=True)

    assert torch.equal(sampled(1), sampled(1)) and not torch.equal(sampled(1), sampled(2))


def test_unsupported_settings_are_refused_by_name(target, near_draft):
    ids = torch.tensor([[3, 4]])
    call = {"custom_generate": adaptive_generate, "max_new_tokens": 4}
    with pytest.raises(ValueError, match="RepetitionPenaltyLogitsProcessor"):
        target.generate(ids, draft=near_draft, policy=StaticDepth(2), repetition_penalty=1.3, **call)
    with pytest.raises(ValueError, match="batch size 1"):
        target.generate(torch.tensor([[3, 4], [5, 6]]), draft=near_draft, policy=StaticDepth(2), **call)
    with pytest.raises(ValueError, match="draft="):
        target.generate(ids, assistant_model=near_draft, policy=StaticDepth(2), **call)
    with pytest.raises(TypeError, match="DraftPolicy"):
        target.generate(ids, draft=near_draft, policy="static:2", **call)
