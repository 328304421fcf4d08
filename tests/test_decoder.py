"""The decoder: greedy identity for every policy, cache rollback, stopping, streaming, input checks."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from adaptive import SamplingConfig, SpeculativeDecoder, generate_plain
from adaptive.cached_model import CachedModel
from policies import POLICY_SPECS, StaticDepth, make_policy

SPECS = ["static:1", "static:3", "static:8", "heuristic", "confidence", "entropy:1.5", "specdec:0.5", "suffix", "costmodel", "costmodel:0.1"]
PROMPTS = [[5], [1, 2, 3], [7, 7, 7, 7, 7, 7, 7, 7], [15, 0, 9, 4, 2, 11]]


def test_every_registered_policy_is_covered():
    assert {spec.partition(":")[0] for spec in SPECS} == set(POLICY_SPECS)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("draft_name", ["near_draft", "far_draft"])
def test_greedy_output_is_identical_to_plain_greedy(spec, draft_name, target, request):
    decoder = SpeculativeDecoder(target, request.getfixturevalue(draft_name), make_policy(spec))
    for prompt in PROMPTS:
        for length in (1, 7, 40):
            expected = generate_plain(target, prompt, length).token_ids
            assert decoder.generate(prompt, length).token_ids == expected, (prompt, length)


def test_near_draft_actually_gets_tokens_accepted(target, near_draft):
    result = SpeculativeDecoder(target, near_draft, StaticDepth(4)).generate([1, 2, 3], 60)
    assert result.acceptance_rate > 0.3
    assert max(r.accepted for r in result.rounds) >= 2


def test_rounds_emit_between_one_and_gamma_plus_one_tokens(target, near_draft):
    for temperature in (0.0, 1.0):
        decoder = SpeculativeDecoder(target, near_draft, StaticDepth(5), SamplingConfig(temperature))
        result = decoder.generate([4, 2], 50, seed=3)
        assert len(result.token_ids) == 50 and result.stop_reason == "length"
        assert sum(r.emitted for r in result.rounds) == 50
        for r in result.rounds:
            assert 1 <= r.emitted <= r.verified + 1
            assert r.accepted <= r.verified <= r.drafted <= 5
            assert r.emitted == min(r.accepted + 1, 50 - sum(x.emitted for x in result.rounds[: result.rounds.index(r)]))
            assert (r.draft_time > 0 or r.drafted == 0) and r.verify_time > 0 and r.forward_time > 0
            assert len(r.steps) == r.drafted


def test_caches_hold_exactly_the_confirmed_prefix_after_every_round(target, far_draft):
    decoder = SpeculativeDecoder(target, far_draft, StaticDepth(4), SamplingConfig(1.0))
    tokens = [3, 1]
    for stats in decoder.stream(tokens, 40, seed=1):
        tokens.extend(stats.tokens)
        assert decoder.target.length == decoder.target.cache.get_seq_length() == len(tokens) - 1
        assert decoder.draft.length == decoder.draft.cache.get_seq_length() <= len(tokens) - 1


def test_rolled_back_cache_gives_the_logits_of_a_fresh_prefill(target):
    prefix, rejected_tail = [3, 1, 4, 1, 5], [9, 2, 6, 5]
    model = CachedModel(target)
    model.forward(prefix)
    model.forward(rejected_tail)
    model.rollback(len(prefix))
    after_rollback = model.forward([8])
    fresh = CachedModel(target)
    fresh.forward(prefix)
    assert torch.allclose(after_rollback, fresh.forward([8]), atol=1e-10)
    with torch.no_grad():
        full = target(torch.tensor([prefix + [8]])).logits[0, -1:]
    assert torch.allclose(after_rollback, full, atol=1e-8)


def test_stream_yields_the_same_rounds_as_generate(target, near_draft):
    decoder = SpeculativeDecoder(target, near_draft, StaticDepth(3), SamplingConfig(0.9))
    streamed = [token for stats in decoder.stream([1, 2], 30, seed=11) for token in stats.tokens]
    assert streamed == decoder.generate([1, 2], 30, seed=11).token_ids


def test_generate_shows_each_round_as_it_completes_and_leaves_its_time_out(target, near_draft):
    """``on_round`` sees every round in order (what ``adaptive generate`` streams); what it spends is not the generation's."""
    import time

    decoder = SpeculativeDecoder(target, near_draft, StaticDepth(3), SamplingConfig(0.9))
    seen = []
    result = decoder.generate([1, 2], 30, seed=11, on_round=lambda stats: (seen.append(stats), time.sleep(0.05)))
    assert seen == result.rounds and [t for stats in seen for t in stats.tokens] == decoder.generate([1, 2], 30, seed=11).token_ids
    assert result.total_time < 0.05 * len(seen)


def test_sampling_is_reproducible_from_the_seed(target, far_draft):
    decoder = SpeculativeDecoder(target, far_draft, StaticDepth(2), SamplingConfig(1.0, top_k=8))
    assert decoder.generate([1], 25, seed=4).token_ids == decoder.generate([1], 25, seed=4).token_ids
    assert decoder.generate([1], 25, seed=4).token_ids != decoder.generate([1], 25, seed=5).token_ids


def test_generation_stops_at_eos(target, near_draft):
    plain = generate_plain(target, [1, 2, 3], 30).token_ids
    eos = plain[12]
    first = plain.index(eos)
    result = SpeculativeDecoder(target, near_draft, StaticDepth(6), eos_token_id=eos).generate([1, 2, 3], 30)
    assert result.token_ids == plain[: first + 1]
    assert result.stop_reason == "eos"


def test_bfloat16_models_decode_greedy_identically(target, near_draft):
    target_bf16, draft_bf16 = tiny_llama(0, dtype=torch.bfloat16), tiny_llama(3, dtype=torch.bfloat16)
    result = SpeculativeDecoder(target_bf16, draft_bf16, StaticDepth(3)).generate([2, 4], 12)
    assert len(result.token_ids) == 12
    assert all(0 <= t < 16 for t in result.token_ids)


def test_mismatched_vocabularies_raise(target):
    other = tiny_llama(1, vocab=20)
    with pytest.raises(ValueError, match="vocabularies differ: target has 16 .* draft has 20"):
        SpeculativeDecoder(target, other, StaticDepth(2))


def test_mismatched_tokenizers_raise(target, near_draft):
    class Vocab:
        def __init__(self, mapping):
            self.mapping = mapping

        def get_vocab(self):
            return self.mapping

    same = {f"t{i}": i for i in range(16)}
    swapped = dict(same, t0=1, t1=0)
    SpeculativeDecoder(target, near_draft, StaticDepth(2), tokenizer=Vocab(same), draft_tokenizer=Vocab(same))
    with pytest.raises(ValueError, match="tokenizers differ in 4"):
        SpeculativeDecoder(target, near_draft, StaticDepth(2), tokenizer=Vocab(same), draft_tokenizer=Vocab(swapped))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda d: d.generate([], 5), "prompt is empty"),
        (lambda d: d.generate([1], 0), "max_new_tokens"),
        (lambda d: d.generate("text without tokenizer", 5), "needs a tokenizer"),
    ],
)
def test_bad_generate_arguments_are_named(target, near_draft, call, message):
    with pytest.raises(ValueError, match=message):
        call(SpeculativeDecoder(target, near_draft, StaticDepth(2)))


def test_policy_asking_for_an_impossible_verification_size_is_an_error(target, near_draft):
    class Greedy(StaticDepth):
        def verify_size(self, state):
            return state.depth + 1

    with pytest.raises(ValueError, match="asked to verify 3 of 2"):
        SpeculativeDecoder(target, near_draft, Greedy(2)).generate([1], 10)


def test_smaller_verification_size_discards_the_unverified_tail(target, near_draft):
    class VerifyOne(StaticDepth):
        def verify_size(self, state):
            return 1

    decoder = SpeculativeDecoder(target, near_draft, VerifyOne(4))
    result = decoder.generate([1, 2, 3], 30)
    assert result.token_ids == generate_plain(target, [1, 2, 3], 30).token_ids
    assert result.rounds[0].drafted == 4
    assert all(r.verified == min(1, r.drafted) and r.emitted <= 2 for r in result.rounds)


def test_non_policy_is_rejected(target, near_draft):
    with pytest.raises(TypeError, match="DraftPolicy"):
        SpeculativeDecoder(target, near_draft, policy="static:4")
