"""Batch policies: one draft depth per batched round (:class:`~adaptive.policy.BatchPolicy`).

* :class:`FixedBatchDepth` (``static:D``, ``plain``): the same depth at every load.
* :class:`BatchSizeSchedule` (``schedule:1-2=4,3-8=2``): a depth per batch-size range, as vLLM's
  ``num_speculative_tokens_per_batch_size``.
* :class:`CostModelBatch` (``costmodel``): the depth of the highest modelled throughput at this batch size,
  from the batched cost profile and the batch's pooled acceptance.
* :class:`GoodputRule` (``goodput``): SmartSpec's rule — each request's own acceptance estimate, the depth
  maximising the batch's expected tokens per second of the round.
* :class:`SpeculationOff` (``off-above:N:SPEC``): SPEC while at most N requests decode or wait, plain above.
* :class:`CappedBySchedule` (``capped:1-2=4,3-8=2:SPEC``): SPEC's depth, never deeper than the schedule's.

The two wrappers pass a stepped policy's per-step answers on (:class:`~adaptive.policy.SteppedBatchPolicy`), and
are asked after each draft step only when the policy inside is stepped (``stepped``).
"""

from __future__ import annotations

from adaptive.batch_observation import PRIOR_ALPHA, acceptance_estimate
from adaptive.batch_profile import BatchCostProfile
from adaptive.costmodel import expected_tokens
from adaptive.learned_batch_policy import is_batch_policy, load_batch_policy
from adaptive.policy import RULE_DECISION_SECONDS, BatchDraftStep, BatchPolicy, BatchState, asks_each_step, continues


class FixedBatchDepth:
    """Always ``depth`` tokens (0: plain batched decoding), whatever the batch."""

    decision_seconds = RULE_DECISION_SECONDS

    def __init__(self, depth: int) -> None:
        if depth < 0:
            raise ValueError(f"batch depth must be >= 0, got {depth}")
        self.static_depth = depth
        self.name = f"static:{depth}" if depth else "plain"

    def depth(self, state: BatchState) -> int:
        return min(self.static_depth, state.max_depth)


class BatchSizeSchedule:
    """A depth per batch-size range: spec ``"1-2=4,3-8=2,9-64=0"`` (ranges inclusive; a batch size no range
    covers is refused)."""

    decision_seconds = RULE_DECISION_SECONDS

    def __init__(self, spec: str) -> None:
        self.ranges: list[tuple[int, int, int]] = []
        for part in spec.split(","):
            try:
                sizes, depth = part.split("=")
                low, _, high = sizes.partition("-")
                self.ranges.append((int(low), int(high or low), int(depth)))
            except ValueError:
                raise ValueError(f"a batch-size schedule is 'LOW-HIGH=DEPTH,...' (e.g. 1-2=4,3-8=2), got {spec!r}") from None
        if any(low < 1 or high < low or depth < 0 for low, high, depth in self.ranges):
            raise ValueError(f"schedule ranges need 1 <= LOW <= HIGH and DEPTH >= 0, got {spec!r}")
        self.spec, self.name = spec, f"schedule:{spec}"

    def depth(self, state: BatchState) -> int:
        for low, high, depth in self.ranges:
            if low <= state.batch_size <= high:
                return min(depth, state.max_depth)
        raise ValueError(f"the schedule {self.name!r} has no depth for batch size {state.batch_size}")


def _probe(state: BatchState, depth: int) -> int:
    """``depth``, or one drafted token where it is 0 and no request drafted in its recent rounds: without a
    drafted round acceptance is only the prior, and a rule that settles on plain there would never learn it."""
    if depth == 0 and state.max_depth > 0 and not any(any(rounds) for rounds in state.recent_drafted):
        return 1
    return depth


class CostModelBatch:
    """argmax over γ of B · E(α̂, γ) / (γ · draft(B) + target(B, γ + 1)), α̂ pooled over the batch's recent rounds
    (one token drafted to measure α̂ when no recent round drafted and the prior says plain)."""

    name = "costmodel"
    decision_seconds = RULE_DECISION_SECONDS

    def __init__(self, profile: BatchCostProfile) -> None:
        self.profile = profile

    def depth(self, state: BatchState) -> int:
        accepted = tuple(a for rounds in state.recent_accepted for a in rounds)
        drafted = tuple(d for rounds in state.recent_drafted for d in rounds)
        return _probe(state, self.profile.best_depth(state.batch_size, acceptance_estimate(accepted, drafted), state.max_depth))


class GoodputRule:
    """SmartSpec's rule: argmax over γ of Σ_requests E(α̂_r, γ) / (γ · draft(B) + target(B, γ + 1)), each
    request's α̂_r from its own recent rounds (arXiv 2406.14066); probes as :class:`CostModelBatch` does."""

    name = "goodput"
    decision_seconds = RULE_DECISION_SECONDS

    def __init__(self, profile: BatchCostProfile) -> None:
        self.profile = profile

    def depth(self, state: BatchState) -> int:
        alphas = [acceptance_estimate(a, d) for a, d in zip(state.recent_accepted, state.recent_drafted)] or [PRIOR_ALPHA]
        deepest = min(state.max_depth, self.profile.max_depth)

        def goodput(depth: int) -> float:
            return sum(expected_tokens(alpha, depth) for alpha in alphas) / self.profile.round_ms(state.batch_size, depth)

        return _probe(state, max(range(deepest + 1), key=lambda depth: (goodput(depth), -depth)))


class SpeculationOff:
    """``inner``'s depth while at most ``limit`` requests decode or wait; plain batched decoding above."""

    def __init__(self, limit: int, inner: BatchPolicy) -> None:
        if limit < 1:
            raise ValueError(f"the load limit must be >= 1 request, got {limit}")
        self.limit, self.inner = limit, inner
        self.name = f"off-above:{limit}:{inner.name}"

    def depth(self, state: BatchState) -> int:
        return 0 if state.batch_size + state.waiting > self.limit else self.inner.depth(state)

    @property
    def stepped(self) -> bool:
        return asks_each_step(self.inner)

    @property
    def decision_seconds(self) -> float | None:
        return getattr(self.inner, "decision_seconds", None)

    def should_continue(self, state: BatchState, step: BatchDraftStep) -> bool:
        return continues(self.inner, state, step)


class CappedBySchedule:
    """``inner``'s depth, never deeper than ``cap``'s at the batch size: a learned policy kept within the
    per-batch-size schedule, so that its rounds (and the gaps between a request's tokens) are no longer than
    the schedule's, while it may still draft less where acceptance is low."""

    def __init__(self, cap: BatchSizeSchedule, inner: BatchPolicy) -> None:
        self.cap, self.inner = cap, inner
        self.name = f"capped:{cap.spec}:{inner.name}"

    def depth(self, state: BatchState) -> int:
        return min(self.inner.depth(state), self.cap.depth(state))

    @property
    def stepped(self) -> bool:
        return asks_each_step(self.inner)

    @property
    def decision_seconds(self) -> float | None:
        return getattr(self.inner, "decision_seconds", None)

    def should_continue(self, state: BatchState, step: BatchDraftStep) -> bool:
        return continues(self.inner, state, step)


BATCH_POLICY_HELP = (
    "plain; static:D (D drafted tokens per round); schedule:LOW-HIGH=D,... (a depth per batch size); "
    "costmodel and goodput (need a batched cost profile); off-above:N:SPEC (SPEC up to N requests, plain above); "
    "capped:LOW-HIGH=D,...:SPEC (SPEC, never deeper than the schedule); "
    "or the folder of a learned batch policy (adaptive train-batch)"
)


def make_batch_policy(spec: str, profile: BatchCostProfile | None = None) -> BatchPolicy:
    """A batch policy from its spec string (see :data:`BATCH_POLICY_HELP`), or a learned one from its folder."""
    if is_batch_policy(spec):
        policy = load_batch_policy(spec)
        cap = policy.metadata.get("cap")  # trained inside a schedule (train-batch --cap-at-schedule): kept inside it
        return CappedBySchedule(BatchSizeSchedule(cap), policy) if cap else policy
    name, _, arg = spec.partition(":")
    if name == "plain" and not arg:
        return FixedBatchDepth(0)
    if name == "static" and arg.isdigit():
        return FixedBatchDepth(int(arg))
    if name == "schedule" and arg:
        return BatchSizeSchedule(arg)
    if name in ("costmodel", "goodput") and not arg:
        if profile is None:
            raise ValueError(f"batch policy {spec!r} needs a batched cost profile (adaptive profile --batches)")
        return CostModelBatch(profile) if name == "costmodel" else GoodputRule(profile)
    if name == "off-above":
        limit, _, inner = arg.partition(":")
        if limit.isdigit() and inner:
            return SpeculationOff(int(limit), make_batch_policy(inner, profile))
    if name == "capped":
        schedule, _, inner = arg.partition(":")
        if schedule and inner:
            return CappedBySchedule(BatchSizeSchedule(schedule), make_batch_policy(inner, profile))
    raise ValueError(f"unknown batch policy {spec!r}; allowed: {BATCH_POLICY_HELP}")
