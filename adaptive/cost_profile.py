"""Seconds of a draft step and of a verification, read from a measured cost profile (``adaptive profile``).

The replay environment times its cycles with this: acceptances come from traces, time from the profile.
Between measured context lengths the times are interpolated linearly; beyond them the nearest is used.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

from adaptive.profiling import load_profile


@dataclass(frozen=True)
class CostProfile:
    """Measured step times of a model pair as functions of context length and tokens verified."""

    contexts: tuple[int, ...]
    draft_ms: tuple[float, ...]
    """Median draft step time per context."""
    verify_ms: tuple[tuple[float, ...], ...]
    """verify_ms[i][n - 1]: median target forward time of n tokens at contexts[i]."""
    c: float
    g: tuple[float, ...]
    """g[γ]: verification cost of γ drafted tokens (γ + 1 forwarded) relative to one target step."""
    target_step_ms: float
    hardware: dict

    @classmethod
    def from_dict(cls, profile: dict) -> CostProfile:
        contexts = tuple(sorted(int(c) for c in profile["contexts"]))
        verify = tuple(
            tuple(profile["verify"][str(c)][str(n)]["median_ms"] for n in range(1, len(profile["verify"][str(c)]) + 1)) for c in contexts
        )
        g = tuple(profile["g"][str(gamma)] for gamma in range(len(profile["g"])))
        return cls(
            contexts=contexts,
            draft_ms=tuple(profile["draft_step"][str(c)]["median_ms"] for c in contexts),
            verify_ms=verify,
            c=float(profile["c"]),
            g=g,
            target_step_ms=float(profile["target_step_ms"]),
            hardware=dict(profile["hardware"]),
        )

    @classmethod
    def load(cls, path: str | Path) -> CostProfile:
        """Read a profile JSON written by ``adaptive profile``."""
        return cls.from_dict(load_profile(path))

    @property
    def max_verify(self) -> int:
        """Largest number of drafted tokens the profile can time in one verification."""
        return len(self.verify_ms[0]) - 1

    def _interpolate(self, values: list[float] | tuple[float, ...], context: int) -> float:
        contexts = self.contexts
        if context <= contexts[0]:
            return values[0]
        if context >= contexts[-1]:
            return values[-1]
        i = bisect_left(contexts, context)
        share = (context - contexts[i - 1]) / (contexts[i] - contexts[i - 1])
        return values[i - 1] + share * (values[i] - values[i - 1])

    def draft_seconds(self, context: int) -> float:
        """One draft step at this context length."""
        return self._interpolate(self.draft_ms, context) / 1e3

    def verify_seconds(self, context: int, drafted: int) -> float:
        """One target forward verifying ``drafted`` tokens (``drafted + 1`` fed) at this context length."""
        if not 0 <= drafted <= self.max_verify:
            raise ValueError(f"the profile times verifications of 0..{self.max_verify} drafted tokens, not {drafted}")
        return self._interpolate([row[drafted] for row in self.verify_ms], context) / 1e3
