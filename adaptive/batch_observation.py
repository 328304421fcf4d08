"""What a learned batch policy sees: a fixed-size float32 vector with a versioned schema of its own (the
per-request observation, :mod:`adaptive.observation`, is unchanged: its policies keep loading).

Version 1 (a policy that picks each round's depth as the round starts), all known then:

* ``batch``: requests decoding / 16; ``waiting``: requests queued / 16
* ``alpha_pooled``: per-token acceptance estimated over every request's recent rounds (:func:`acceptance_estimate`)
* ``alpha_mean``, ``alpha_min``, ``alpha_max``: over the requests' own estimates
* ``new``: share of requests without a round yet (their estimate is the prior)
* ``cost_{d}`` for d = 1..max_depth: a round drafting d tokens per request over a plain batched step at this
  batch size, from the batched cost profile (:class:`~adaptive.batch_profile.BatchCostProfile`)

Version 2 (a policy asked before each draft step whether the batch drafts another token,
:class:`~adaptive.policy.SteppedBatchPolicy`): version 1's fields, then what the round's draft has shown so far

* ``drafted``: tokens drafted this round / max_depth (0 before the first step)
* ``reach_mean``, ``reach_min``, ``reach_max``: over the drafting requests, the product of the draft's top-1
  probabilities of this round's steps — how likely, by the draft's own account, the request still accepts
  everything drafted (1 before the first step)
* ``top1_last``: the drafting requests' mean top-1 probability at the latest step (1 before the first)
* ``cost_next``: a round one token deeper over a round at the current depth, at this batch size

Version 1 policies keep loading and keep seeing version 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from adaptive.batch_profile import BatchCostProfile
from adaptive.policy import BatchDraftStep, BatchState

NAME = "adaptive-draft/batch-observation"
VERSION = 2
VERSIONS = (1, 2)
STEP_FIELDS = ("drafted", "reach_mean", "reach_min", "reach_max", "top1_last", "cost_next")
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
    """Layout of the batch observation for a given maximum depth and version (1: per round, 2: per step)."""

    max_depth: int
    version: int = 1

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise ValueError(f"batch observation version must be one of {VERSIONS}, got {self.version}")

    @property
    def stepwise(self) -> bool:
        """Whether the observation shows the round's draft steps (version 2)."""
        return self.version >= 2

    @property
    def names(self) -> list[str]:
        head = ["batch", "waiting", "alpha_pooled", "alpha_mean", "alpha_min", "alpha_max", "new", *(f"cost_{d}" for d in range(1, self.max_depth + 1))]
        return head + list(STEP_FIELDS) if self.stepwise else head

    @property
    def size(self) -> int:
        return len(self.names)

    def describe(self) -> dict:
        return {"name": NAME, "version": self.version, "max_depth": self.max_depth, "size": self.size, "fields": self.names}

    @classmethod
    def described(cls, described: dict) -> BatchObservationSchema:
        """The schema a saved policy names (its ``schema`` entry), refused when this code cannot build it."""
        if described.get("name") != NAME or described.get("version") not in VERSIONS:
            raise ValueError(
                f"unknown batch observation {described.get('name')!r} version {described.get('version')!r}; this code reads {NAME} versions {VERSIONS}"
            )
        schema = cls(int(described["max_depth"]), int(described["version"]))
        schema.check(described)
        return schema

    def check(self, described: dict) -> None:
        """Refuse a policy trained on another layout, naming the difference."""
        for key, mine in self.describe().items():
            if described.get(key) != mine:
                raise ValueError(f"batch observation mismatch on {key!r}: the policy was trained with {described.get(key)!r}, this is {mine!r}")

    def observe(self, state: BatchState, profile: BatchCostProfile, step: BatchDraftStep | None = None) -> np.ndarray:
        """The vector for ``state``, the costs read from ``profile`` at its batch size; version 2 also shows
        ``step``, the round's draft so far (None: before its first step)."""
        return self.with_step(self.head(state, profile), step)

    def head(self, state: BatchState, profile: BatchCostProfile) -> RoundHead:
        """What the observation shows of ``state`` before the round's first step (version 1's fields, and for
        version 2 each step's ``cost_next``): computed once per round, then shown with each step."""
        per_request = [acceptance_estimate(a, d) for a, d in zip(state.recent_accepted, state.recent_drafted)] or [PRIOR_ALPHA]
        pooled = acceptance_estimate(tuple(a for rounds in state.recent_accepted for a in rounds), tuple(d for rounds in state.recent_drafted for d in rounds))
        round_ms = [profile.round_ms(state.batch_size, d) for d in range(min(self.max_depth, profile.max_depth) + 1)]
        round_ms += [round_ms[-1]] * (self.max_depth + 1 - len(round_ms))
        costs = [ms / round_ms[0] for ms in round_ms[1:]]
        fresh = sum(not rounds for rounds in state.recent_accepted) / max(1, len(state.recent_accepted))
        fields = [state.batch_size / SCALE, state.waiting / SCALE, pooled, sum(per_request) / len(per_request), min(per_request), max(per_request), fresh]
        last = profile.max_depth
        steps = range(self.max_depth) if self.stepwise else range(0)
        cost_next = [profile.round_ms(state.batch_size, min(d + 1, last)) / profile.round_ms(state.batch_size, min(d, last - 1)) for d in steps]
        return RoundHead(fields + costs, cost_next)

    def with_step(self, head: RoundHead, step: BatchDraftStep | None) -> np.ndarray:
        """The observation: ``head`` and, for version 2, ``step``'s fields (plain Python: this runs after every
        draft step, where a few NumPy calls on cold caches would cost more than the decision)."""
        if not self.stepwise:
            return np.asarray(head.fields, dtype=np.float32)
        drafted = 0 if step is None else step.drafted
        shown = [] if step is None else [top1 for top1 in step.top1 if top1]
        reach = [math.prod(top1) for top1 in shown] or [1.0]
        last = sum(top1[-1] for top1 in shown) / len(shown) if shown else 1.0
        cost_next = head.cost_next[min(drafted, self.max_depth - 1)]
        step_fields = [drafted / self.max_depth, sum(reach) / len(reach), min(reach), max(reach), last, cost_next]
        return np.asarray(head.fields + step_fields, dtype=np.float32)


@dataclass(frozen=True)
class RoundHead:
    """:meth:`BatchObservationSchema.head`: the round's fields, and per number of tokens drafted so far the
    cost of drafting one more (version 2's ``cost_next``)."""

    fields: list[float]
    cost_next: list[float]
