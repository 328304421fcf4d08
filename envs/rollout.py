"""Play a :class:`~adaptive.policy.DraftPolicy` (a baseline, the oracle, a loaded policy) through an environment."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adaptive.policy import DraftPolicy
from envs.backend import Backend, Cycle
from envs.env import DEFAULT_DECISION_SECONDS, SpecDecodeEnv, replay_decision_seconds


@dataclass(frozen=True)
class RoundView:
    """What the policy saw when it ended a round, and what came of it."""

    position: int
    """Tokens generated before the round."""
    first_top1: float
    """The draft's top-1 probability at the round's first step (NaN for a round run without drafting)."""
    drafted: int
    accepted: int


@dataclass(frozen=True)
class Episode:
    """One generation played by a policy."""

    prompt: int
    cycles: tuple[Cycle, ...]
    seconds: float
    """Draft + verify + policy seconds of all cycles."""
    views: tuple[RoundView, ...] = ()

    @property
    def tokens(self) -> int:
        return sum(c.emitted for c in self.cycles)

    @property
    def throughput(self) -> float:
        """Tokens per second of the generation (prefill excluded)."""
        return self.tokens / self.seconds


def run_policy(
    backend: Backend,
    policy: DraftPolicy,
    prompts: Sequence[int],
    decision_seconds: float = DEFAULT_DECISION_SECONDS,
    seed: int | None = None,
) -> list[Episode]:
    """Generate for each prompt index with ``policy`` deciding depth (and, as partner, verification size), each
    decision charged :func:`~envs.env.replay_decision_seconds` (``decision_seconds`` unless the policy is a rule);
    ``seed`` draws each generation's randomness (sampled replay) from (seed, prompt) instead of the prompt alone."""
    charged = replay_decision_seconds(policy, decision_seconds)
    env = SpecDecodeEnv(backend, "depth", partner=policy, decision_seconds=charged, episode="generation", observe=False)  # policies read draft_state()
    episodes = []
    for prompt in prompts:
        env.reset(seed=seed, options={"prompt": prompt})
        views: list[RoundView] = []
        _view_new_cycles(env.episode_cycles, views, float("nan"))
        terminated = backend.done
        while not terminated:
            state = env.draft_state()
            _, _, terminated, _, _ = env.step(int(policy.should_continue(state)))
            _view_new_cycles(env.episode_cycles, views, state.steps[0].top1_prob if state.steps else float("nan"))
        episodes.append(Episode(prompt, tuple(env.episode_cycles), env.episode_seconds, tuple(views)))
    return episodes


def _view_new_cycles(cycles: list[Cycle], views: list[RoundView], confidence: float) -> None:
    """Append a view of each cycle not yet viewed: the first is the round just decided (seen with
    ``confidence``), later ones ran without a decision (cap 0)."""
    if len(cycles) == len(views):
        return
    position = sum(c.emitted for c in cycles[: len(views)])
    for cycle in cycles[len(views) :]:
        views.append(RoundView(position, confidence, cycle.drafted, cycle.accepted))
        position += cycle.emitted
        confidence = float("nan")
