"""Exactness auditor: the output distribution a correction rule induces, exactly and by Monte Carlo.

For one position with target p and draft q, a token is proposed x ~ q and kept with probability
min(1, p(x)/q(x)). The kept mass is m = min(p, q); the rejection probability is Z = 1 - sum(m); after a
rejection the rule's distribution r is sampled. The induced distribution is therefore m + Z·r — exactly p
for the residual rule, and something else for the naive rule. Both rules are the functions the decoder
itself uses (``adaptive.verification``), so the audit checks the shipped code, not a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adaptive.verification import CorrectionRule, acceptance_probabilities, naive_correction, residual_correction

RULES: dict[str, CorrectionRule] = {"residual": residual_correction, "naive": naive_correction}
"""The correction rules the auditor knows, by name."""

SEED_P = (0.5, 0.3, 0.2)
SEED_Q = (0.2, 0.5, 0.3)
SEED_MONTE_CARLO = 20260923


def _as_distribution(values: torch.Tensor | tuple[float, ...] | list[float], name: str) -> torch.Tensor:
    tensor = torch.as_tensor(values, dtype=torch.float64)
    if tensor.dim() != 1 or tensor.numel() < 1:
        raise ValueError(f"{name} must be a 1-D probability vector, got shape {tuple(tensor.shape)}")
    if (tensor < 0).any() or not torch.isfinite(tensor).all():
        raise ValueError(f"{name} must be finite and non-negative, got {tensor.tolist()}")
    if abs(float(tensor.sum()) - 1.0) > 1e-9:
        raise ValueError(f"{name} must sum to 1, got sum {float(tensor.sum())!r}")
    return tensor


def induced_distribution(p, q, rule: CorrectionRule = residual_correction) -> torch.Tensor:
    """The exact distribution of the token emitted at one position under ``rule``: min(p,q) + Z·rule(p,q).

    Example:
        >>> induced_distribution([.5, .3, .2], [.2, .5, .3], naive_correction).tolist()  # doctest: +ELLIPSIS
        [0.35..., 0.39..., 0.26...]
    """
    p_t, q_t = _as_distribution(p, "p"), _as_distribution(q, "q")
    if p_t.shape != q_t.shape:
        raise ValueError(f"p and q must have the same size, got {p_t.numel()} and {q_t.numel()}")
    kept = torch.minimum(p_t, q_t)
    rejection = 1.0 - kept.sum()
    return kept + rejection * rule(p_t, q_t)


def total_variation(a, b) -> float:
    """Total-variation distance, 1/2·sum|a - b| (the largest difference in probability of any event)."""
    return 0.5 * float((torch.as_tensor(a, dtype=torch.float64) - torch.as_tensor(b, dtype=torch.float64)).abs().sum())


@dataclass(frozen=True)
class MonteCarloAudit:
    """Frequencies of each rule over shared proposals and accept decisions."""

    trials: int
    seed: int
    frequencies: dict[str, torch.Tensor]
    standard_error: torch.Tensor
    """sqrt(p(1-p)/n) per symbol: the marginal standard error of a frequency around p."""


def monte_carlo_audit(p, q, trials: int = 200_000, seed: int = SEED_MONTE_CARLO) -> MonteCarloAudit:
    """Simulate every rule in :data:`RULES` on the same proposals and accept draws.

    Both rules see identical proposals x ~ q and identical accept decisions u < min(1, p(x)/q(x)); only
    the draw after a rejection differs. The counts are therefore paired, not independent.
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    p_t, q_t = _as_distribution(p, "p"), _as_distribution(q, "q")
    generator = torch.Generator().manual_seed(seed)
    proposals = torch.multinomial(q_t, trials, replacement=True, generator=generator)
    accept_prob = acceptance_probabilities(p_t.expand(trials, -1), q_t.expand(trials, -1), proposals)
    accepted = torch.rand(trials, generator=generator, dtype=torch.float64) < accept_prob
    frequencies = {}
    for name, rule in RULES.items():
        replacements = torch.multinomial(rule(p_t, q_t), trials, replacement=True, generator=generator)
        emitted = torch.where(accepted, proposals, replacements)
        frequencies[name] = torch.bincount(emitted, minlength=p_t.numel()).double() / trials
    return MonteCarloAudit(trials, seed, frequencies, (p_t * (1 - p_t) / trials).sqrt())
