"""Draft trees (EAGLE-2 style) for speculative decoding: grow, select, mask, accept (greedy and sampled).

A tree hangs below the last confirmed token (the root). Growing it one depth at a time expands the
``width`` best frontier nodes (by cumulative draft log-probability) into their ``branching`` most probable
children, with one batched draft forward per depth. Verification sends the ``size`` best nodes of the whole
tree (an ancestor-closed set: a child never scores above its parent) to the target in one forward, each
node seeing the context, its ancestors and itself. Greedy acceptance keeps the longest path whose tokens
equal the target's arg-max at their parents. A tree with ``branching = width = 1`` is a chain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from adaptive.cached_model import CachedModel
from adaptive.sampling import in_vocabulary, sample, target_ids
from adaptive.verification import CorrectionRule, residual_correction


@dataclass(frozen=True)
class TreeShape:
    """How a draft tree grows and how much of it is verified."""

    branching: int = 4
    """k: children of each expanded node."""
    width: int = 4
    """W: frontier nodes expanded per depth."""
    size: int = 32
    """V: most nodes sent to the target per round."""

    def __post_init__(self) -> None:
        for name in ("branching", "width", "size"):
            if getattr(self, name) < 1:
                raise ValueError(f"tree {name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def parse(cls, spec: str) -> TreeShape:
        """``"k,W,V"``, e.g. ``"4,4,32"``."""
        try:
            branching, width, size = (int(x) for x in spec.split(","))
        except ValueError:
            raise ValueError(f"tree shape must be 'branching,width,size' (three integers, e.g. 4,4,32), got {spec!r}") from None
        return cls(branching, width, size)


@dataclass(frozen=True)
class Node:
    token: int
    parent: int
    """Index of the parent node, -1 below the root."""
    depth: int
    """1 for the root's children."""
    score: float
    """Cumulative draft log-probability of the path to this node."""
    top1_prob: float
    """Top-1 probability of the draft distribution this node was drawn from."""
    entropy: float
    """Entropy (nats) of that distribution."""
    log_prob: float
    margin: float
    """Top-1 minus top-2 probability of that distribution."""


@dataclass
class DraftTree:
    """Nodes in creation order (parents before children) and the draft-cache slot of each fed node."""

    nodes: list[Node] = field(default_factory=list)
    slots: dict[int, int] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        return self.nodes[-1].depth if self.nodes else 0

    def add_children(self, parent: int, logits: torch.Tensor, branching: int, vocabulary: torch.Tensor | None = None) -> None:
        """The ``branching`` most probable tokens of ``logits`` (one row; ``vocabulary``: the draft's, as
        :func:`rank_children` takes it) as children of ``parent``."""
        self.add_ranked(parent, *(column[0] for column in rank_children(logits[None], branching, vocabulary)))

    def add_ranked(self, parent: int, tokens: list[int], log_probs: list[float], top1: float, entropy: float, margin: float) -> None:
        """Children of ``parent`` from :func:`rank_children` output (one row)."""
        base = self.nodes[parent].score if parent >= 0 else 0.0
        depth = self.nodes[parent].depth + 1 if parent >= 0 else 1
        for token, log_prob in zip(tokens, log_probs):
            if log_prob > -float("inf"):  # a reduced-vocabulary draft gives q = 0 outside its head
                self.nodes.append(Node(int(token), parent, depth, base + log_prob, top1, entropy, log_prob, margin))

    def frontier(self, width: int) -> list[int]:
        """The ``width`` best nodes of the deepest level."""
        deepest = [i for i, n in enumerate(self.nodes) if n.depth == self.depth]
        return sorted(deepest, key=lambda i: -self.nodes[i].score)[:width]

    def best_at(self, depth: int) -> Node:
        return max((n for n in self.nodes if n.depth == depth), key=lambda n: n.score)

    def ancestors(self, index: int) -> list[int]:
        """Node indices from depth 1 down to ``index``'s parent."""
        chain = []
        parent = self.nodes[index].parent
        while parent >= 0:
            chain.append(parent)
            parent = self.nodes[parent].parent
        return chain[::-1]

    def select(self, size: int) -> list[int]:
        """The ``size`` best nodes, ancestor-closed, parents before children."""
        order = sorted(range(len(self.nodes)), key=lambda i: (-self.nodes[i].score, self.nodes[i].depth, i))
        chosen = sorted(order[:size], key=lambda i: (self.nodes[i].depth, i))
        kept = set(chosen)
        if any(self.nodes[i].parent >= 0 and self.nodes[i].parent not in kept for i in chosen):
            raise AssertionError("tree selection is not ancestor-closed")
        return chosen


def rank_children(
    logits: torch.Tensor, branching: int, vocabulary: torch.Tensor | None = None, chunk: int = 32
) -> tuple[list[list[int]], list[list[float]], list[float], list[float], list[float]]:
    """For ``[R, V]`` draft logits: per row the ``branching`` most probable tokens, their log-probabilities
    (float64), the top-1 probability, the entropy in nats and the top-1 minus top-2 probability (``chunk``
    rows at a time, to stay in cache). ``vocabulary``: the sorted target ids a reduced-vocabulary draft
    scores, or None (:func:`~adaptive.sampling.in_vocabulary`; only speed depends on it)."""
    tokens, values, top1, entropy, margin = [], [], [], [], []
    for rows in in_vocabulary(logits, vocabulary).split(chunk):
        log_probs = torch.log_softmax(rows.double(), dim=-1)
        probs = log_probs.exp()
        entropy += (-(probs * torch.where(probs > 0, log_probs, 0.0)).sum(dim=-1)).tolist()
        top = torch.topk(log_probs, min(max(2, branching), log_probs.shape[-1]), dim=-1)
        tokens += target_ids(top.indices[:, :branching], vocabulary).tolist()
        values += top.values[:, :branching].tolist()
        best = top.values.exp()
        top1 += best[:, 0].tolist()
        margin += (best[:, 0] - best[:, 1] if best.shape[-1] > 1 else best[:, 0]).tolist()
    return tokens, values, top1, entropy, margin


def attention_mask(cached: int, prefixes: list[int], extra: list[list[int]], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask ``[1, 1, n, cached + n]`` for ``n`` new tokens after ``cached`` cache entries: new token
    ``i`` sees the first ``prefixes[i]`` columns, the columns listed in ``extra[i]`` (its tree ancestors) and
    itself; nothing else."""
    n = len(prefixes)
    allowed = torch.arange(cached + n)[None, :] < torch.tensor(prefixes, dtype=torch.long)[:, None]
    for row, columns in enumerate(extra):
        allowed[row, columns] = True
    allowed[torch.arange(n), cached + torch.arange(n)] = True
    mask = torch.zeros(n, cached + n, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def grow_level(model: CachedModel, trees: list[DraftTree], contexts: list[int], shape: TreeShape, clock: Callable[[], float]) -> float:
    """Expand the best ``shape.width`` nodes of each tree's deepest level in ONE batched draft forward. Tree
    ``t`` hangs below the first ``contexts[t]`` entries of ``model``'s cache; each node sees those, its
    ancestors' entries and itself. Returns the seconds spent in the forward (timed with ``clock``)."""
    rows = [(t, i) for t, tree in enumerate(trees) for i in tree.frontier(shape.width)]
    cached = model.length
    ancestors = [[trees[t].slots[a] for a in trees[t].ancestors(i)] for t, i in rows]
    mask = attention_mask(cached, [contexts[t] for t, _ in rows], ancestors, model.dtype, model.device)
    positions = [contexts[t] - 1 + trees[t].nodes[i].depth for t, i in rows]
    start = clock()
    logits = model.forward_masked([trees[t].nodes[i].token for t, i in rows], positions, mask)
    seconds = clock() - start
    for row, (t, i) in enumerate(rows):
        trees[t].slots[i] = cached + row
    ranked = rank_children(logits, shape.branching, model.vocabulary)
    for row, (t, i) in enumerate(rows):
        trees[t].add_ranked(i, *(column[row] for column in ranked))
    return seconds


def accept_sampled(
    tree: DraftTree,
    selected: list[int],
    p_rows: torch.Tensor,
    generator: torch.Generator | None = None,
    correction: CorrectionRule = residual_correction,
) -> tuple[list[int], int]:
    """Exact verification of a draft tree at T > 0: recursive rejection sampling over each node's verified children
    (SpecInfer's multi-candidate rule, Miao et al., ASPLOS 2024), each child a deterministic proposal (the draft's
    top-k, so its q is one-hot): a child x is accepted with probability min(1, p(x)/q(x)) = p(x); on a rejection p
    becomes the residual norm(max(p - q, 0)), p without x; the first accepted child is descended into and its own
    children tried against its row of p; where none is accepted, the next token is drawn from the residual. The output
    follows p exactly whatever the tree (which nodes are grown and verified depends on the draft alone).

    Args:
        p_rows: ``[1 + len(selected), V]`` target sampling distributions: row 0 below the root, row 1 + j below
            ``selected[j]``.
        correction: the rule after a rejection (the exact residual; the naive "keep p" only to show a test fails).

    Returns:
        The accepted path (node indices) and the token that follows it.
    """
    children: dict[int, list[int]] = {}
    for j, index in enumerate(selected):
        children.setdefault(tree.nodes[index].parent, []).append(j)
    path, parent, row = [], -1, 0
    while True:
        p = p_rows[row].double()
        for j in children.get(parent, []):
            token = tree.nodes[selected[j]].token
            if float(torch.rand((), generator=generator, dtype=torch.float64, device=p.device)) < float(p[token]):
                path.append(selected[j])
                parent, row = selected[j], 1 + j
                break
            p = correction(p, torch.nn.functional.one_hot(torch.tensor(token, device=p.device), p.shape[-1]).double())
        else:
            return path, int(sample(p, generator))


def accept_greedy(tree: DraftTree, selected: list[int], root_choice: int, node_choices: list[int]) -> list[int]:
    """Indices (into ``tree.nodes``) of the longest selected path whose every token equals the target's
    arg-max at its parent: ``root_choice`` below the root, ``node_choices[j]`` below ``selected[j]``."""
    children: dict[int, dict[int, int]] = {}
    for j, index in enumerate(selected):
        children.setdefault(tree.nodes[index].parent, {})[tree.nodes[index].token] = j
    path, parent, choice = [], -1, root_choice
    while choice in children.get(parent, {}):
        j = children[parent][choice]
        path.append(selected[j])
        parent, choice = selected[j], node_choices[j]
    return path
