"""Tree replay backend: exact greedy acceptances of draft trees from tree traces, time from a cost profile.

A round at position t grows the recorded tree level by level (``draft`` returns each level's best node's
features, as the tree decoder shows its depth policy), then verifies the best ``size`` nodes of the levels
grown: it accepts the on-path nodes all of whose ancestors were selected, exactly as
:class:`~adaptive.tree_decoder.TreeDecoder` does (see :mod:`adaptive.tree_traces`). Time: one draft step
per level (a level's W nodes go through the draft in one forward; the profile's one-token step is used)
plus one target forward of ``size`` nodes, both from the profile at the round's context length (profile
it with ``adaptive profile --tree-mask --max-verify 64``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from adaptive.cost_profile import CostProfile
from adaptive.tree_traces import TreeTraceSet, nodes_needed
from envs.backend import Backend, Cycle


class TreeReplayBackend(Backend):
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
            raise ValueError(f"size must lie in 1..{profile.max_verify} (the profile's largest verification), got {size}")
        self.traces, self.profile = traces, profile
        self.c, self.g = profile.c, profile.g
        self.target_step_seconds = profile.target_step_ms / 1e3
        self.num_prompts = len(traces)
        self._budget = traces.max_new_tokens
        self._features = traces.features.tolist()
        self._need = nodes_needed(traces.rank, traces.depth, traces.on_path, traces.max_depth).tolist()
        self._nodes_by_depth = np.stack([(traces.depth >= 1) & (traces.depth <= d) for d in range(1, traces.max_depth + 1)], axis=1).sum(axis=2)
        self.prompt = self._start = self._length = self._t = self._depth = self._prompt_length = 0
        self._recent: list[int] = []

    def start_prompt(self, index: int, rng: np.random.Generator | None = None) -> None:
        """Begin replaying prompt ``index`` (greedy: nothing random)."""
        self.prompt = index
        self._start = int(self.traces.offsets[index])
        self._length = int(self.traces.offsets[index + 1]) - self._start
        self._prompt_length = int(self.traces.prompt_lengths[index])
        self._t = self._depth = 0
        self._recent = []

    @property
    def done(self) -> bool:
        return self._t >= self._length

    @property
    def context_length(self) -> int:
        return self._prompt_length + self._t

    @property
    def cap(self) -> int:
        return min(self.max_depth, self._budget - self._t - 1)

    @property
    def recent(self) -> Sequence[int]:
        return self._recent

    @property
    def max_size(self) -> int:
        return self._max_size

    def verifiable(self, depth: int) -> int:
        """Nodes of the levels grown so far (at most ``max_size``)."""
        return min(self._max_size, int(self._nodes_by_depth[self._start + self._t, depth - 1])) if depth else 0

    def default_size(self, depth: int) -> int:
        return min(self.size, self.verifiable(depth))

    def draft(self) -> tuple[float, float, float]:
        if self._depth >= self.cap:
            raise ValueError(f"this round's tree is already {self._depth} levels deep, its cap")
        top1, entropy, log_prob = self._features[self._start + self._t][self._depth]
        self._depth += 1
        return top1, entropy, log_prob

    def verify(self, size: int) -> Cycle:
        depth, row = self._depth, self._start + self._t
        if not 0 <= size <= self.verifiable(depth) or (depth and size < 1):
            raise ValueError(f"cannot verify {size} nodes of a tree with {self.verifiable(depth)} nodes in {depth} levels")
        accepted = sum(1 for need in self._need[row][depth - 1][:depth] if need <= size) if depth else 0
        emitted = min(accepted + 1, self._length - self._t)
        context = self._prompt_length + self._t
        cycle = Cycle(depth, size, accepted, emitted, depth * self.profile.draft_seconds(context), self.profile.verify_seconds(context, size))
        self._t += emitted
        self._depth = 0
        self._recent.append(accepted)
        return cycle
