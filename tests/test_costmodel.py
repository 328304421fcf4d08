"""The cost model reproduces the seed's numbers and its generalisations agree with it."""

from __future__ import annotations

import pytest

from adaptive.costmodel import (
    expected_tokens,
    expected_tokens_from_lengths,
    optimal_gamma,
    optimal_gamma_from_lengths,
    speedup,
)


def test_seed_optimum_cheap_draft():
    point = optimal_gamma(0.7, 0.05)
    assert point.gamma == 6
    assert point.expected_tokens == pytest.approx(3.058819, abs=1e-6)
    assert point.speedup == pytest.approx(2.353, abs=5e-4)


def test_seed_optimum_expensive_draft():
    point = optimal_gamma(0.7, 0.20)
    assert point.gamma == 3
    assert point.speedup == pytest.approx(1.583, abs=5e-4)


def test_seed_expensive_verification_makes_speculation_slower():
    assert speedup(0.7, 6, 0.05, g=3.0) == pytest.approx(0.927, abs=5e-4)


def test_alpha_one_and_zero():
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0
    assert optimal_gamma(0.0, 0.05).gamma == 1


def test_empirical_lengths_reproduce_the_geometric_formula():
    alpha, depth = 0.7, 12
    # exact geometric mass on L = 0..depth-1, remaining tail at L = depth, as 10^5 "observations"
    counts = [round(1e5 * (alpha**k) * (1 - alpha)) for k in range(depth)]
    counts.append(100_000 - sum(counts))
    lengths = [k for k, c in enumerate(counts) for _ in range(c)]
    for gamma in (1, 3, 6, 12):
        assert expected_tokens_from_lengths(lengths, gamma) == pytest.approx(expected_tokens(alpha, gamma), abs=1e-4)
    assert optimal_gamma_from_lengths(lengths, 0.05, max_gamma=12).gamma in (5, 6)


def test_measured_g_profile():
    profile = {g: 1.0 + 0.5 * g for g in range(1, 9)}
    point = optimal_gamma(0.7, 0.05, profile, max_gamma=8)
    assert point.gamma == 1  # a steep g(γ) favours short drafts
    with pytest.raises(ValueError, match="no value for gamma=9"):
        optimal_gamma(0.7, 0.05, profile, max_gamma=9)


@pytest.mark.parametrize(("kwargs", "message"), [({"alpha": 1.5, "c": 0.1}, "alpha"), ({"alpha": 0.5, "c": -1}, "c ")])
def test_bad_inputs_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        optimal_gamma(**kwargs)
