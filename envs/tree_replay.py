"""Tree replay backend: exact acceptances of draft trees from tree traces (greedy, or in distribution along sampled
outputs: :mod:`adaptive.tree_traces`), time from a cost profile.

A round at position t grows the recorded tree level by level (``draft`` returns each level's best node's
features, as the tree decoder shows its depth policy), then verifies the best ``size`` nodes of the levels
grown: it accepts the on-path nodes all of whose ancestors were selected, exactly as
:class:`~adaptive.tree_decoder.TreeDecoder` does (see :mod:`adaptive.tree_traces`). Time, from the profile at
the round's context length (profile it with ``adaptive profile --tree-mask --max-verify 64``): the first
level's draft step, one masked draft forward over W nodes per later level, one target forward of ``size``
nodes, and the tree decoder's own work per level and per verified node
(:meth:`~adaptive.profile.CostProfile.round_drafting_seconds`, :meth:`~adaptive.profile.CostProfile.round_verifying_seconds`).
"""

from __future__ import annotations

import numpy as np

from adaptive.observation import TREE_RANKS
from adaptive.policy import verifiable
from adaptive.profile import CostProfile
from adaptive.tree_traces import TreeTraceSet, nodes_needed
from envs.backend import Cycle
from envs.replay import TraceReplay


class TreeReplayBackend(TraceReplay):
    """Replays :class:`TreeTraceSet` generations; ``size`` is the default verified nodes V."""

    tree = True

    def __init__(self, traces: TreeTraceSet, profile: CostProfile, max_depth: int | None = None, size: int | None = None) -> None:
        if len(traces) == 0:
            raise ValueError("the tree trace set is empty")
        self.max_depth = traces.max_depth if max_depth is None else max_depth
        if not 1 <= self.max_depth <= traces.max_depth:
            raise ValueError(f"max_depth must lie in 1..{traces.max_depth} (the traces' depth), got {max_depth}")
        self._max_size = min(traces.rank.shape[1], profile.max_verify)
        self.size = traces.metadata["size"] if size is None else size
        if not 1 <= self.size <= profile.max_verify:
            raise ValueError(f"size must lie in 1..{profile.max_verify} (the profile's largest verification), got {self.size}")
        self._setup(traces, profile)
        self._need = nodes_needed(traces.rank, traces.depth, traces.on_path, traces.max_depth).tolist()
        grown = [(traces.depth >= 1) & (traces.depth <= d) for d in range(1, traces.max_depth + 1)]
        self._nodes_by_depth = np.stack(grown, axis=1).sum(axis=2)
        self.shows_tree_scores = traces.has_scores

    def tree_view(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        if not self.shows_tree_scores:
            raise ValueError("these tree traces hold no node probabilities (recorded before tree trace format 3): re-record them with adaptive record --tree")
        position, traces = self._start + self._t, self.traces
        depths = traces.depth[position]
        ranked = np.sort(traces.node_prob[position][(depths >= 1) & (depths <= self._depth)])[::-1][:TREE_RANKS]
        return tuple(ranked.tolist()), tuple(traces.level_mass[position][: self._depth].tolist())

    @property
    def max_size(self) -> int:
        return self._max_size

    def verifiable(self, depth: int) -> int:
        """Nodes of the levels grown so far (at most ``max_size``)."""
        return min(self._max_size, int(self._nodes_by_depth[self._start + self._t, depth - 1])) if depth else 0

    def default_size(self, depth: int) -> int:
        return min(self.size, self.verifiable(depth))

    def tree_lookahead(self, depth: int) -> tuple[int, Cycle]:
        """The fewest nodes with which the tree grown ``depth`` levels here accepts the most it can (its on-path
        levels among the nodes a round may verify), and that round's outcome and price; nothing moves on."""
        need = [n for n in self._need[self._start + self._t][depth - 1][:depth] if n <= self.verifiable(depth)]
        size = max(need, default=1)
        accepted = sum(1 for n in need if n <= size)
        context = self._prompt_length + self._t
        last_emitted = self._recent[-1] + 1 if self._recent else None
        cycle = Cycle(
            drafted=depth,
            verified=size,
            accepted=accepted,
            emitted=min(accepted + 1, self._length - self._t),
            draft_seconds=self.profile.round_drafting_seconds(context, depth, last_emitted, True),
            verify_seconds=self.profile.round_verifying_seconds(context, size, True),
        )
        return size, cycle

    def verify(self, size: int) -> Cycle:
        depth = self._depth
        if not verifiable(size, self.verifiable(depth)):
            raise ValueError(f"cannot verify {size} nodes of a tree with {self.verifiable(depth)} nodes in {depth} levels")
        accepted = sum(1 for need in self._need[self._start + self._t][depth - 1][:depth] if need <= size) if depth else 0
        return self._end_round(size, accepted)
