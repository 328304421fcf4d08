"""Live backend: the real :class:`~adaptive.decoder.SpeculativeDecoder`, timed by the wall clock.

Draft and verification seconds are the decoder's own measurements of each step (they include sampling,
acceptance test and cache rollback). Any sampling setting works; acceptances are whatever the models do.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from adaptive.decoder import SpeculativeDecoder
from adaptive.generation import Generation
from adaptive.profile import CostProfile
from envs.backend import Backend, Cycle


class LiveBackend(Backend):
    """Runs generations of ``prompts`` (token id lists) with ``decoder``; ``profile`` supplies c, g and the
    plain target step time used as the reward's unit."""

    def __init__(self, decoder: SpeculativeDecoder, prompts: Sequence[Sequence[int]], profile: CostProfile, max_new_tokens: int = 128) -> None:
        if not prompts:
            raise ValueError("the live backend needs at least one prompt")
        self.decoder = decoder
        self.prompts = [list(p) for p in prompts]
        self.max_depth = decoder.max_depth
        self.max_new_tokens = max_new_tokens
        self.c = profile.c
        self.g = profile.g
        self.target_step_seconds = profile.target_step_seconds
        self.num_prompts = len(self.prompts)
        self.prompt = 0
        self._generation: Generation | None = None
        self._seed = 0

    def start_prompt(self, index: int, rng: np.random.Generator | None = None) -> None:
        """Begin generating for prompt ``index`` (prefills both models); the sampling seed comes from ``rng``."""
        self.prompt = index
        seed = int(rng.integers(2**31)) if rng is not None else index
        self._generation = self.decoder.start(self.prompts[index], self.max_new_tokens, seed)

    @property
    def generation(self) -> Generation:
        if self._generation is None:
            raise RuntimeError("call start() first")
        return self._generation

    @property
    def done(self) -> bool:
        return self.generation.done

    @property
    def context_length(self) -> int:
        return len(self.generation.tokens)

    @property
    def generated(self) -> int:
        return len(self.generation.output.tokens)

    @property
    def cap(self) -> int:
        return self.generation.max_depth

    @property
    def recent(self) -> Sequence[int]:
        return self.generation.recent

    def draft(self) -> tuple[float, float, float, float, int] | None:
        step = self.generation.draft_step()
        return None if step is None else (step.top1_prob, step.entropy, step.log_prob, step.margin, step.match_length)

    def verify(self, size: int) -> Cycle:
        stats = self.generation.verify(size)
        return Cycle(stats.drafted, stats.verified, stats.accepted, stats.emitted, stats.draft_time, stats.verify_time)
