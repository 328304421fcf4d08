"""The protocol between the decoder and a draft policy, and the records it exchanges.

Per round, the decoder drafts one token, then asks :meth:`DraftPolicy.should_continue` after every draft
step until the policy says stop or the round's depth cap is reached. It then asks
:meth:`DraftPolicy.verify_size` how many of the drafted tokens go to the target (for a chain this is
usually all of them; with draft trees it becomes a real choice), verifies, and reports the finished round
through :meth:`DraftPolicy.observe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

RECENT_ROUNDS = 8
"""How many recent accepted lengths a policy sees in :class:`DraftState`."""


SOURCES = ("model", "copy", "copy+model")
"""What drafts a round when the decoder also has a copy drafter: the draft model, the copy drafter, or the
copy drafter while it has proposals and the draft model after it."""


def depth_cap(max_depth: int, remaining: int) -> int:
    """A round's depth cap: the decoder's ``max_depth``, or fewer near the end of the token budget (a round
    emits at most its depth + 1 tokens, so drafting past ``remaining - 1`` is wasted)."""
    return min(max_depth, remaining - 1)


def verifiable(size: int, depth: int) -> bool:
    """A round of ``depth`` drafted tokens verifies 1..depth of them (0 only when nothing was drafted)."""
    return 0 <= size <= depth and (size >= 1 or depth == 0)


@dataclass(frozen=True)
class DraftStep:
    """What the draft model showed at one step (from its untempered softmax)."""

    token: int
    top1_prob: float
    entropy: float
    """Entropy of the draft's next-token distribution, in nats."""
    log_prob: float
    """Log-probability of the drafted token."""
    cumulative_log_prob: float
    """Sum of log_prob over this round's steps so far."""
    match_length: int = 0
    """A copy drafter's: how many context tokens the match it copies from spans (0 for model drafts)."""
    margin: float = 0.0
    """Top-1 minus top-2 probability of the draft's next-token distribution."""


@dataclass(frozen=True)
class DraftState:
    """Everything known when a policy decides."""

    context_length: int
    """Tokens in the confirmed sequence (prompt + generated) before this round."""
    steps: tuple[DraftStep, ...]
    max_depth: int
    """Hard cap on the depth of this round (decoder limit or remaining token budget)."""
    recent_accepted: tuple[int, ...] = ()
    """Accepted lengths of the most recent rounds, oldest first."""
    copy_match: int = 0
    """With a copy drafter beside the draft model: the length of the context suffix its first proposal would
    copy from (0: no match, or no copy drafter)."""
    source: str = "model"
    """What drafts this round (:data:`SOURCES`)."""
    generated: int = 0
    """Tokens generated so far in this output."""
    copy_first: tuple[float, float] = (0.0, 0.0)
    """With a copy drafter: its first proposal's share among the match's continuations and their entropy in
    nats, known before the round drafts ((0, 0): no match, or no copy drafter)."""
    tree_ranked: tuple[float, ...] = ()
    """With draft trees: the cumulative draft probabilities (products along their paths) of the grown tree's best
    nodes, largest first (up to :data:`~adaptive.observation.TREE_RANKS`; empty for chains)."""
    tree_level_mass: tuple[float, ...] = ()
    """With draft trees: each grown level's summed cumulative probability, level 1 first."""

    @property
    def depth(self) -> int:
        """Number of tokens drafted so far in this round."""
        return len(self.steps)


@dataclass
class RoundStats:
    """One draft-and-verify cycle, as measured.

    Times are wall-clock seconds. ``draft_time`` covers the draft forwards, sampling and features,
    ``verify_time`` the target forward, the acceptance test and the cache rollback, ``policy_time`` the
    policy calls; ``forward_time`` is the part of all that spent inside model forward calls, and
    ``target_forward_time`` the target's verifying forward alone (the profile's ``verify`` prices that).
    """

    context_length: int
    drafted: int
    verified: int
    accepted: int
    emitted: int
    tokens: tuple[int, ...]
    draft_time: float
    verify_time: float
    policy_time: float
    forward_time: float
    steps: tuple[DraftStep, ...] = field(default=())
    source: str = "model"
    """What drafted the round (:data:`SOURCES`)."""
    target_forward_time: float = 0.0

    def time_parts(self) -> tuple[float, float, float, float]:
        """The round's draft and verify time split four ways: the draft's forwards, drafting's own work outside them,
        the target's verifying forward, and verification's own work (acceptance, rollback, emitting)."""
        draft_forwards = self.forward_time - self.target_forward_time
        return draft_forwards, self.draft_time - draft_forwards, self.target_forward_time, self.verify_time - self.target_forward_time

    @property
    def rejected(self) -> bool:
        """Whether the target rejected a token of the round's draft: acceptance stopped short of the drafted
        chain's verified prefix, or of a tree's depth (a tree verifies more nodes than its path can hold)."""
        return self.accepted < min(self.verified, self.drafted)

    @property
    def total_time(self) -> float:
        """Draft + verify + policy time of the round."""
        return self.draft_time + self.verify_time + self.policy_time

    @property
    def overhead_time(self) -> float:
        """Time of the round spent outside model forward calls (the decoder's own cost)."""
        return self.total_time - self.forward_time


@runtime_checkable
class DraftPolicy(Protocol):
    """Decides the draft depth (continue/stop after each step) and the verification size."""

    name: str
    reads_step_features: bool
    """False if should_continue never looks at the steps' features (the decoder then computes them for
    the whole round after drafting, in one pass; while drafting such a policy sees NaN features)."""

    def reset(self) -> None:
        """Forget per-generation state; called before each generation."""

    def source(self, state: DraftState) -> str:
        """Before drafting, when the decoder has a copy drafter beside the draft model: what drafts this
        round (one of :data:`SOURCES`)."""

    def should_continue(self, state: DraftState) -> bool:
        """After a draft step: draft another token?"""

    def verify_size(self, state: DraftState) -> int:
        """After drafting: how many drafted tokens (1..state.depth) the target verifies."""

    def observe(self, stats: RoundStats) -> None:
        """Feedback after each verified round."""


RULE_DECISION_SECONDS = 0.0
"""What a replayed round charges each decision of a rule that reads no per-step features: nothing (about 2 µs
live, ``benchmarks/policy_overhead.py``'s ``static:1`` floor, well under 0.1 % of a round)."""


class BasePolicy:
    """Convenient defaults: no state, verify everything drafted, ignore feedback."""

    name = "base"
    reads_step_features = True
    decision_seconds: float | None = None
    """Seconds a replayed round charges per decision of this policy; None: the replay's configured cost (a learned
    policy's decision with the draft features it reads, ``env.decision_seconds``); rules declare their own."""

    def reset(self) -> None:
        """No per-generation state."""

    def source(self, state: DraftState) -> str:
        """Draft with the draft model."""
        return "model"

    def should_continue(self, state: DraftState) -> bool:
        raise NotImplementedError

    def verify_size(self, state: DraftState) -> int:
        """Verify every drafted token."""
        return state.depth

    def observe(self, stats: RoundStats) -> None:
        """Ignore feedback."""


@dataclass(frozen=True)
class BatchState:
    """What a batch policy knows as a batched round starts (:mod:`adaptive.batch_decoder`)."""

    batch_size: int
    """Requests decoded in this round."""
    waiting: int
    """Requests queued behind them."""
    max_depth: int
    """The decoder's cap on drafted tokens per round."""
    recent_accepted: tuple[tuple[int, ...], ...] = ()
    """Per request in the batch: accepted lengths of its most recent rounds, oldest first."""
    recent_drafted: tuple[tuple[int, ...], ...] = ()
    """Per request: the depths of those rounds."""


@runtime_checkable
class BatchPolicy(Protocol):
    """Decides one draft depth for every request of a batched round (0: no speculation this round)."""

    name: str

    def depth(self, state: BatchState) -> int:
        """Tokens each request drafts this round (0..state.max_depth)."""


@dataclass(frozen=True)
class BatchDraftStep:
    """What a batched round's draft has shown so far, after one or more draft steps."""

    drafted: int
    """Tokens each drafting request has drafted this round."""
    top1: tuple[tuple[float, ...], ...]
    """Per request in the batch: the draft's top-1 probability at each of its steps this round (from its
    untempered softmax, as :func:`~adaptive.sampling.draft_features` computes it); empty for a request its
    draft cannot draft for yet."""


@runtime_checkable
class SteppedBatchPolicy(BatchPolicy, Protocol):
    """A batch policy that also decides, after each draft step, whether the whole batch drafts another token:
    :meth:`depth` bounds the round, :meth:`should_continue` may stop it earlier."""

    def should_continue(self, state: BatchState, step: BatchDraftStep) -> bool:
        """Whether every drafting request drafts one more token (below the round's bound)."""


def asks_each_step(policy: BatchPolicy) -> bool:
    """Whether ``policy`` is to be asked after each draft step: a :class:`SteppedBatchPolicy` whose ``stepped``
    attribute, where it has one, is true (a wrapper says so only when the policy inside is stepped, so that the
    decoder computes no per-step draft probabilities for policies that only pick depths)."""
    return isinstance(policy, SteppedBatchPolicy) and getattr(policy, "stepped", True)


def continues(policy: BatchPolicy, state: BatchState, step: BatchDraftStep) -> bool:
    """``policy``'s answer after a draft step: a stepped policy's (:func:`asks_each_step`), otherwise always yes
    (a policy that only picks depths drafts to the depth it picked)."""
    return policy.should_continue(state, step) if asks_each_step(policy) else True
