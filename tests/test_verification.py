"""Block verification (Leviathan et al.): edge cases and the induced distribution of a whole block."""

from __future__ import annotations

import itertools

import pytest
import torch

from adaptive import naive_correction, residual_correction, verify_block
from adaptive.verification import acceptance_probabilities


def test_equal_distributions_accept_everything_and_never_build_a_residual():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    residual = residual_correction(p, p)
    assert torch.isfinite(residual).all()  # no 0/0
    for seed in range(200):
        tokens = torch.tensor([seed % 2])
        verdict = verify_block(p, p[:1], tokens, torch.Generator().manual_seed(seed))
        assert verdict.accepted == 1


def test_token_with_zero_draft_probability_is_reachable_through_the_residual():
    p = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[1.0, 0.0, 0.0]])  # the draft never proposes token 1
    residual = residual_correction(p[0], q[0])
    assert residual.tolist() == [0.0, 1.0, 0.0]
    outcomes = {verify_block(p, q, torch.tensor([0]), torch.Generator().manual_seed(s)) for s in range(200)}
    assert {(v.accepted, v.next_token) for v in outcomes} >= {(0, 1)}


def test_drafted_token_with_zero_draft_probability_is_rejected_as_input_error():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0]])
    with pytest.raises(ValueError, match="draft probability 0"):
        verify_block(p, q, torch.tensor([1]))


def test_acceptance_probability_is_min_one_ratio():
    p = torch.tensor([[0.5, 0.3, 0.2]] * 3)
    q = torch.tensor([[0.2, 0.5, 0.3]] * 3)
    ratio = acceptance_probabilities(p, q, torch.tensor([0, 1, 2]))
    assert torch.allclose(ratio, torch.tensor([1.0, 0.6, 2 / 3]))


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="rows"):
        verify_block(torch.ones(2, 3) / 3, torch.ones(2, 3) / 3, torch.tensor([0, 1]))


def test_empty_block_samples_from_p():
    verdict = verify_block(torch.tensor([[0.0, 1.0]]), torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))
    assert verdict == type(verdict)(0, 1)


def block_output_distribution(p: torch.Tensor, q: torch.Tensor, n: int, correction, seed: int = 0) -> dict:
    """Empirical distribution of the first emitted token of a 2-token block with context-free p, q."""
    generator = torch.Generator().manual_seed(seed)
    counts: dict[int, int] = {}
    for _ in range(n):
        tokens = torch.multinomial(q, 1, generator=generator).flatten()
        verdict = verify_block(p, q, tokens, generator, correction)
        first = int(tokens[0]) if verdict.accepted >= 1 else verdict.next_token
        counts[first] = counts.get(first, 0) + 1
    return {k: v / n for k, v in counts.items()}


@pytest.mark.parametrize(("correction", "exact"), [(residual_correction, True), (naive_correction, False)])
def test_first_token_of_a_block_follows_p_only_with_the_residual(correction, exact):
    p = torch.tensor([[0.5, 0.3, 0.2]] * 3)
    q = torch.tensor([[0.2, 0.5, 0.3]] * 2)
    n = 20_000
    freq = block_output_distribution(p, q, n, correction)
    sigma = (p[0] * (1 - p[0]) / n).sqrt()
    z = max(abs(freq.get(i, 0.0) - float(p[0, i])) / float(sigma[i]) for i in range(3))
    assert (z < 5.0) is exact


def test_enumerated_block_outcomes_are_exact():
    """Enumerate every (draft tokens, uniform region) combination of a 2-token block exactly."""
    p = torch.tensor([[0.6, 0.4], [0.1, 0.9], [0.7, 0.3]], dtype=torch.float64)
    q = torch.tensor([[0.3, 0.7], [0.5, 0.5]], dtype=torch.float64)
    joint = torch.zeros(2, 2, dtype=torch.float64)  # first two emitted tokens
    for x1, x2 in itertools.product(range(2), repeat=2):
        proposal = q[0, x1] * q[1, x2]
        a1 = min(1.0, float(p[0, x1] / q[0, x1]))
        a2 = min(1.0, float(p[1, x2] / q[1, x2]))
        r1 = residual_correction(p[0], q[0])
        r2 = residual_correction(p[1], q[1])
        # rejected at 1: first token ~ r1, second token ~ p[1] (a fresh round would draw it exactly)
        joint += proposal * (1 - a1) * r1[:, None] * p[1][None, :]
        joint[x1] += proposal * a1 * (1 - a2) * r2
        joint[x1, x2] += proposal * a1 * a2
    assert torch.allclose(joint, p[0][:, None] * p[1][None, :])


def test_greedy_verification_equals_the_general_rule_on_one_hot_distributions():
    from adaptive import SamplingConfig, sampling_distribution
    from adaptive.verification import verify_block_greedy

    generator = torch.Generator().manual_seed(0)
    for trial in range(300):
        gamma = trial % 6
        target_logits = torch.randn(gamma + 1, 5, generator=generator)
        draft_logits = torch.randn(gamma, 5, generator=generator)
        # make some drafted tokens agree with the target to exercise long accepted prefixes
        draft_logits[: trial % (gamma + 1)] = target_logits[: trial % (gamma + 1)]
        p = sampling_distribution(target_logits, SamplingConfig(0.0))
        q = sampling_distribution(draft_logits, SamplingConfig(0.0))
        tokens = draft_logits.argmax(dim=-1)
        assert verify_block_greedy(target_logits, tokens) == verify_block(p, q, tokens, generator)


def test_inverse_cdf_sampler_never_draws_zero_probability_tokens_and_matches_probabilities():
    from adaptive.sampling import sample

    probs = torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0])
    draws = torch.stack([sample(probs, torch.Generator().manual_seed(s)) for s in range(4000)])
    assert set(draws.tolist()) == {1, 3}
    n = 4000
    assert abs(float((draws == 3).double().mean()) - 0.75) < 5 * (0.75 * 0.25 / n) ** 0.5
