"""Batched decoding under a changing load, replayed: the environment a load-aware batch policy learns in.

Closed-loop clients: at any time ``concurrency`` requests are in flight (a finished one is replaced by a new
prompt drawn from the traces); between rounds the concurrency switches, with probability ``switch_prob``, to
another of ``loads``. Each round the agent picks one depth d (``Discrete(max_depth + 1)``, 0: a plain batched
step); every request at its position t accepts min(d, m(t)) tokens of its recorded greedy trace and emits that
plus one — exactly what the batched decoder does with the same pair under greedy decoding. The round takes
:meth:`~adaptive.batch_profile.BatchCostProfile.round_ms` (B, d) of the batched cost profile.

Reward: the round's throughput over plain batched decoding's at the same batch size,
(Σ emitted / round time) / (B / plain step time): 1.0 is as fast as plain, so rewards at different loads
are on one scale. With a latency target ``slo_tpot_ms``, the round's goodput instead: only the tokens of
requests whose time per token in this round (round time / tokens it emitted) meets the target count — the
per-round form of the load test's goodput, which counts requests whose time per output token meets it.
A deep draft at a high load makes long rounds, and a request that accepts little in one then misses the
target: SmartSpec's goodput objective (arXiv 2406.14066) with a latency bound.

A learned policy's decisions take time live (its observation and forward; per step, the draft's top-1
probabilities too: the load test's "policy µs/round"). With ``decision_ms`` each round is charged that many
milliseconds per decision — per round the agent's one, per step each time it is asked; a judged policy's as
:meth:`BatchReplayEnv.play` asks it, nothing for rules (:func:`charges_decisions`) — as the single-request
environments charge ``decision_seconds``: a stop that saves less than the decisions cost does not pay.

With a ``cap`` (a batch policy, e.g. a per-batch-size schedule), an action deeper than the cap's depth runs at
the cap's depth: a policy trained so never drafts deeper than the cap and learns where to draft less.
For judging, :meth:`BatchReplayEnv.oracle_depth` is the replay-only myopic oracle (each round's best depth,
knowing every request's match length), and :meth:`BatchReplayEnv.policy_depth` plays any batch policy's
round, a stepped one's per-step answers included (:meth:`BatchReplayEnv.play` plays that round). Observation: :mod:`adaptive.batch_observation`. Episodes
last ``rounds`` rounds (truncated; the load and the requests carry on across resets only through the random
generator). ``reset(options={"load": c, "requests": [...]})`` replays a fixed stream instead, as a load test
sends it: closed-loop clients take the given trace indices in order, and the episode ends (terminated) when the
last of them has finished.

**Per step** (``stepwise=True``, observation version 2): the agent is asked before each draft step whether
the batch drafts one more token (``Discrete(2)``: 1 = draft, 0 = verify now), seeing the draft's top-1
probabilities of the round's steps so far — recorded in the traces along the draft's own greedy
continuation, as the live decoder computes them. A round that reaches the depth bound (``max_depth``, or the
cap's depth) is verified without asking. Rewards as in Learning to Draft: 0 for every "draft", the round's
reward when it is verified, and the round ends the episode (the clients, their requests and the load carry
on into the next one), so an episode's return is exactly its round's throughput over plain's — the
objective per round of the per-round mode, with nothing lost to discounting inside the round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from adaptive.batch_observation import BatchObservationSchema
from adaptive.batch_profile import BatchCostProfile
from adaptive.policy import RECENT_ROUNDS, BatchDraftStep, BatchPolicy, BatchState, asks_each_step
from adaptive.traces import TraceSet


def charges_decisions(policy: BatchPolicy) -> bool:
    """Whether replay charges ``policy``'s decisions: a learned one's, not a rule's (rules declare
    ``decision_seconds``, :data:`~adaptive.policy.RULE_DECISION_SECONDS`; wrappers pass the inner policy's on)."""
    return getattr(policy, "decision_seconds", None) is None


@dataclass
class _Request:
    prompt: int
    t: int = 0
    accepted: list[int] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)


class BatchReplayEnv(gym.Env):
    """See the module docstring."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        traces: TraceSet,
        profile: BatchCostProfile,
        loads: tuple[int, ...] = (1, 2, 4, 8),
        switch_prob: float = 0.02,
        max_depth: int = 6,
        rounds: int = 256,
        slo_tpot_ms: float | None = None,
        cap: BatchPolicy | None = None,
        stepwise: bool = False,
        decision_ms: float = 0.0,
    ) -> None:
        if traces.sampled:
            raise ValueError("batched replay needs greedy traces (match lengths); these are sampled")
        if not 1 <= max_depth <= min(traces.depth, profile.max_depth):
            raise ValueError(f"max_depth must lie in 1..{min(traces.depth, profile.max_depth)} (the traces' K and the profile's depth), got {max_depth}")
        if not loads or any(not profile.batch_sizes[0] <= c <= profile.batch_sizes[-1] for c in loads):
            raise ValueError(f"loads must lie within the profile's batch sizes {profile.batch_sizes[0]}..{profile.batch_sizes[-1]}, got {loads}")
        if not 0.0 <= switch_prob <= 1.0:
            raise ValueError(f"switch_prob must lie in [0, 1], got {switch_prob}")
        if slo_tpot_ms is not None and not slo_tpot_ms > 0:
            raise ValueError(f"slo_tpot_ms must be a positive number of milliseconds (or None: throughput), got {slo_tpot_ms}")
        if not decision_ms >= 0:
            raise ValueError(f"decision_ms must be >= 0 milliseconds per decision, got {decision_ms}")
        self.slo_tpot_ms, self.cap, self.decision_ms = slo_tpot_ms, cap, decision_ms
        self.traces, self.profile, self.loads, self.switch_prob = traces, profile, tuple(loads), switch_prob
        self.max_depth, self.rounds, self.stepwise = max_depth, rounds, stepwise
        self.schema = BatchObservationSchema(max_depth, 2 if stepwise else 1)
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (self.schema.size,), np.float32)
        self.action_space = gym.spaces.Discrete(2 if stepwise else max_depth + 1)
        self._match = traces.match.tolist()
        self._top1 = traces.features[..., 0].astype(np.float64)
        self._drafted = 0
        """Per step: tokens drafted in the round under way."""
        self._asked = 0
        """Per step: decisions asked of the agent in the round under way."""
        self._offsets = traces.offsets.tolist()
        self.concurrency = loads[0]
        self.batch: list[_Request] = []
        self._stream: list[int] | None = None
        """A fixed request stream's trace indices still to send (None: random requests)."""
        self._round = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        fresh = seed is not None or options is not None or not self.stepwise or not self.batch
        super().reset(seed=seed)
        self._drafted = self._asked = 0
        if fresh:  # per step, an episode is one round: the clients carry on unless told otherwise
            self.concurrency = int(self.np_random.choice(self.loads)) if options is None or "load" not in options else int(options["load"])
            self._stream = self._checked_stream(options.get("requests")) if options is not None else None
            self.batch = []
            self._fill()
            self._round = 0
        return self._observation(), {"batch": len(self.batch)}

    def state(self) -> BatchState:
        """What a batch policy would be shown now."""
        return BatchState(
            len(self.batch),
            0,
            self.max_depth,
            tuple(tuple(r.accepted[-RECENT_ROUNDS:]) for r in self.batch),
            tuple(tuple(r.drafted[-RECENT_ROUNDS:]) for r in self.batch),
        )

    def draft_step(self, drafted: int) -> BatchDraftStep:
        """What the round's draft shows after ``drafted`` steps: each request's recorded top-1 probabilities."""
        return BatchDraftStep(drafted, tuple(tuple(self._top1[self._offsets[r.prompt] + r.t, :drafted].tolist()) for r in self.batch))

    def policy_depth(self, policy: BatchPolicy) -> int:
        """The depth ``policy`` plays this round: its :meth:`~adaptive.policy.BatchPolicy.depth`, cut where a
        stepped policy stops after a draft step, as the live decoder asks it."""
        return self._policy_round(policy)[0]

    def play(self, policy: BatchPolicy) -> tuple[np.ndarray, float, bool, bool, dict]:
        """One round (per-round mode) as ``policy`` plays it (:meth:`policy_depth`), charged the decisions asked of
        it where it is a learned policy (:func:`charges_decisions`): what :meth:`step` returns."""
        if self.stepwise:
            raise ValueError("play judges a policy a round at a time: use an environment made with stepwise=False")
        depth, asked = self._policy_round(policy)
        return self._play(self._allowed(depth), asked if charges_decisions(policy) else 0)

    def _policy_round(self, policy: BatchPolicy) -> tuple[int, int]:
        """The depth ``policy`` plays this round and the decisions the live decoder asks of it on the way."""
        state = self.state()
        depth = policy.depth(state)
        if asks_each_step(policy):
            for drafted in range(1, depth):
                if not policy.should_continue(state, self.draft_step(drafted)):
                    return drafted, drafted + 1
            return depth, max(depth, 1)
        return depth, 1

    def oracle_depth(self, cap: int) -> int:
        """Replay only, the myopic oracle: of depths 0..``cap``, the one whose round emits the most tokens per
        second (counted as the reward counts them), knowing every request's match length (ties: the shallower)."""

        def rate(depth: int) -> float:
            round_ms = self.profile.round_ms(len(self.batch), depth)
            return sum(self._counted(self._tokens(r, depth), round_ms) for r in self.batch) / round_ms

        return max(range(min(cap, self.max_depth) + 1), key=lambda depth: (rate(depth), -depth))

    def step(self, action) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.stepwise:
            return self._decide_step(int(action))
        return self._play(self._allowed(int(action)), 1)

    def _allowed(self, depth: int) -> int:
        """``depth`` checked, and cut at the cap's depth where there is a cap."""
        if not 0 <= depth <= self.max_depth:
            raise ValueError(f"depth must lie in 0..{self.max_depth}, got {depth}")
        return depth if self.cap is None else min(depth, self.cap.depth(self.state()))

    def _decide_step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Per step: draft one more token (1) or verify now (0); the round is played once verified."""
        if action not in (0, 1):
            raise ValueError(f"a per-step action is 0 (verify now) or 1 (draft one more token), got {action}")
        bound = self.max_depth if self.cap is None else min(self.max_depth, self.cap.depth(self.state()))
        self._asked += 1
        if action == 1 and self._drafted < bound:
            self._drafted += 1
            if self._drafted < bound:
                return self._observation(), 0.0, False, False, {"batch": len(self.batch), "drafted": self._drafted}
        depth, decisions, self._drafted, self._asked = min(self._drafted, bound), self._asked, 0, 0
        observation, reward, _, truncated, info = self._play(depth, decisions)  # the next round's observation, before its first step
        return observation, reward, True, truncated, info

    def _play(self, depth: int, decisions: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """One round of ``depth`` drafted tokens for the whole batch, ``decisions`` asked of a learned policy."""
        size = len(self.batch)
        round_ms = self.profile.round_ms(size, depth) + decisions * self.decision_ms
        seconds, plain = round_ms / 1e3, self.profile.round_ms(size, 0) / 1e3
        emitted = counted = 0
        tokens_per_request = []
        for request in self.batch:
            accepted = self._accepted(request, depth)
            tokens = self._tokens(request, depth)
            emitted += tokens
            tokens_per_request.append(tokens)
            counted += self._counted(tokens, round_ms)
            request.t += accepted + 1
            request.accepted.append(accepted)
            request.drafted.append(depth)
        reward = (counted / seconds) / (size / plain)
        self.batch = [r for r in self.batch if self._remaining(r) > 0]
        if self.np_random.random() < self.switch_prob:
            self.concurrency = int(self.np_random.choice(self.loads))
        self._fill()
        self._round += 1
        info = {
            "batch": size,
            "depth": depth,
            "emitted": emitted,
            "counted": counted,
            "seconds": seconds,
            "plain_seconds_per_token": plain / size,
            "tokens_per_request": tokens_per_request,
        }
        terminated = self._stream is not None and not self.batch
        return self._observation(), float(reward), terminated, self._round >= self.rounds, info

    def _accepted(self, request: _Request, depth: int) -> int:
        """Drafted tokens ``request`` accepts in a round of ``depth``: its recorded match length, cut at the depth."""
        return min(depth, self._match[self._offsets[request.prompt] + request.t])

    def _tokens(self, request: _Request, depth: int) -> int:
        """Tokens ``request`` emits in a round of ``depth``: its accepted run and one more, within its output."""
        return min(self._accepted(request, depth) + 1, self._remaining(request))

    def _counted(self, tokens: int, round_ms: float) -> int:
        """``tokens`` as the reward counts them: all, or with a latency target none when the round's time per
        token misses it."""
        return tokens if self.slo_tpot_ms is None or round_ms / tokens <= self.slo_tpot_ms else 0

    def _remaining(self, request: _Request) -> int:
        """Tokens of ``request``'s recorded output not yet emitted."""
        return self._offsets[request.prompt + 1] - self._offsets[request.prompt] - request.t

    def _fill(self) -> None:
        """Closed loop: new requests until ``concurrency`` are in flight (none leave early when it drops), the
        fixed stream's next ones while it lasts."""
        while len(self.batch) < self.concurrency:
            if self._stream is None:
                self.batch.append(_Request(int(self.np_random.integers(len(self.traces)))))
            elif self._stream:
                self.batch.append(_Request(self._stream.pop(0)))
            else:
                break

    def _checked_stream(self, requests) -> list[int] | None:
        """A fixed request stream's trace indices, checked (None: random requests)."""
        if requests is None:
            return None
        stream = [int(index) for index in requests]
        if not stream or any(not 0 <= index < len(self.traces) for index in stream):
            raise ValueError(f"requests must be a non-empty list of trace indices in 0..{len(self.traces) - 1}, got {requests}")
        return stream

    def _observation(self) -> np.ndarray:
        if not self.batch:  # a fixed stream's end: nothing left to observe
            return np.zeros(self.schema.size, np.float32)
        step = self.draft_step(self._drafted) if self.stepwise and self._drafted else None
        return np.clip(self.schema.observe(self.state(), self.profile, step), -10.0, 10.0)
