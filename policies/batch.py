"""Batch policies: one draft depth per batched round (:class:`~adaptive.policy.BatchPolicy`)."""

from __future__ import annotations

from adaptive.policy import BatchState


class FixedBatchDepth:
    """Always ``depth`` tokens (0: plain batched decoding), whatever the batch."""

    def __init__(self, depth: int) -> None:
        if depth < 0:
            raise ValueError(f"batch depth must be >= 0, got {depth}")
        self.static_depth = depth
        self.name = f"static:{depth}" if depth else "plain"

    def depth(self, state: BatchState) -> int:
        return min(self.static_depth, state.max_depth)


class BatchSizeSchedule:
    """A depth per batch-size range, like vLLM's ``num_speculative_tokens_per_batch_size``: spec
    ``"1-2=4,3-8=2,9-64=0"`` (ranges inclusive; a batch size no range covers is refused)."""

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
        self.name = f"schedule:{spec}"

    def depth(self, state: BatchState) -> int:
        for low, high, depth in self.ranges:
            if low <= state.batch_size <= high:
                return min(depth, state.max_depth)
        raise ValueError(f"the schedule {self.name!r} has no depth for batch size {state.batch_size}")


def make_batch_policy(spec: str) -> FixedBatchDepth | BatchSizeSchedule:
    """``plain``, ``static:D`` or ``schedule:LOW-HIGH=D,...``."""
    name, _, arg = spec.partition(":")
    if name == "plain" and not arg:
        return FixedBatchDepth(0)
    if name == "static" and arg.isdigit():
        return FixedBatchDepth(int(arg))
    if name == "schedule" and arg:
        return BatchSizeSchedule(arg)
    raise ValueError(f"unknown batch policy {spec!r}; allowed: plain, static:D (D drafted tokens per round), schedule:LOW-HIGH=D,... (a depth per batch size)")
