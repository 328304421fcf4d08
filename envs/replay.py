"""Replay backend: exact greedy acceptances from recorded traces, time from a measured cost profile.

A round at position t that drafts d tokens and verifies γ of them accepts min(γ, m(t)) and emits that + 1
(fewer at the end of the output) — exactly what the live greedy decoder does with the same pair and
prompt. With sampled (T > 0) traces the recorded output o is what is emitted, and each drafted step's
acceptance is drawn, as it is drafted, from a_j = min(1, q_j(o_j) / p_j(o_j)) (the live decoder's
acceptance probability given o); the policy sees the features of proposing o_j, or after the first
rejection those of the recorded rejected proposal and its continuation. Exact in distribution for every
policy that verifies what it drafts (a size policy verifying fewer is shown unverified steps' features as if
they were verified).
Its time is d draft steps plus one verification of γ tokens, read from the profile at the round's
context length. No model runs, so a step costs microseconds.

Greedy traces that hold the copy drafter's chains (:class:`~adaptive.traces.CopyTrace`) replay rounds
drafted by it too (``choose_source``): a copy round drafts while the chain at t has proposals and accepts
as many as match; a copy+model round goes on with the model's chain at t + a after the copy drafter's a
proposals, which is the model's own round there when all a matched (exact for drafts that read only
tokens); a draft head reads the copied tokens from its own states, so its traces hold its chain after them
(:attr:`~adaptive.traces.CopyTrace.after_match`), which such a round replays instead, exactly. A copy+model
round whose copied tokens reach the output's end drafts no model steps (the live decoder would draft past
the EOS: only its draft time differs).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from adaptive.policy import SOURCES, depth_cap, verifiable
from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from envs.backend import Backend, Cycle


class TraceReplay(Backend):
    """What every trace replay shares: walking one recorded output round by round, timed by a profile."""

    def _setup(self, traces, profile: CostProfile) -> None:
        self.traces = traces
        self.profile = profile
        self.c = profile.c
        self.g = profile.g
        self.target_step_seconds = profile.target_step_seconds
        self.num_prompts = len(traces)
        self.prompt = 0
        self._budget = traces.max_new_tokens
        self._features = traces.features.tolist()  # Python floats: faster to index one at a time than numpy
        self.shows_margins = traces.has_margins
        self._start = self._length = self._t = self._depth = self._prompt_length = 0
        self._recent: list[int] = []

    def start_prompt(self, index: int, rng: np.random.Generator | None = None) -> None:
        self.prompt = index
        self._start = int(self.traces.offsets[index])
        self._length = int(self.traces.offsets[index + 1]) - self._start
        self._prompt_length = int(self.traces.prompt_lengths[index])
        self._t = 0
        self._depth = 0
        self._recent = []

    @property
    def done(self) -> bool:
        return self._t >= self._length

    @property
    def context_length(self) -> int:
        return self._prompt_length + self._t

    @property
    def generated(self) -> int:
        return self._t

    @property
    def cap(self) -> int:
        return depth_cap(self.max_depth, self._budget - self._t)

    @property
    def recent(self) -> Sequence[int]:
        return self._recent

    def draft(self) -> tuple[float, float, float, float, int] | None:
        if self._depth >= self.cap:
            raise ValueError(f"this round is already {self._depth} {'levels' if self.tree else 'tokens'} deep, its cap")
        features = self._features[self._start + self._t][self._depth]
        self._depth += 1
        return (*features, 0)

    def _end_round(self, size: int, accepted: int, copy_steps: int = 0, copy_forwards: int = 0) -> Cycle:
        """Emit the accepted tokens plus one (fewer at the end of the output), time the round (``copy_steps``
        of its steps were the copy drafter's, which read ``copy_forwards`` tokens), move on."""
        depth = self._depth
        emitted = min(accepted + 1, self._length - self._t)
        context = self._prompt_length + self._t
        last_emitted = self._recent[-1] + 1 if self._recent else None  # what the draft reads before its first step
        draft_seconds = self.profile.round_drafting_seconds(context, depth, last_emitted, self.tree, copy_steps)
        if copy_forwards:
            draft_seconds += copy_forwards * self.profile.copy_seconds(context)
        cycle = Cycle(
            drafted=depth,
            verified=size,
            accepted=accepted,
            emitted=emitted,
            draft_seconds=draft_seconds,
            verify_seconds=self.profile.round_verifying_seconds(context, size, self.tree),
        )
        self._t += emitted
        self._depth = 0
        self._recent.append(accepted)
        return cycle


class ReplayBackend(TraceReplay):
    """Replays :class:`TraceSet` generations; ``max_depth`` defaults to the traces' K. ``copy=False`` replays
    a decoder without the copy drafter even where the traces hold its chains (no source choice, no cost of
    reading the context with it)."""

    def __init__(self, traces: TraceSet, profile: CostProfile, max_depth: int | None = None, copy: bool = True) -> None:
        if len(traces) == 0:
            raise ValueError("the trace set is empty")
        self.max_depth = traces.depth if max_depth is None else max_depth
        if not 1 <= self.max_depth <= traces.depth:
            raise ValueError(f"max_depth must lie in 1..{traces.depth} (the traces' K), got {max_depth}")
        if self.max_depth > profile.max_verify:
            raise ValueError(f"the profile times verifications of up to {profile.max_verify} tokens, max_depth is {self.max_depth}")
        self._setup(traces, profile)
        self._match = traces.match.tolist()  # Python ints: faster to index one at a time than numpy
        self._accept = traces.accept_prob.tolist() if traces.sampled else None
        self._rejecting = traces.reject_features.tolist() if traces.sampled else None
        self._rejected_at: int | None = None
        """Sampled traces: the step of this round whose proposal was rejected (None: none yet)."""
        self._rng = np.random.default_rng(0)
        self._after: tuple[list, list] | None = None
        if copy and traces.copy is not None and not traces.sampled:
            self.sources = SOURCES
            chains = traces.copy
            self._copy_match, self._copy_available = chains.match.tolist(), chains.available.tolist()
            self._copy_features, self._copy_lengths = chains.features.tolist(), chains.lengths.tolist()
            if chains.after_match is not None:  # a head's chain after a round's copied tokens, per position
                self._after = (chains.after_match.tolist(), chains.after_features.tolist())
        self._source = "model"
        self._exhausted = False
        """The round's drafter ran out of proposals: its cap is its depth."""

    def start_prompt(self, index: int, rng: np.random.Generator | None = None) -> None:
        """Begin replaying prompt ``index``; ``rng`` draws the acceptances of sampled traces (default: seeded by ``index``)."""
        self._rng = rng if rng is not None else np.random.default_rng(index)
        self._rejected_at = None
        super().start_prompt(index)

    @property
    def match_length(self) -> int:
        """m(t) of the current position: what an oracle would know (greedy traces only)."""
        if self._accept is not None:
            raise ValueError("sampled (T > 0) traces have no match lengths: the oracle needs greedy traces")
        return self._match[self._start + self._t]

    @property
    def cap(self) -> int:
        return self._depth if self._exhausted else super().cap

    @property
    def copy_match(self) -> int:
        if len(self.sources) == 1:
            return 0
        i = self._start + self._t
        return self._copy_lengths[i][0] if self._copy_available[i] else 0

    @property
    def copy_first(self) -> tuple[float, float]:
        if len(self.sources) == 1:
            return (0.0, 0.0)
        i = self._start + self._t
        return tuple(self._copy_features[i][0][:2]) if self._copy_available[i] else (0.0, 0.0)

    def choose_source(self, source: str) -> None:
        super().choose_source(source)
        self._source = source

    def draft(self) -> tuple[float, float, float, float, int] | None:
        if self._source != "model":
            return self._draft_with_copy()
        if self._accept is None:
            return super().draft()
        if self._depth >= self.cap:
            raise ValueError(f"this round is already {self._depth} tokens deep, its cap")
        step, position = self._depth, self._t + self._depth
        if self._rejected_at is None and position < self._length and self._rng.random() >= self._accept[self._start + position]:
            self._rejected_at = step
        self._depth += 1
        if self._rejected_at is None:
            return (*self._features[self._start + self._t][step], 0)
        return (*self._rejecting[self._start + self._t + self._rejected_at][step - self._rejected_at], 0)

    def _draft_with_copy(self) -> tuple[float, float, float, float, int] | None:
        """A step of a copy or copy+model round: the copy drafter's chain at t while it has proposals, then
        (copy+model) the model's chain at t + a, a the copy drafter's proposals (a head's: its chain after them)."""
        if self._depth >= self.cap:
            raise ValueError(f"this round is already {self._depth} tokens deep, its cap")
        i, step = self._start + self._t, self._depth
        available = self._copy_available[i]
        if step < available:
            self._depth += 1
            return (*self._copy_features[i][step], self._copy_lengths[i][step])
        if self._source == "copy" or self._t + available >= self._length:
            self._exhausted = True
            return None
        self._depth += 1
        return (*self._chain_after_copies(i, available)[1][step - available], 0)

    def _chain_after_copies(self, i: int, available: int) -> tuple[int, list]:
        """The model's chain (match, step features) in a copy+model round at flat position i after the copy
        drafter's ``available`` proposals: a head's own chain after them where it was recorded (all copied
        tokens matched), else the model's chain at i + available."""
        if self._after is not None and 0 < available == self._copy_match[i]:
            return self._after[0][i], self._after[1][i]
        return self._match[i + available], self._features[i + available]

    def lookahead(self, source: str, depth: int) -> Cycle:
        """The round that drafting ``depth`` tokens with ``source`` (fewer if it runs out) and verifying them
        all would give here, without moving on: what an oracle weighs (greedy traces, at a round's start)."""
        if self._accept is not None:
            raise ValueError("sampled (T > 0) traces draw their acceptances: an oracle needs greedy traces")
        if self._depth:
            raise ValueError(f"a lookahead starts a round; this one is already {self._depth} tokens deep")
        saved = (self._t, list(self._recent), self._source, self._exhausted)
        self.choose_source(source)
        while self._depth < depth and self.draft() is not None:
            pass
        cycle = self.verify(self._depth)
        (self._t, self._recent, self._source, self._exhausted), self._depth = saved, 0
        return cycle

    def verify(self, size: int) -> Cycle:
        depth = self._depth
        if not verifiable(size, depth):
            raise ValueError(f"cannot verify {size} of {depth} drafted tokens")
        i = self._start + self._t
        copy_steps = copy_forwards = 0
        if len(self.sources) > 1:  # a decoder with a copy drafter reads the context with it every round
            copy_steps = min(depth, self._copy_available[i]) if self._source != "model" else 0
            copy_forwards = max(1, copy_steps + (self._exhausted or (self._source == "copy+model" and depth > copy_steps)))
        if self._source != "model":
            available, copied = self._copy_available[i], self._copy_match[i]
            if size <= available or copied < available:
                accepted = min(size, copied)
            else:
                accepted = available + min(size - available, self._chain_after_copies(i, available)[0])
        elif self._accept is None:
            accepted = min(size, self._match[i])
        else:
            accepted = size if self._rejected_at is None else min(size, self._rejected_at)
            self._rejected_at = None
        self._source, self._exhausted = "model", False
        return self._end_round(size, accepted, copy_steps, copy_forwards)
