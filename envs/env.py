"""One Gymnasium environment for both decisions of speculative decoding, over any backend.

**Episode** (``episode=``): ``"cycle"`` (default) — one draft-and-verify cycle; ``reset()`` moves on to the
next round of the same generation (a new generation, i.e. prompt, once it ends, or whenever a seed or a
prompt is given). The return of an episode is then exactly the cycle's throughput, and for a fixed depth
the cycle's time is fixed, so maximising the expected return maximises E[tokens] / time — the cost model's
S. ``"generation"`` — one whole generation; the return then sums per-cycle throughputs, which favours
many short cycles over fewer, faster-per-token ones (measured: PPO on it collapses to depth 1 where
depth 3 is optimal), so use it for rollouts and evaluation, not for training.

**Decisions** (``decision=``):

* ``"depth"``: an action after every draft step, ``Discrete(2)``: 0 = stop and verify, 1 = draft another
  token. The first token of a round is always drafted (the decoder's contract), and a round that reaches
  its depth cap is verified without asking. The verification size comes from the frozen ``partner``
  policy (default: verify everything drafted).
* ``"size"``: one action per round, after drafting, ``Discrete(backend.max_size)``: action a verifies a + 1
  drafted tokens — tree nodes on a tree backend — clipped to what the round can verify (``info["clipped"]``
  says when). The depth comes from the frozen ``partner`` (default: draft to the cap). A round that can
  verify only one token is verified without asking. In depth decisions on a tree backend, the size comes
  from the partner only if it sizes trees (a policy trained there); otherwise it is the tree shape's V.
* ``"source"`` (a backend with a copy drafter beside the model): one action per round, before drafting,
  ``Discrete(len(backend.sources))``: what drafts the round (:data:`~adaptive.policy.SOURCES`: the model,
  the copy drafter, the copy drafter then the model). Depth and size come from the ``partner`` (default:
  draft to the cap, verify everything). In depth and size decisions on such a backend the partner picks
  the source (default: the model). A round whose drafter has nothing to propose is a plain target step.

**Reward**: the throughput of each draft-and-verify cycle, emitted tokens / (draft + verify + policy
seconds), expressed in units of plain decoding — multiplied by the profiled seconds of one plain target
step, so 1.0 means "as fast as the target alone" and 2.0 twice as fast. Depth decisions are credited as in
Learning to Draft: 0 for every "continue", the cycle's throughput at the step that ends the cycle. Each
cycle is a complete measurement of one choice (how deep to go), so crediting it at the stop keeps the
reward exactly the quantity we want and leaves credit assignment inside the round to the discount
(PPO with γ close to 1). Policy seconds are ``decision_seconds`` per decision the agent takes (a learned
MLP's cost with the draft features it reads, measured in the decoder), not the agent's own Python time; a
partner's decisions cost what :func:`replay_decision_seconds` says (a rule that reads no per-step features:
nothing, as live).

**Observation**: :mod:`adaptive.observation` (versioned, fixed size for a given ``max_depth``; the copy
drafter's signals too on a backend with a copy drafter; :func:`observation_schema` picks the version).

``info`` after a cycle holds the last cycle's ``drafted``, ``verified``, ``accepted``, ``emitted``,
``draft_seconds``, ``verify_seconds``, ``policy_seconds`` and ``throughput`` (tokens/s), ``cycles`` (cycles
completed in the step: more than one when rounds were decided automatically, e.g. at a depth cap of 1) and
the episode's running ``episode_tokens`` and ``episode_seconds``; between cycles it is ``{"cycles": 0}``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from adaptive.costmodel import throughput_speedup
from adaptive.observation import BOUND, RECENT, SCHEMA_VERSION, TREE_VERSION, VERSIONS, ObservationBuilder, ObservationSchema
from adaptive.policy import DraftPolicy, DraftState, DraftStep, RoundStats, verifiable
from envs.backend import Backend, Cycle

DECISIONS = ("depth", "size", "source")
EPISODES = ("cycle", "generation")
DEFAULT_DECISION_SECONDS = 1e-4
"""Cost charged per learned decision: a 64x64 MLP measured 47 µs per decision inside the decoder
(benchmarks/policy_overhead.py, observation included), plus about 50 µs of draft features per step."""


def replay_decision_seconds(policy: DraftPolicy | None, configured: float) -> float:
    """Seconds a replayed round charges per decision of ``policy``: its declared ``decision_seconds`` (a rule's:
    :data:`~adaptive.policy.RULE_DECISION_SECONDS`), else ``configured`` (a learned policy's decision and the
    draft features it reads at each step)."""
    declared = getattr(policy, "decision_seconds", None)
    return configured if declared is None else float(declared)


def observation_schema(backend: Backend, version: int | None = None) -> ObservationSchema:
    """The observation layout of an environment over ``backend``: schema ``version``, or (None) the newest one
    the backend can show — version 5 with a draft tree's node scores, version 4 with the steps' margins, else
    (replay of traces recorded before margins were) version 3 with the copy drafter's fields or 1 without. An
    explicit version the backend cannot show is refused."""
    copy = len(backend.sources) > 1
    if version == TREE_VERSION or (version is None and backend.shows_tree_scores and backend.shows_margins):
        if not backend.shows_tree_scores:
            raise ValueError(
                f"observation schema version {TREE_VERSION} shows the draft tree's node scores, which this backend lacks (tree traces "
                "recorded before tree trace format 3, or chains): re-record them with adaptive record --tree, or use version 4"
            )
        return ObservationSchema(backend.max_depth, version=TREE_VERSION, tree=True)
    if version is None:
        version = SCHEMA_VERSION if backend.shows_margins else max(v for v in VERSIONS[copy] if v < SCHEMA_VERSION)
    schema = ObservationSchema(backend.max_depth, copy=copy, version=version)
    if schema.shows_margins and not backend.shows_margins:
        raise ValueError(
            f"observation schema version {version} shows each draft step's margin, which these traces lack (recorded "
            f"before trace format 3): re-record them with adaptive record, or use version {max(VERSIONS[copy][:-1])}"
        )
    return schema


class SpecDecodeEnv(gym.Env):
    """Speculative decoding as a Gymnasium environment; see the module docstring."""

    metadata = {"render_modes": []}

    def __init__(
        self,
        backend: Backend,
        decision: str = "depth",
        partner: DraftPolicy | None = None,
        decision_seconds: float = DEFAULT_DECISION_SECONDS,
        episode: str = "cycle",
        schema_version: int | None = None,
        observe: bool = True,
    ) -> None:
        """``observe=False``: no observation vectors are built (each is zeros), for drivers that show policies
        :meth:`draft_state` instead, as replay rollouts do (a fifth of their time)."""
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {DECISIONS}, got {decision!r}")
        if episode not in EPISODES:
            raise ValueError(f"episode must be one of {EPISODES}, got {episode!r}")
        if decision_seconds < 0:
            raise ValueError(f"decision_seconds must be >= 0, got {decision_seconds}")
        self.backend = backend
        self.decision = decision
        self.partner = partner
        self.decision_seconds = decision_seconds
        self.partner_decision_seconds = replay_decision_seconds(partner, decision_seconds)
        """What each of the partner's decisions costs: a rule's own (nothing), else ``decision_seconds``."""
        self.episode = episode
        self._cycle_over = False
        if decision == "source" and len(backend.sources) == 1:
            raise ValueError("source decisions need a backend with a copy drafter beside the model (traces recorded with --copy)")
        self.schema = observation_schema(backend, schema_version)
        self._builder = ObservationBuilder(self.schema, backend.c, backend.g) if observe else None
        self.observation_space = gym.spaces.Box(-BOUND, BOUND, (self.schema.size,), np.float32)
        self._blank = np.zeros(self.schema.size, np.float32)
        self.action_space = gym.spaces.Discrete({"depth": 2, "size": backend.max_size, "source": len(backend.sources)}[decision])
        self._steps: list[DraftStep] = []
        self._source = "model"
        self._policy_seconds = 0.0
        self._reward = 0.0
        self._info: dict[str, Any] = {"cycles": 0}
        self.episode_tokens = 0
        self.episode_seconds = 0.0
        self.episode_cycles: list[Cycle] = []
        """Every cycle of the current generation, including those decided automatically."""

    # --- Gymnasium API -------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        prompt = options.get("prompt") if options else None
        if self.episode == "cycle" and self._cycle_over and seed is None and prompt is None:
            self._cycle_over = False
            self._begin_round()  # the next round of the current generation
            if not self.backend.done:
                return self._observation(), {}
        for _ in range(100):  # a generation that ends without any decision is skipped (unless one was asked for)
            if self.partner is not None:
                self.partner.reset()
            if prompt is not None:  # with seed, the generation's randomness (sampled replay) is seeded by (seed, prompt)
                self.backend.start_prompt(int(prompt), None if seed is None else np.random.default_rng((seed, int(prompt))))
            else:
                self.backend.start(self.np_random)
            self._cycle_over = False
            self._reward, self._info = 0.0, {"cycles": 0}
            self.episode_tokens, self.episode_seconds = 0, 0.0
            self.episode_cycles = []
            self._begin_round()
            if not self.backend.done or prompt is not None:
                return self._observation(), {}
        raise RuntimeError("100 generations in a row ended without a decision to make; are the prompts' budgets >= 2?")

    def step(self, action) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.backend.done or self._cycle_over:
            raise RuntimeError("the episode is over: call reset()")
        action = int(action)
        if not 0 <= action < self.action_space.n:
            raise ValueError(f"action {action} is outside {self.action_space}")
        self._reward, self._info = 0.0, {"cycles": 0}
        self._policy_seconds += self.decision_seconds
        if self.decision == "depth":
            if action == 1:
                self._draft()
                if len(self._steps) < self.backend.cap:
                    return self._observation(), 0.0, False, False, self._info
            self._finish_round(self._partner_size())
        elif self.decision == "source":
            self._set_source(self.backend.sources[action])
            self._open_round()
        else:
            size = min(action + 1, self.backend.verifiable(len(self._steps)))
            self._finish_round(size)
            self._info["clipped"] = action + 1 != size
        if self.episode == "cycle":
            self._cycle_over = True
            return self._observation(), self._reward, True, False, self._info
        if not self.backend.done:
            self._begin_round()
        return self._observation(), self._reward, self.backend.done, False, self._info

    def close(self) -> None:
        self.backend.close()

    # --- what policies need ----------------------------------------------------------------------------

    def draft_state(self) -> DraftState:
        """The decision-time state as the decoder would show it to a :class:`DraftPolicy`."""
        backend = self.backend
        ranked, level_mass = backend.tree_view() if backend.shows_tree_scores and self._steps else ((), ())
        return DraftState(
            backend.context_length,
            tuple(self._steps),
            backend.cap,
            tuple(backend.recent[-RECENT:]),
            backend.copy_match,
            self._source,
            backend.generated,
            backend.copy_first,
            ranked,
            level_mass,
        )

    # --- internals -------------------------------------------------------------------------------------

    def _observation(self) -> np.ndarray:
        if self._builder is None:
            return self._blank
        return self._builder.build(len(self._steps), self.backend.cap, self.backend.context_length, self.backend.generated)

    def _draft(self) -> None:
        """One draft step (none when the round's drafter has nothing more to propose: its cap drops)."""
        drafted = self.backend.draft()
        if drafted is None:
            return
        top1, entropy, log_prob, margin, match = drafted
        cumulative = (self._steps[-1].cumulative_log_prob if self._steps else 0.0) + log_prob
        self._steps.append(DraftStep(-1, top1, entropy, log_prob, cumulative, match, margin))
        if self._builder is not None:
            self._builder.add_step(len(self._steps), top1, entropy, cumulative, match, margin)
            if self.schema.tree:
                self._builder.set_tree(*self.backend.tree_view())

    def _begin_round(self) -> None:
        """Start rounds until one needs a decision (or the generation ends)."""
        backend = self.backend
        while not backend.done:
            self._steps = []
            self._policy_seconds = 0.0
            self._source = "model"
            if self._builder is not None:
                self._builder.new_round(backend.recent, "model", backend.copy_match, backend.copy_first)
            if backend.cap == 0:  # one token left in the budget: a plain target step
                self._finish_round(0)
                continue
            if self.decision == "source":
                return
            self._set_source(self._partner_source())
            if self._open_round():
                return

    def _open_round(self) -> bool:
        """Draft the round once its source is set: its first step, and the rest where the partner decides
        the depth. True when the round waits for a decision; otherwise it is finished."""
        backend = self.backend
        self._draft()
        if not self._steps:  # the round's drafter had nothing to propose: a plain target step
            self._finish_round(0)
            return False
        if self.decision == "depth":
            if len(self._steps) < backend.cap:
                return True
            self._finish_round(self._partner_size())
            return False
        while len(self._steps) < backend.cap and self._partner_continues():
            self._draft()
        if self.decision == "source":
            self._finish_round(self._partner_size())
            return False
        if backend.verifiable(len(self._steps)) > 1:
            return True
        self._finish_round(1)
        return False

    def _partner_source(self) -> str:
        """What the partner has draft the round (the model without a partner or a copy drafter)."""
        if len(self.backend.sources) == 1 or self.partner is None:
            return "model"
        self._policy_seconds += self.partner_decision_seconds
        return self.partner.source(self.draft_state())

    def _set_source(self, source: str) -> None:
        self._source = source
        if len(self.backend.sources) > 1:
            self.backend.choose_source(source)
            if self._builder is not None:
                self._builder.new_round(self.backend.recent, source, self.backend.copy_match, self.backend.copy_first)

    def _partner_continues(self) -> bool:
        if self.partner is None:
            return True
        self._policy_seconds += self.partner_decision_seconds
        return bool(self.partner.should_continue(self.draft_state()))

    def _partner_size(self) -> int:
        depth = len(self._steps)
        sizes_trees = getattr(self.partner, "sizes_trees", False)
        if self.partner is None or (self.backend.tree and not sizes_trees):
            return self.backend.default_size(depth)  # no partner, or a chain policy's sizes on a tree backend
        self._policy_seconds += self.partner_decision_seconds
        size = int(self.partner.verify_size(self.draft_state()))
        if self.backend.tree:
            return max(1, min(size, self.backend.verifiable(depth)))
        if not verifiable(size, depth):
            raise ValueError(f"partner {self.partner.name!r} asked to verify {size} of {depth} drafted tokens")
        return size

    def _finish_round(self, size: int) -> None:
        context_length = self.backend.context_length
        cycle = self.backend.verify(size)
        policy_seconds = self._policy_seconds
        seconds = cycle.draft_seconds + cycle.verify_seconds + policy_seconds
        self._reward += throughput_speedup(cycle.emitted, seconds, self.backend.target_step_seconds)
        cycles = self._info["cycles"] + 1
        self.episode_cycles.append(cycle)
        self.episode_tokens += cycle.emitted
        self.episode_seconds += seconds
        self._info = {
            "cycles": cycles,
            "drafted": cycle.drafted,
            "verified": cycle.verified,
            "accepted": cycle.accepted,
            "emitted": cycle.emitted,
            "draft_seconds": cycle.draft_seconds,
            "verify_seconds": cycle.verify_seconds,
            "policy_seconds": policy_seconds,
            "throughput": cycle.emitted / seconds,
            "episode_tokens": self.episode_tokens,
            "episode_seconds": self.episode_seconds,
        }
        if self.partner is not None:
            self.partner.observe(_round_stats(cycle, policy_seconds, context_length))
        self._policy_seconds = 0.0


def _round_stats(cycle: Cycle, policy_seconds: float, context_length: int) -> RoundStats:
    return RoundStats(
        context_length=context_length,
        drafted=cycle.drafted,
        verified=cycle.verified,
        accepted=cycle.accepted,
        emitted=cycle.emitted,
        tokens=(),
        draft_time=cycle.draft_seconds,
        verify_time=cycle.verify_seconds,
        policy_time=policy_seconds,
        forward_time=cycle.draft_seconds + cycle.verify_seconds,
    )
