"""Play a :class:`~adaptive.policy.DraftPolicy` (a baseline, the oracle, a loaded policy) through an environment."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adaptive.policy import DraftPolicy
from envs.backend import Backend, Cycle
from envs.env import DEFAULT_DECISION_SECONDS, SpecDecodeEnv


@dataclass(frozen=True)
class Episode:
    """One generation played by a policy."""

    prompt: int
    cycles: tuple[Cycle, ...]
    seconds: float
    """Draft + verify + policy seconds of all cycles."""

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
) -> list[Episode]:
    """Generate for each prompt index with ``policy`` deciding depth (and, as partner, verification size)."""
    env = SpecDecodeEnv(backend, "depth", partner=policy, decision_seconds=decision_seconds, episode="generation")
    episodes = []
    for prompt in prompts:
        env.reset(options={"prompt": prompt})
        terminated = backend.done
        while not terminated:
            action = int(policy.should_continue(env.draft_state()))
            _, _, terminated, _, _ = env.step(action)
        cycles = tuple(env.episode_cycles)
        episodes.append(Episode(prompt, cycles, env.episode_seconds))
    return episodes
