"""The cost model of speculative decoding and its analytic optimum.

With i.i.d. acceptance probability α, a round that drafts γ tokens emits on average
E(α, γ) = (1 - α^{γ+1}) / (1 - α) tokens (γ + 1 when α = 1). If a plain target step costs T, one draft
step costs c·T and verifying the block costs g(γ)·T, the speedup over plain decoding is
S = E / (g(γ) + c·γ). The generalised E from an empirical distribution of match lengths L (how many
drafted tokens in a row the target would accept) is E(γ) = 1 + Σ_{i=1..γ} P(L ≥ i), which keeps the
dependence between positions that the α^i approximation throws away.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

GCurve = float | Mapping[int, float]
"""Verification cost in units of one plain target step: a constant, or a measured value per γ."""


@dataclass(frozen=True)
class OperatingPoint:
    """One static depth evaluated by the cost model."""

    gamma: int
    expected_tokens: float
    cost: float
    """g(γ) + c·γ, in units of one plain target step."""
    speedup: float


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(α, γ) = (1 - α^{γ+1}) / (1 - α): mean tokens emitted by a round of depth γ (γ + 1 at α = 1)."""
    _check_alpha(alpha)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma!r}")
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def expected_tokens_from_lengths(lengths: Sequence[int], gamma: int) -> float:
    """E(γ) = 1 + Σ_{i=1..γ} P(L ≥ i), from observed match lengths L.

    Args:
        lengths: match lengths, each observed with a draft at least γ deep (so none is cut below γ).
        gamma: the depth to evaluate.
    """
    if len(lengths) == 0:
        raise ValueError("lengths is empty: need at least one observed match length")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma!r}")
    n = len(lengths)
    return 1.0 + sum(sum(1 for length in lengths if length >= i) / n for i in range(1, gamma + 1))


def verification_cost(g: GCurve, gamma: int) -> float:
    """g(γ) from a constant or a measured per-γ profile."""
    if isinstance(g, Mapping):
        if gamma not in g:
            raise ValueError(f"the g profile has no value for gamma={gamma}; it covers {sorted(g)}")
        value = float(g[gamma])
    else:
        value = float(g)
    if not value > 0:
        raise ValueError(f"g({gamma}) must be > 0, got {value!r}")
    return value


def round_cost(c: float, g: GCurve, gamma: int) -> float:
    """g(γ) + c·γ: the time of one round of depth γ, in units of one plain target step."""
    if c < 0:
        raise ValueError(f"c (draft step cost / target step cost) must be >= 0, got {c!r}")
    return verification_cost(g, gamma) + c * gamma


def sweep(expected: Callable[[int], float], c: float, g: GCurve = 1.0, max_gamma: int = 16) -> list[OperatingPoint]:
    """Evaluate γ = 1..max_gamma with the given E(γ)."""
    if max_gamma < 1:
        raise ValueError(f"max_gamma must be >= 1, got {max_gamma!r}")
    points = []
    for gamma in range(1, max_gamma + 1):
        e = expected(gamma)
        cost = round_cost(c, g, gamma)
        points.append(OperatingPoint(gamma, e, cost, e / cost))
    return points


def best(points: Sequence[OperatingPoint]) -> OperatingPoint:
    """The point with the highest speedup (the smallest γ among ties)."""
    return max(points, key=lambda point: (point.speedup, -point.gamma))


def throughput_speedup(tokens: float, seconds: float, target_step_seconds: float) -> float:
    """Measured (or replayed) throughput in units of plain decoding: tokens per second × one target step.
    Works elementwise on NumPy arrays too."""
    return tokens / seconds * target_step_seconds


def speedup(alpha: float, gamma: int, c: float, g: GCurve = 1.0) -> float:
    """S = E(α, γ) / (g(γ) + c·γ)."""
    return expected_tokens(alpha, gamma) / round_cost(c, g, gamma)


def optimal_gamma(alpha: float, c: float, g: GCurve = 1.0, max_gamma: int = 16) -> OperatingPoint:
    """The static depth in 1..max_gamma that maximises S under i.i.d. acceptance α.

    Example:
        >>> point = optimal_gamma(0.7, 0.05)
        >>> point.gamma, round(point.expected_tokens, 6), round(point.speedup, 3)
        (6, 3.058819, 2.353)
    """
    _check_alpha(alpha)
    return best(sweep(lambda gamma: expected_tokens(alpha, gamma), c, g, max_gamma))


def optimal_gamma_from_lengths(lengths: Sequence[int], c: float, g: GCurve = 1.0, max_gamma: int = 16) -> OperatingPoint:
    """The static depth that maximises S under the empirical match-length distribution."""
    return best(sweep(lambda gamma: expected_tokens_from_lengths(lengths, gamma), c, g, max_gamma))
