"""The oracle: drafts exactly the tokens the target will accept (replay only; it reads the trace's m(t)).

With at least one drafted token per round (the decoder's contract, shared by every policy in this action
space), its throughput is the upper bound on chain drafting for the recorded pair and the profiled hardware.
"""

from __future__ import annotations

from typing import Protocol

from adaptive.policy import RULE_DECISION_SECONDS, BasePolicy, DraftState


class KnowsMatchLength(Protocol):
    match_length: int
    """How many of the draft's next tokens the target accepts at the current position."""


class OraclePolicy(BasePolicy):
    """Continue while the depth is below max(1, m(t)); verify everything drafted."""

    name = "oracle"
    reads_step_features = False
    decision_seconds = RULE_DECISION_SECONDS

    def __init__(self, backend: KnowsMatchLength) -> None:
        self.backend = backend

    def should_continue(self, state: DraftState) -> bool:
        return state.depth < self.backend.match_length


class PricedRound(Protocol):
    emitted: int
    draft_seconds: float
    verify_seconds: float


class KnowsRounds(Protocol):
    sources: tuple[str, ...]
    cap: int

    def lookahead(self, source: str, depth: int) -> PricedRound:
        """The round drafting ``depth`` tokens with ``source`` would give here, without moving on."""


class SourceOracle(BasePolicy):
    """With a copy drafter beside the model (replay only): per round, the source and depth whose round alone
    emits the most tokens per modelled second, every (source, depth) tried by lookahead (ties: the shallower,
    then the earlier source). Myopic — a reference for policies that choose both, not a proven bound."""

    name = "oracle (source and depth)"
    reads_step_features = False
    decision_seconds = RULE_DECISION_SECONDS

    def __init__(self, backend: KnowsRounds) -> None:
        self.backend = backend
        self._depth = 1

    def source(self, state: DraftState) -> str:
        backend = self.backend
        options = [(source, depth) for source in backend.sources for depth in range(1, backend.cap + 1)]
        if not options:
            return "model"
        rates = [_rate(backend.lookahead(source, depth)) for source, depth in options]
        best = max(range(len(options)), key=lambda i: (rates[i], -options[i][1], -i))
        source, self._depth = options[best]
        return source

    def should_continue(self, state: DraftState) -> bool:
        return state.depth < self._depth


class KnowsTreeRounds(Protocol):
    cap: int
    context_length: int

    def tree_lookahead(self, depth: int) -> tuple[int, PricedRound]:
        """The fewest verified nodes with which a tree grown ``depth`` levels here accepts the most it can, and that round."""


class TreeOracle(BasePolicy):
    """Draft trees (replay only): per round, the depth whose tree, verifying the fewest nodes that accept all its
    on-path levels, emits the most tokens per modelled second (ties: the shallower). Myopic, like
    :class:`SourceOracle`: a reference for tree policies that choose depth and V, not a proven bound."""

    name = "oracle (tree depth and V)"
    reads_step_features = False
    decision_seconds = RULE_DECISION_SECONDS
    sizes_trees = True

    def __init__(self, backend: KnowsTreeRounds) -> None:
        self.backend = backend
        self._planned_at: int | None = None
        self._depth = self._size = 1

    def reset(self) -> None:
        self._planned_at = None

    def _plan(self) -> None:
        backend = self.backend
        if self._planned_at == backend.context_length:
            return
        options = [(depth, *backend.tree_lookahead(depth)) for depth in range(1, backend.cap + 1)]
        self._depth, self._size, _ = max(options, key=lambda option: (_rate(option[2]), -option[0]))
        self._planned_at = backend.context_length

    def should_continue(self, state: DraftState) -> bool:
        self._plan()
        return state.depth < self._depth

    def verify_size(self, state: DraftState) -> int:
        self._plan()
        return self._size


def _rate(cycle: PricedRound) -> float:
    return cycle.emitted / (cycle.draft_seconds + cycle.verify_seconds)
