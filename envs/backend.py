"""What an environment needs from a backend: draft one step, verify, and say what it cost."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Cycle:
    """Outcome and cost of one draft-and-verify cycle."""

    drafted: int
    verified: int
    accepted: int
    emitted: int
    draft_seconds: float
    verify_seconds: float


class Backend(ABC):
    """A source of draft steps and verifications for one generation at a time."""

    max_depth: int
    """Deepest round the backend supports (the observation schema is sized by it)."""
    c: float
    """Draft step cost relative to a target step (observation constant)."""
    g: Sequence[float]
    """g[γ]: verification cost of γ drafted tokens relative to a target step (observation constant)."""
    target_step_seconds: float
    """One plain target decoding step: the unit of the reward (reward = cycle speedup over plain decoding)."""

    num_prompts: int
    """How many distinct generations :meth:`start_prompt` can begin."""
    tree: bool = False
    """True when rounds grow draft trees (sizes count nodes, drafts count levels)."""
    sources: tuple[str, ...] = ("model",)
    """What may draft a round (:data:`~adaptive.policy.SOURCES`): more than the model where a copy drafter
    is recorded beside it."""

    def start(self, rng: np.random.Generator) -> None:
        """Begin a new generation, its prompt chosen with ``rng``."""
        self.start_prompt(int(rng.integers(self.num_prompts)), rng)

    @abstractmethod
    def start_prompt(self, index: int, rng: np.random.Generator | None = None) -> None:
        """Begin generating for prompt ``index``; ``rng`` drives any randomness (default: seeded by ``index``)."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """True once the generation ended (EOS or token budget)."""

    @property
    @abstractmethod
    def context_length(self) -> int:
        """Confirmed tokens (prompt + generated) before the current round."""

    @property
    @abstractmethod
    def cap(self) -> int:
        """Deepest this round may go (max_depth, or less near the token budget)."""

    @property
    @abstractmethod
    def recent(self) -> Sequence[int]:
        """Accepted lengths of this generation's rounds so far, oldest first."""

    @property
    @abstractmethod
    def generated(self) -> int:
        """Tokens generated so far in the current output."""

    @property
    def copy_match(self) -> int:
        """The copy drafter's match length at the current position (0 without a copy drafter)."""
        return 0

    @property
    def copy_first(self) -> tuple[float, float]:
        """The copy drafter's first proposal here: its share among the match's continuations and their
        entropy in nats ((0, 0) without a match or a copy drafter)."""
        return (0.0, 0.0)

    def choose_source(self, source: str) -> None:
        """Before the round's first draft step: what drafts it (one of :attr:`sources`)."""
        if source not in self.sources:
            raise ValueError(f"this backend drafts with {', '.join(self.sources)}; got the source {source!r}")

    shows_margins: bool = True
    """Whether :meth:`draft` shows each step's margin (replay of traces recorded before it was: NaN instead)."""
    shows_tree_scores: bool = False
    """Whether :meth:`tree_view` shows the grown tree's node probabilities (tree backends whose traces hold them)."""

    def tree_view(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """What this round's tree, grown so far, shows a policy (:func:`~adaptive.observation.tree_summary`): its best
        nodes' cumulative probabilities, largest first, and each grown level's summed cumulative probability."""
        raise NotImplementedError(f"{type(self).__name__} shows no draft tree's node probabilities")

    @abstractmethod
    def draft(self) -> tuple[float, float, float, float, int] | None:
        """Draft one token; return its step's :data:`~adaptive.sampling.STEP_FEATURES` (top-1 probability,
        entropy in nats, log-probability, margin) and its copy match length, or None when the round's drafter
        has nothing to propose (its cap then drops to the depth)."""

    @abstractmethod
    def verify(self, size: int) -> Cycle:
        """Verify the first ``size`` drafted tokens, emit, and start the next round."""

    @property
    def max_size(self) -> int:
        """Largest verification size: drafted tokens of a chain (tree backends: nodes)."""
        return self.max_depth

    def verifiable(self, depth: int) -> int:
        """Most tokens (tree: nodes) a round of ``depth`` drafted tokens (levels) can verify."""
        return depth

    def default_size(self, depth: int) -> int:
        """The verification size when no size policy decides: everything drafted (tree: the shape's V)."""
        return depth

    def close(self) -> None:  # noqa: B027 (optional hook: most backends hold nothing to release)
        """Release resources (nothing by default)."""
