"""The probability contract: one function from logits to the sampled distribution."""

from __future__ import annotations

import pytest
import torch

from adaptive import SamplingConfig, sampling_distribution
from adaptive.sampling import draft_features, sample

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])


def test_greedy_is_one_hot_on_argmax():
    probs = sampling_distribution(LOGITS, SamplingConfig(0.0))
    assert probs.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_temperature_scales_logits_before_softmax():
    probs = sampling_distribution(LOGITS, SamplingConfig(0.5))
    assert torch.allclose(probs, torch.softmax(LOGITS / 0.5, dim=-1))


def test_top_k_keeps_the_k_most_probable_tokens_renormalised():
    probs = sampling_distribution(LOGITS, SamplingConfig(1.0, top_k=2))
    expected = torch.softmax(torch.tensor([2.0, 3.0]), dim=-1)
    assert probs[[1, 2, 3]].sum() == 0
    assert torch.allclose(probs[[0, 4]], expected)


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass():
    full = torch.softmax(LOGITS, dim=-1)  # sorted order: 4, 0, 1, 2, 3
    top_two = float(full[4] + full[0])
    kept_two = sampling_distribution(LOGITS, SamplingConfig(1.0, top_p=top_two - 1e-4))
    assert set(kept_two.nonzero().flatten().tolist()) == {4, 0}
    kept_three = sampling_distribution(LOGITS, SamplingConfig(1.0, top_p=top_two + 1e-4))
    assert set(kept_three.nonzero().flatten().tolist()) == {4, 0, 1}
    assert torch.isclose(kept_three.sum(), torch.tensor(1.0))


def test_top_p_always_keeps_the_top_token():
    probs = sampling_distribution(LOGITS, SamplingConfig(1.0, top_p=1e-6))
    assert probs.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_mask_removes_tokens_before_everything_else():
    mask = torch.tensor([True, True, True, True, False])
    assert sampling_distribution(LOGITS, SamplingConfig(0.0), mask).argmax() == 0
    assert sampling_distribution(LOGITS, SamplingConfig(1.0), mask)[4] == 0


def test_rows_are_processed_independently():
    batch = torch.stack([LOGITS, LOGITS.flip(0)])
    probs = sampling_distribution(batch, SamplingConfig(0.7, top_k=3))
    assert torch.allclose(probs[1], sampling_distribution(LOGITS.flip(0), SamplingConfig(0.7, top_k=3)))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_invalid_logits_raise(bad):
    logits = LOGITS.clone()
    logits[2] = bad
    with pytest.raises(ValueError, match="NaN|inf"):
        sampling_distribution(logits, SamplingConfig(1.0))


def test_fully_masked_row_raises():
    with pytest.raises(ValueError, match="every logit"):
        sampling_distribution(torch.full((4,), float("-inf")), SamplingConfig(1.0))


def test_neg_inf_is_a_legal_mask():
    logits = LOGITS.clone()
    logits[0] = float("-inf")
    assert sampling_distribution(logits, SamplingConfig(1.0))[0] == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"temperature": -1.0}, "temperature"), ({"top_k": -2}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p")],
)
def test_bad_config_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def test_sample_draws_with_the_given_generator():
    probs = torch.softmax(LOGITS, dim=-1)
    first = [int(sample(probs, torch.Generator().manual_seed(5))) for _ in range(3)]
    assert len(set(first)) == 1


def test_draft_features_use_untempered_softmax():
    ((token, top1, entropy, log_prob, margin),) = draft_features(LOGITS[None], torch.tensor([0]))
    assert token == 0
    assert draft_features(LOGITS[None])[0][0] == 4  # greedy: the arg-max
    probs = torch.softmax(LOGITS, dim=-1)
    assert top1 == pytest.approx(float(probs.max()))
    assert entropy == pytest.approx(float(-(probs * probs.log()).sum()), rel=1e-5)
    assert log_prob == pytest.approx(float(probs[0].log()), rel=1e-5)
    assert margin == pytest.approx(float(probs[4] - probs[0]), rel=1e-5)  # logits 3.0 and 2.0: the two most probable


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_draft_features_reject_invalid_logits(bad):
    logits = LOGITS.clone()
    logits[1] = bad
    with pytest.raises(ValueError, match="NaN|inf"):
        draft_features(logits[None])


def test_draft_features_handle_masked_tokens():
    logits = LOGITS.clone()
    logits[0] = float("-inf")
    ((_, top1, entropy, _, margin),) = draft_features(logits[None])
    assert entropy == pytest.approx(float(torch.special.entr(torch.softmax(logits, -1)).sum()))
    probs = torch.softmax(logits, -1)
    assert margin == pytest.approx(float(probs[4] - probs[1]), rel=1e-5)  # the masked token is not the runner-up


def test_draft_features_margin_of_a_single_candidate():
    logits = torch.full((5,), float("-inf"))
    logits[2] = 0.0  # a copy drafter's row with one continuation
    ((token, top1, _, _, margin),) = draft_features(logits[None])
    assert (token, top1, margin) == (2, 1.0, 1.0)


def _reduced_vocabulary_logits(rows: int, vocab: int, kept: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 logits scoring a sorted subset of ``kept`` of ``vocab`` tokens (-inf elsewhere), rounded so that
    ties occur, and that subset."""
    generator = torch.Generator().manual_seed(seed)
    vocabulary = torch.randperm(vocab, generator=generator)[:kept].sort().values
    logits = torch.full((rows, vocab), float("-inf"), dtype=torch.bfloat16)
    logits[:, vocabulary] = (torch.randn(rows, kept, generator=generator) * 2).round().to(torch.bfloat16)
    return logits, vocabulary


def test_features_over_the_draft_vocabulary_equal_those_over_the_full_one():
    logits, vocabulary = _reduced_vocabulary_logits(rows=16, vocab=300, kept=40, seed=3)
    assert (logits == logits.max(dim=-1, keepdim=True).values).sum(dim=-1).gt(1).any()  # arg-max ties occur
    greedy, reduced = draft_features(logits), draft_features(logits, vocabulary=vocabulary)
    assert [row[0] for row in reduced] == [row[0] for row in greedy]  # the same token, ties included
    assert torch.allclose(torch.tensor([row[1:] for row in reduced]), torch.tensor([row[1:] for row in greedy]), atol=1e-6)
    outside = int(next(t for t in range(300) if t not in set(vocabulary.tolist())))
    tokens = torch.cat((vocabulary[torch.arange(15) % 40], torch.tensor([outside])))  # sampled tokens, one with q = 0
    full, fast = draft_features(logits, tokens), draft_features(logits, tokens, vocabulary)
    assert [row[3] for row in fast][-1] == [row[3] for row in full][-1] == float("-inf")
    assert torch.allclose(torch.tensor([row[3] for row in fast][:-1]), torch.tensor([row[3] for row in full][:-1]), atol=1e-6)


def test_arg_max_widens_half_precision_exactly_ties_included():
    from adaptive.sampling import arg_max, greedy_token

    logits, _ = _reduced_vocabulary_logits(rows=32, vocab=300, kept=300, seed=5)  # every column scored, rounded: ties
    assert (logits == logits.max(dim=-1, keepdim=True).values).sum(dim=-1).gt(1).any()
    assert torch.equal(arg_max(logits), logits.argmax(dim=-1))
    assert greedy_token(logits[3]) == int(logits[3].argmax())
    with pytest.raises(ValueError, match="NaN"):
        greedy_token(torch.tensor([0.0, float("nan")]))
