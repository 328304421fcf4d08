"""The exactness auditor reproduces the seed article's numbers."""

from __future__ import annotations

import pytest
import torch

from adaptive import induced_distribution, monte_carlo_audit, naive_correction, residual_correction, total_variation

P, Q = (0.5, 0.3, 0.2), (0.2, 0.5, 0.3)


def test_residual_rule_induces_p_exactly():
    assert torch.allclose(induced_distribution(P, Q, residual_correction), torch.tensor(P, dtype=torch.float64))


def test_naive_rule_induces_the_seed_counterexample():
    induced = induced_distribution(P, Q, naive_correction)
    assert torch.allclose(induced, torch.tensor([0.35, 0.39, 0.26], dtype=torch.float64))
    assert total_variation(induced, P) == pytest.approx(0.15)


def test_monte_carlo_matches_exact_distributions_within_five_standard_errors():
    audit = monte_carlo_audit(P, Q, trials=200_000, seed=20260923)
    assert float(audit.standard_error[0]) == pytest.approx(0.00112, abs=1e-5)
    for name, rule in (("residual", residual_correction), ("naive", naive_correction)):
        exact = induced_distribution(P, Q, rule)
        assert ((audit.frequencies[name] - exact).abs() < 5 * audit.standard_error).all(), name
    assert (audit.frequencies["naive"] - torch.tensor(P, dtype=torch.float64)).abs().max() > 0.1


def test_bad_distributions_are_named():
    with pytest.raises(ValueError, match="q must sum to 1"):
        induced_distribution(P, (0.5, 0.5, 0.5))
    with pytest.raises(ValueError, match="same size"):
        induced_distribution(P, (0.5, 0.5))


def test_p_equal_q_has_no_rejection():
    assert torch.allclose(induced_distribution(P, P), torch.tensor(P, dtype=torch.float64))
