"""The observation a policy sees at each decision: a fixed-size float32 vector with a versioned schema.

Fields (version 1), all known at decision time, scaled to roughly [-1, 1]:

* ``depth``: tokens drafted so far this round / max_depth
* ``cap``: this round's depth cap (max_depth, or fewer near the token budget) / max_depth
* ``context``: context length / 4096
* ``step_{i}_top1``, ``step_{i}_entropy``, ``step_{i}_cum_logprob`` for i = 1..max_depth: the draft's top-1
  probability, entropy / 10 nats and cumulative log-probability / 10 (clipped at -1) after step i;
  0 for steps not drafted yet
* ``recent_{j}`` for j = 1..8: accepted length of the j-th most recent round / max_depth (0 if none)
* ``c``: draft step cost relative to a target step; ``g_now`` and ``g_next``: verification cost of
  the current depth and of one more token, relative to a target step (from the cost profile)

Version 2 (``copy=True``: a copy drafter beside the draft model) appends:

* ``source_copy``, ``source_copy_model``: the round's source (both 0: the model)
* ``copy_match``: the copy drafter's match length where the round starts / 16 (0: no match)
* ``step_{i}_match``: the match length behind draft step i / 16 (0 for a model's step or a step not drafted)
* ``generated``: tokens generated so far in this output / 256

Version 3 (copy, the default) adds, after ``copy_match``, what the copy drafter would propose first, known
before the source decision at no cost (its continuation counts at the round's start):

* ``copy_top1``: the share of that proposal among the match's continuations (0: no match)
* ``copy_entropy``: the entropy of those continuation frequencies / 10 nats

Version 4 (the default, with or without the copy drafter's fields of version 3) adds to every draft step:

* ``step_{i}_margin``: the draft's top-1 minus top-2 probability at step i (0 for steps not drafted yet)

Version 5 (``tree=True``: draft trees, whose traces hold every node's score) appends what the grown tree shows,
as Learning to Draft's size policy sees it:

* ``node_{r}_prob`` for r = 1..32: the cumulative draft probability (product along its path) of the r-th best
  node of the levels grown so far, in the tree's verification order (0 past the nodes grown); their sum over the
  best V nodes is the tokens a calibrated draft expects V verified nodes to accept
* ``level_{i}_mass`` for i = 1..max_depth: the summed cumulative probability of level i's nodes (0 for levels
  not grown): the chance, as the draft sees it, that the accepted path reaches level i

A policy stores :meth:`ObservationSchema.describe` with its weights; :meth:`ObservationSchema.check`
refuses a policy trained on another schema, naming the difference. :meth:`ObservationSchema.of` rebuilds
the schema a policy was trained on, so policies of every earlier version keep loading and see the
observations they were trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from adaptive.policy import RECENT_ROUNDS

SCHEMA_NAME = "adaptive-draft/observation"
SCHEMA_VERSION = 4
"""The latest chain version: what new chain policies are trained on."""
TREE_VERSION = 5
"""The version with the grown tree's node scores (``tree=True``), for tree policies."""
VERSIONS = {False: (1, 4), True: (2, 3, 4)}
"""Chain versions without and with the copy drafter's fields (2 lacks its first proposal's share and entropy;
1 to 3 lack the steps' margins)."""
TREE_RANKS = 32
"""Best nodes whose cumulative probabilities a tree observation shows (the largest verification size trained)."""
MATCH_SCALE = 16.0
GENERATED_SCALE = 256.0
RECENT = RECENT_ROUNDS
"""Recent accepted lengths in the observation: as many as the decoder shows a policy."""
CONTEXT_SCALE = 4096.0
NATS_SCALE = 10.0
BOUND = 10.0
"""Every observation entry is clipped to [-BOUND, BOUND] (the Box space's bounds)."""


class SchemaMismatch(ValueError):
    """A policy was trained on observations with another layout than this environment produces."""


@dataclass(frozen=True)
class ObservationSchema:
    """Layout of the observation vector for a given maximum draft depth."""

    max_depth: int
    copy: bool = False
    """The copy drafter's fields too (versions 2 to 4)."""
    version: int = SCHEMA_VERSION
    """One of :data:`VERSIONS` (older ones to run policies trained on them, or on traces without margins), or
    :data:`TREE_VERSION` with ``tree``."""
    tree: bool = False
    """The grown tree's node scores too (version 5, without the copy drafter)."""

    def __post_init__(self) -> None:
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")
        if self.tree or self.version == TREE_VERSION:
            if not (self.tree and self.version == TREE_VERSION and not self.copy):
                raise ValueError(f"the tree's node scores come with observation schema version {TREE_VERSION}, tree=True and no copy drafter")
        elif self.version not in VERSIONS[self.copy]:
            kind = "with" if self.copy else "without"
            raise ValueError(f"observation schema version must be one of {VERSIONS[self.copy]} {kind} the copy drafter, got {self.version}")

    @classmethod
    def of(cls, described: dict) -> ObservationSchema:
        """The schema a saved policy was trained on, from its :meth:`describe` (then :meth:`check`-ed)."""
        version = described.get("version")
        known = sorted({*VERSIONS[False], *VERSIONS[True], TREE_VERSION})
        if version not in known:
            raise SchemaMismatch(f"observation schema version {version!r} is unknown to this release (known: {known}); retrain the policy")
        copy = "source_copy" in described.get("fields", ())
        schema = cls(described.get("max_depth", 0), copy=copy, version=version, tree=version == TREE_VERSION)
        schema.check(described)
        return schema

    @property
    def shows_copy_first(self) -> bool:
        """Versions 3 and 4: the copy drafter's first proposal (share, entropy) is part of the observation."""
        return self.copy and self.version >= 3

    @property
    def shows_margins(self) -> bool:
        """Versions 4 and 5: every draft step's margin (top-1 minus top-2 probability) is part of the observation."""
        return self.version >= 4

    @property
    def tree_size(self) -> int:
        """Fields of the tree block (0 without ``tree``)."""
        return TREE_RANKS + self.max_depth if self.tree else 0

    @property
    def step_width(self) -> int:
        """Fields per draft step."""
        return 3 + self.shows_margins

    @property
    def copy_head(self) -> int:
        """Fields of the copy block before the per-step match lengths (0 without the copy drafter)."""
        return (3 + 2 * self.shows_copy_first) if self.copy else 0

    @property
    def names(self) -> list[str]:
        kinds = ("top1", "entropy", "cum_logprob", "margin")[: self.step_width]
        steps = [f"step_{i}_{kind}" for i in range(1, self.max_depth + 1) for kind in kinds]
        names = ["depth", "cap", "context", *steps, *[f"recent_{j}" for j in range(1, RECENT + 1)], "c", "g_now", "g_next"]
        if self.copy:
            first = ["copy_top1", "copy_entropy"] if self.shows_copy_first else []
            names += ["source_copy", "source_copy_model", "copy_match", *first, *[f"step_{i}_match" for i in range(1, self.max_depth + 1)], "generated"]
        if self.tree:
            names += [f"node_{r}_prob" for r in range(1, TREE_RANKS + 1)] + [f"level_{i}_mass" for i in range(1, self.max_depth + 1)]
        return names

    @property
    def size(self) -> int:
        return 3 + self.step_width * self.max_depth + RECENT + 3 + (self.copy_head + self.max_depth + 1 if self.copy else 0) + self.tree_size

    def describe(self) -> dict:
        """JSON-ready identity of this schema (stored with trained policies)."""
        return {"name": SCHEMA_NAME, "version": self.version, "max_depth": self.max_depth, "size": self.size, "fields": self.names}

    def check(self, described: dict) -> None:
        """Raise :class:`SchemaMismatch` unless ``described`` (from a saved policy) is this schema."""
        mine = self.describe()
        for key in ("name", "version", "max_depth", "size", "fields"):
            if described.get(key) != mine[key]:
                theirs = described.get(key, "<missing>")
                if key == "fields":
                    theirs, mine_value = f"{len(theirs)} fields", f"{len(mine[key])} fields"
                else:
                    mine_value = mine[key]
                raise SchemaMismatch(
                    f"observation schema mismatch on {key!r}: the policy was trained with {theirs}, this environment "
                    f"produces {mine_value}; retrain the policy or use an environment with the same schema"
                )


class ObservationBuilder:
    """Fills one reusable observation vector as a round progresses: a round's fixed fields once, each draft
    step's fields once, the depth-dependent ones at each build (cheap enough for replay speed, and for a
    learned policy's decisions in the decoding loop)."""

    def __init__(self, schema: ObservationSchema, c: float, g: Sequence[float]) -> None:
        self.schema = schema
        self.g = [float(x) for x in g] + [float(g[-1])] * max(0, schema.max_depth + 2 - len(g))
        self._width = schema.step_width
        self._recent_at = 3 + self._width * schema.max_depth
        self._tail_at = self._recent_at + RECENT
        self._copy_at = self._tail_at + 3
        """Copy schemas: source one-hot, copy match, (3, 4:) first proposal's share and entropy, per-step match lengths, generated."""
        self._tree_at = schema.size - schema.tree_size
        self._vector = np.zeros(schema.size, dtype=np.float32)
        self._vector[self._tail_at] = _bounded(c)

    def new_round(self, recent: Sequence[int], source: str = "model", copy_match: int = 0, copy_first: tuple[float, float] = (0.0, 0.0)) -> None:
        """Forget the previous round's steps; ``recent`` are accepted lengths, oldest first; ``source``,
        ``copy_match`` and ``copy_first`` (copy schemas) what drafts the round, the copy drafter's match length
        where it starts and its first proposal's (share, entropy)."""
        vector, k = self._vector, self.schema.max_depth
        vector[3 : self._tail_at] = 0.0
        vector[self._tree_at :] = 0.0
        for j, accepted in enumerate(list(recent[-RECENT:])[::-1]):
            vector[self._recent_at + j] = _bounded(accepted / k)
        if self.schema.copy:
            at = self._copy_at
            vector[at : at + self.schema.copy_head + k] = 0.0
            vector[at], vector[at + 1] = source == "copy", source == "copy+model"
            vector[at + 2] = _bounded(copy_match / MATCH_SCALE)
            if self.schema.shows_copy_first:
                vector[at + 3], vector[at + 4] = _bounded(copy_first[0]), _bounded(copy_first[1] / NATS_SCALE)

    def add_step(self, depth: int, top1: float, entropy: float, cumulative_log_prob: float, match_length: int = 0, margin: float = 0.0) -> None:
        """Record the features of draft step ``depth`` (1-based)."""
        vector, i = self._vector, 3 + self._width * (depth - 1)
        vector[i] = _bounded(top1)
        vector[i + 1] = _bounded(entropy / NATS_SCALE)
        vector[i + 2] = _bounded(max(-1.0, cumulative_log_prob / NATS_SCALE))
        if self.schema.shows_margins:
            if margin != margin:  # NaN: traces recorded before margins were (the environment refuses them first)
                raise ValueError(f"draft step {depth} has no margin, which observation schema version {self.schema.version} shows")
            vector[i + 3] = _bounded(margin)
        if self.schema.copy:
            vector[self._copy_at + self.schema.copy_head - 1 + depth] = _bounded(match_length / MATCH_SCALE)

    def set_tree(self, ranked: Sequence[float], level_mass: Sequence[float]) -> None:
        """Record the grown tree (tree schemas) as :func:`tree_summary` gives it: its best nodes' cumulative
        probabilities, largest first, and each grown level's summed cumulative probability (the rest: 0)."""
        at, k = self._tree_at, self.schema.max_depth
        block = self._vector[at:]
        block[:] = 0.0
        ranked, level_mass = ranked[:TREE_RANKS], level_mass[:k]
        block[: len(ranked)] = ranked
        block[TREE_RANKS : TREE_RANKS + len(level_mass)] = level_mass

    def build(self, depth: int, cap: int, context_length: int, generated: int = 0) -> np.ndarray:
        """The observation vector now (a copy), every entry clipped to [-BOUND, BOUND]."""
        vector, k = self._vector, self.schema.max_depth
        vector[0], vector[1], vector[2] = _bounded(depth / k), _bounded(cap / k), _bounded(context_length / CONTEXT_SCALE)
        vector[self._tail_at + 1], vector[self._tail_at + 2] = _bounded(self.g[depth]), _bounded(self.g[depth + 1])
        if self.schema.copy:
            vector[-1] = _bounded(generated / GENERATED_SCALE)
        return vector.copy()


def tree_summary(depths: Sequence[int], scores: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """What a version-5 observation shows of a grown tree, from its nodes' depths (1 = the root's children) and
    cumulative draft log-probabilities: the :data:`TREE_RANKS` largest cumulative probabilities, largest first, and
    the summed cumulative probability of each level grown."""
    probs = np.exp(np.asarray(scores, dtype=np.float64))
    depths = np.asarray(depths, dtype=np.int64)
    ranked = np.sort(probs)[::-1][:TREE_RANKS]
    mass = np.bincount(depths - 1, weights=probs) if len(depths) else np.zeros(0)
    return tuple(ranked.tolist()), tuple(mass.tolist())


def _bounded(x: float) -> float:
    """``x`` clipped to [-BOUND, BOUND]: every entry is clipped as it is written."""
    return -BOUND if x < -BOUND else BOUND if x > BOUND else x
