"""Tree traces: per position, the draft tree the tree decoder would grow, for exact replay (greedy, and in distribution
at T > 0).

Under greedy decoding every tree policy emits the target's greedy output y. At position t (context =
prompt + y[:t]) the tree grown to depth D with shape (k, W) contains, for every smaller depth d, exactly
the tree grown to d (growth only adds deeper nodes). A node is *on path* when its token equals y at its
depth and its parent is on path. Verifying the best V nodes of the tree grown to depth d then accepts the
longest run of on-path nodes, depth 1, 2, … that are all among those V — exactly what
:class:`~adaptive.tree_decoder.TreeDecoder` accepts. Only time comes from a cost profile.

At T > 0 the same holds along an output o sampled from the target (as sampled chain traces hold it): the tree is the
draft's top-k, which does not depend on sampling, and recursive rejection sampling over a node's verified children
accepts a child exactly when its token is the one emitted there (a rejected child's token leaves the residual, and the
residual emits none of the tried children). So the accepted path is the longest on-path run among the verified nodes,
as under greedy decoding, with o for y; since speculative decoding emits o distributed as the target samples it, tree
replay along sampled outputs is exact in distribution for every policy (metadata ``temperature``, ``top_k``, ``top_p``
of the chain traces followed).

Recording grows the trees of all positions of a prompt at once: one teacher-forced draft forward gives
every position's depth-1 children; each further depth is one draft forward over every position's frontier,
each node seeing its own context prefix of the shared cache and its ancestors (a flattened tree mask).

Storage: one compressed ``.npz`` (no pickles); per position ``M = k + (D - 1)·W·k`` node slots in creation
order (depth 0 where the tree has fewer nodes), each with its depth, on-path flag, rank in the verification
order and (format 3) its cumulative draft probability in steps of 1/255, beside each level's summed cumulative
probability (float16): what tree policies observe (:func:`~adaptive.observation.tree_summary`). Tokens are not needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel

from adaptive.drafts import teacher_forced
from adaptive.sampling import STEP_FEATURES
from adaptive.traces import holds_margins, read_trace_file, with_margins, write_npz
from adaptive.tree import DraftTree, TreeShape, grow_level, rank_children

TREE_TRACE_FORMAT = "adaptive-draft/tree-trace/3"
READABLE_TREE_FORMATS = ("adaptive-draft/tree-trace/1", "adaptive-draft/tree-trace/2", TREE_TRACE_FORMAT)
"""Format 1 lacks the best nodes' margins (NaN when read); formats 1 and 2 lack the nodes' probabilities (None when read)."""
PROB_STEPS = 255
"""A node's cumulative probability is kept as round(p * PROB_STEPS) in a byte: within 0.002 of the draft's."""


@dataclass
class TreeTraceSet:
    """Tree traces of many prompts for one pair, tree shape and depth D."""

    prompt_ids: list[str]
    langs: list[str]
    prompt_lengths: np.ndarray
    offsets: np.ndarray
    """[P + 1] start of each prompt's positions in the flat arrays."""
    outputs: np.ndarray
    """[N] y of every prompt, back to back."""
    rank: np.ndarray
    """[N, M] int8 place of each node in the tree's verification order (best cumulative draft
    log-probability first, ties: shallower, then older); all replay needs of the scores."""
    depth: np.ndarray
    """[N, M] int8 node depth (1 = the root's children; 0: no node)."""
    on_path: np.ndarray
    """[N, M] bool: the node continues y."""
    features: np.ndarray
    """[N, D, 4] float16 :data:`STEP_FEATURES` of each depth's best node."""
    node_prob: np.ndarray | None = None
    """[N, M] float32 cumulative draft probability of each node (the product along its path; 0: no node), to 1/255;
    None in formats 1 and 2."""
    level_mass: np.ndarray | None = None
    """[N, D] float32 summed cumulative probability of each level's nodes; None in formats 1 and 2."""
    metadata: dict = field(default_factory=dict)

    @property
    def shape(self) -> TreeShape:
        """k and W as recorded, V the default verification size."""
        return TreeShape(self.metadata["branching"], self.metadata["width"], self.metadata["size"])

    @property
    def max_depth(self) -> int:
        return int(self.features.shape[1])

    @property
    def has_margins(self) -> bool:
        """True for traces recorded with the best nodes' margins (format 2 or later)."""
        return holds_margins(self.features)

    @property
    def has_scores(self) -> bool:
        """True for traces recorded with every node's cumulative probability and each level's (format 3 or later)."""
        return self.node_prob is not None and self.level_mass is not None

    @property
    def temperature(self) -> float:
        """The sampling temperature of the outputs the trees follow (0: greedy)."""
        return float(self.metadata.get("temperature", 0.0))

    @property
    def max_new_tokens(self) -> int:
        return int(self.metadata["max_new_tokens"])

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def save(self, path: str | Path) -> None:
        if not self.has_scores:
            raise ValueError("these tree traces hold no node probabilities (format 1 or 2); record them again to write format 3")
        arrays = {
            "rank": self.rank.astype(np.int8),
            "depth": self.depth.astype(np.int8),
            "on_path": self.on_path,
            "features": self.features.astype(np.float16),
            "node_prob": np.rint(self.node_prob * PROB_STEPS).astype(np.uint8),
            "level_mass": self.level_mass.astype(np.float16),
        }
        write_npz(path, self, arrays, TREE_TRACE_FORMAT)

    @staticmethod
    def read_metadata(path: str | Path) -> dict:
        """The metadata of a tree trace file, without loading its arrays."""
        return read_trace_file(path, READABLE_TREE_FORMATS, ())[1]

    @classmethod
    def load(cls, path: str | Path) -> TreeTraceSet:
        """Read a tree trace file (never unpickles)."""
        common, metadata, data = read_trace_file(path, READABLE_TREE_FORMATS, ("rank", "depth", "on_path", "features"))
        return cls(
            **common,
            rank=data["rank"].astype(np.int64),
            depth=data["depth"].astype(np.int64),
            on_path=data["on_path"],
            features=with_margins(data["features"].astype(np.float32)),
            node_prob=data["node_prob"].astype(np.float32) / PROB_STEPS if "node_prob" in data else None,
            level_mass=data["level_mass"].astype(np.float32) if "level_mass" in data else None,
            metadata=metadata,
        )


def node_slots(shape: TreeShape, depth: int) -> int:
    """M: nodes of a full tree of ``depth`` levels."""
    return shape.branching + (depth - 1) * shape.width * shape.branching


@torch.inference_mode()
def grow_trees(target: PreTrainedModel, draft: nn.Module, prompt: list[int], output: list[int], shape: TreeShape, depth: int) -> list[DraftTree]:
    """The tree the tree decoder grows to ``depth`` at every position of ``output`` (batched over positions;
    the target is read only by a draft that drafts from its hidden states)."""
    p, n = len(prompt), len(output)
    model, logits = teacher_forced(target, draft, prompt + output)
    logits = logits[p - 1 : p - 1 + n]
    trees = [DraftTree() for _ in range(n)]
    ranked = rank_children(logits, shape.branching, model.vocabulary)
    for t, tree in enumerate(trees):
        tree.add_ranked(-1, *(column[t] for column in ranked))
    for _ in range(depth - 1):
        grow_level(model, trees, [p + t for t in range(n)], shape, time.perf_counter)
    return trees


def tree_arrays(trees: list[DraftTree], output: list[int], shape: TreeShape, depth: int) -> dict[str, np.ndarray]:
    """Per-position node arrays and best-node features of grown trees (see :class:`TreeTraceSet`)."""
    n, m = len(trees), node_slots(shape, depth)
    if m > 127:
        raise ValueError(f"a tree of {m} nodes does not fit the int8 ranks of the trace format; use fewer levels or a narrower shape")
    arrays = {
        "rank": np.full((n, m), m, dtype=np.int64),
        "depth": np.zeros((n, m), dtype=np.int64),
        "on_path": np.zeros((n, m), dtype=bool),
        "features": np.zeros((n, depth, len(STEP_FEATURES)), dtype=np.float32),
        "node_prob": np.zeros((n, m), dtype=np.float32),
        "level_mass": np.zeros((n, depth), dtype=np.float32),
    }
    for t, tree in enumerate(trees):
        nodes = tree.nodes
        for place, j in enumerate(sorted(range(len(nodes)), key=lambda j: (-nodes[j].score, nodes[j].depth, j))):
            arrays["rank"][t, j] = place
        for j, node in enumerate(nodes):
            arrays["depth"][t, j] = node.depth
            arrays["node_prob"][t, j] = np.exp(node.score)
            arrays["level_mass"][t, node.depth - 1] += np.exp(node.score)
            position = t + node.depth - 1
            parent_ok = node.parent < 0 or arrays["on_path"][t, node.parent]
            arrays["on_path"][t, j] = parent_ok and position < len(output) and node.token == output[position]
        for d in range(1, tree.depth + 1):
            best = tree.best_at(d)
            arrays["features"][t, d - 1] = (best.top1_prob, best.entropy, best.log_prob, best.margin)
    return arrays


def accepted_in_tree(rank: np.ndarray, depth: np.ndarray, on_path: np.ndarray, drafted: int, size: int) -> int:
    """Tokens accepted when the tree grown to ``drafted`` levels verifies its best ``size`` nodes (the same
    selection as :meth:`DraftTree.select`: the global verification order restricted to those levels)."""
    grown = (depth > 0) & (depth <= drafted)
    chosen = np.zeros(len(rank), dtype=bool)
    candidates = np.flatnonzero(grown)
    chosen[candidates[np.argsort(rank[candidates])[:size]]] = True
    path = np.flatnonzero(on_path & grown)
    path = path[np.argsort(depth[path])]
    accepted = 0
    for j in path:
        if not chosen[j]:
            break
        accepted += 1
    return accepted


def nodes_needed(rank: np.ndarray, depth: np.ndarray, on_path: np.ndarray, max_depth: int) -> np.ndarray:
    """``need[n, d - 1, i - 1]``: the fewest verified nodes with which a tree grown to ``d`` levels accepts
    ``i`` tokens at position ``n`` (a large number where it cannot). Then accepted(d, V) = #{i <= d:
    need[n, d-1, i-1] <= V}: the same as :func:`accepted_in_tree`, vectorised once for fast replay."""
    n, m = rank.shape
    never = np.iinfo(np.int32).max
    need = np.full((n, max_depth, max_depth), never, dtype=np.int64)
    rows = np.arange(n)
    path = np.full((n, max_depth), -1, dtype=np.int64)
    for i in range(1, max_depth + 1):
        hits = on_path & (depth == i)
        path[:, i - 1] = np.where(hits.any(axis=1), hits.argmax(axis=1), -1)
    for d in range(1, max_depth + 1):
        grown = (depth > 0) & (depth <= d)
        order = np.argsort(np.where(grown, rank, m + 1), axis=1, kind="stable")
        place = np.empty_like(order)
        np.put_along_axis(place, order, np.arange(m)[None, :].repeat(n, axis=0), axis=1)
        running = np.zeros(n, dtype=np.int64)
        alive = np.ones(n, dtype=bool)
        for i in range(1, d + 1):
            node = path[:, i - 1]
            alive &= node >= 0
            running = np.maximum(running, np.where(alive, place[rows, np.maximum(node, 0)] + 1, never))
            need[:, d - 1, i - 1] = np.where(alive, running, never)
    return need


def record_trees(
    target: PreTrainedModel,
    draft: nn.Module,
    prompts: list[dict],
    prompt_ids: list[list[int]],
    outputs: list[list[int]],
    shape: TreeShape,
    depth: int,
    metadata: dict,
    progress=None,
) -> TreeTraceSet:
    """Tree traces of ``prompts`` (workload rows with ``id`` and ``lang``) along their greedy ``outputs``
    (e.g. the outputs of the chain traces, which record and check them)."""
    arrays: dict[str, list[np.ndarray]] = {}
    for ids, output in zip(prompt_ids, outputs, strict=True):
        for key, value in tree_arrays(grow_trees(target, draft, ids, output, shape, depth), output, shape, depth).items():
            arrays.setdefault(key, []).append(value)
        if progress is not None:
            progress.update()
    return TreeTraceSet(
        prompt_ids=[p["id"] for p in prompts],
        langs=[p.get("lang", "") for p in prompts],
        prompt_lengths=np.array([len(ids) for ids in prompt_ids]),
        offsets=np.cumsum([0] + [len(y) for y in outputs]),
        outputs=np.concatenate([np.array(y, dtype=np.int32) for y in outputs]),
        **{key: np.concatenate(value) for key, value in arrays.items()},
        metadata={**metadata, "branching": shape.branching, "width": shape.width, "size": shape.size, "depth": depth},
    )
