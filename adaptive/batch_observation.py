"""What a learned batch policy sees as a batched round starts: a fixed-size float32 vector with a versioned
schema of its own (the per-request observation, :mod:`adaptive.observation`, is unchanged: its policies keep
loading).

Fields (version 1), all known when the round starts:

* ``batch``: requests decoding / 16; ``waiting``: requests queued / 16
* ``alpha_pooled``: per-token acceptance estimated over every request's recent rounds (:func:`acceptance_estimate`)
* ``alpha_mean``, ``alpha_min``, ``alpha_max``: over the requests' own estimates
* ``new``: share of requests without a round yet (their estimate is the prior)
* ``cost_{d}`` for d = 1..max_depth: a round drafting d tokens per request over a plain batched step at this
  batch size, from the batched cost profile (:class:`~adaptive.batch_profile.BatchCostProfile`)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from adaptive.batch_profile import BatchCostProfile
from adaptive.policy import BatchState

NAME = "adaptive-draft/batch-observation"
VERSION = 1
SCALE = 16.0
PRIOR_ALPHA, PRIOR_WEIGHT = 0.5, 2.0
"""Acceptance assumed before a request's first rounds, and how many rounds' worth it counts."""


def acceptance_estimate(accepted: tuple[int, ...], drafted: tuple[int, ...]) -> float:
    """Per-token acceptance α from rounds' accepted lengths and depths: accepted tokens over accepted tokens
    plus rejections (the maximum-likelihood estimate of a geometric run cut at the depth), with a prior."""
    rejections = sum(a < d for a, d in zip(accepted, drafted))
    tokens = sum(accepted)
    return (tokens + PRIOR_ALPHA * PRIOR_WEIGHT) / (tokens + rejections + PRIOR_WEIGHT)


@dataclass(frozen=True)
class BatchObservationSchema:
    """Layout of the batch observation for a given maximum depth."""

    max_depth: int

    @property
    def names(self) -> list[str]:
        return ["batch", "waiting", "alpha_pooled", "alpha_mean", "alpha_min", "alpha_max", "new", *(f"cost_{d}" for d in range(1, self.max_depth + 1))]

    @property
    def size(self) -> int:
        return 7 + self.max_depth

    def describe(self) -> dict:
        return {"name": NAME, "version": VERSION, "max_depth": self.max_depth, "size": self.size, "fields": self.names}

    def check(self, described: dict) -> None:
        """Refuse a policy trained on another layout, naming the difference."""
        for key, mine in self.describe().items():
            if described.get(key) != mine:
                raise ValueError(f"batch observation mismatch on {key!r}: the policy was trained with {described.get(key)!r}, this is {mine!r}")

    def observe(self, state: BatchState, profile: BatchCostProfile) -> np.ndarray:
        """The vector for ``state``, the costs read from ``profile`` at its batch size."""
        per_request = [acceptance_estimate(a, d) for a, d in zip(state.recent_accepted, state.recent_drafted)] or [PRIOR_ALPHA]
        pooled = acceptance_estimate(tuple(a for rounds in state.recent_accepted for a in rounds), tuple(d for rounds in state.recent_drafted for d in rounds))
        plain = profile.round_ms(state.batch_size, 0)
        deepest = min(self.max_depth, profile.max_depth)
        costs = [profile.round_ms(state.batch_size, d) / plain for d in range(1, deepest + 1)]
        costs += [costs[-1]] * (self.max_depth - deepest)
        fresh = sum(not rounds for rounds in state.recent_accepted) / max(1, len(state.recent_accepted))
        head = [state.batch_size / SCALE, state.waiting / SCALE, pooled, float(np.mean(per_request)), min(per_request), max(per_request), fresh]
        return np.asarray(head + costs, dtype=np.float32)
