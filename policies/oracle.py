"""The oracle: drafts exactly the tokens the target will accept (replay only; it reads the trace's m(t)).

With at least one drafted token per round (the decoder's contract, shared by every policy in this action
space), its throughput is the upper bound on chain drafting for the recorded pair and the profiled hardware.
"""

from __future__ import annotations

from typing import Protocol

from adaptive.policy import BasePolicy, DraftState


class KnowsMatchLength(Protocol):
    match_length: int
    """How many of the draft's next tokens the target accepts at the current position."""


class OraclePolicy(BasePolicy):
    """Continue while the depth is below max(1, m(t)); verify everything drafted."""

    name = "oracle"
    reads_step_features = False

    def __init__(self, backend: KnowsMatchLength) -> None:
        self.backend = backend

    def should_continue(self, state: DraftState) -> bool:
        return state.depth < self.backend.match_length
