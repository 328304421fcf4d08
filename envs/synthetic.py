"""Synthetic backend: the seed article's cost model as an environment.

Each drafted token is accepted with probability α, independently, until the first rejection. α is either
constant or Markov-modulated: hidden regimes with their own α, switching between rounds with
``switch_prob`` (so that adapting to recent acceptances can pay). A draft step costs ``c`` target steps, a
verification of γ tokens ``g[γ]``. Step features are noisy readings of the current α (top-1 = α + noise,
entropy, log-probability and margin of a two-outcome distribution derived from it), standing in for a
draft's confidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from adaptive.costmodel import GCurve, verification_cost
from adaptive.policy import depth_cap, verifiable
from envs.backend import Backend, Cycle

SYNTHETIC_STEP_SECONDS = 0.05
"""The plain target step the synthetic backend times cycles in (only ratios to it matter)."""


class SyntheticBackend(Backend):
    """Cost-model environment backend with i.i.d. or Markov-modulated acceptance."""

    def __init__(
        self,
        alphas: float | Sequence[float] = 0.7,
        *,
        c: float = 0.05,
        g: GCurve = 1.0,
        switch_prob: float = 0.0,
        max_depth: int = 8,
        max_new_tokens: int = 256,
        prompt_length: int = 64,
        feature_noise: float = 0.1,
        target_step_seconds: float = SYNTHETIC_STEP_SECONDS,
    ) -> None:
        self.alphas = (float(alphas),) if isinstance(alphas, (int, float)) else tuple(float(a) for a in alphas)
        if not self.alphas or not all(0.0 <= a < 1.0 for a in self.alphas):
            raise ValueError(f"every alpha must lie in [0, 1), got {self.alphas}")
        if not 0.0 <= switch_prob <= 1.0:
            raise ValueError(f"switch_prob must lie in [0, 1], got {switch_prob}")
        if c < 0:
            raise ValueError(f"draft cost c must be >= 0, got {c}")
        self.g = [1.0 if gamma == 0 and isinstance(g, Mapping) and 0 not in g else verification_cost(g, gamma) for gamma in range(max_depth + 1)]
        self.c = c
        self.switch_prob = switch_prob
        self.max_depth = max_depth
        self.max_new_tokens = max_new_tokens
        self.prompt_length = prompt_length
        self.feature_noise = feature_noise
        self.target_step_seconds = target_step_seconds
        self.num_prompts = 2**31
        self._rng = np.random.default_rng(0)
        self._regime = 0
        self._generated = 0
        self._depth = 0
        self._match = 0
        self._recent: list[int] = []

    @property
    def alpha(self) -> float:
        """Acceptance probability of the current (hidden) regime."""
        return self.alphas[self._regime]

    def start_prompt(self, index: int, rng: np.random.Generator | None = None) -> None:
        """Begin a generation; synthetic "prompts" differ only in their random stream."""
        self._rng = rng if rng is not None else np.random.default_rng(index)
        self._regime = int(self._rng.integers(len(self.alphas)))
        self._generated = 0
        self._recent = []
        self._begin_round()

    def _begin_round(self) -> None:
        if len(self.alphas) > 1 and self._rng.random() < self.switch_prob:
            self._regime = int(self._rng.integers(len(self.alphas)))
        self._depth = 0
        self._match = 0
        while self._match < self.max_depth and self._rng.random() < self.alpha:
            self._match += 1

    @property
    def done(self) -> bool:
        return self._generated >= self.max_new_tokens

    @property
    def context_length(self) -> int:
        return self.prompt_length + self._generated

    @property
    def generated(self) -> int:
        return self._generated

    @property
    def cap(self) -> int:
        return depth_cap(self.max_depth, self.max_new_tokens - self._generated)

    @property
    def recent(self) -> Sequence[int]:
        return self._recent

    def draft(self) -> tuple[float, float, float, float, int]:
        if self._depth >= self.cap:
            raise ValueError(f"this round is already {self._depth} tokens deep, its cap")
        self._depth += 1
        top1 = min(0.999, max(0.001, self.alpha + self.feature_noise * self._rng.standard_normal()))
        entropy = -(top1 * math.log(top1) + (1 - top1) * math.log(1 - top1))
        return top1, entropy, math.log(top1), 2 * top1 - 1, 0

    def verify(self, size: int) -> Cycle:
        if not verifiable(size, self._depth):
            raise ValueError(f"cannot verify {size} of {self._depth} drafted tokens")
        accepted = min(size, self._match)
        emitted = min(accepted + 1, self.max_new_tokens - self._generated)
        cycle = Cycle(
            drafted=self._depth,
            verified=size,
            accepted=accepted,
            emitted=emitted,
            draft_seconds=self._depth * self.c * self.target_step_seconds,
            verify_seconds=self.g[size] * self.target_step_seconds,
        )
        self._generated += emitted
        self._recent.append(accepted)
        self._begin_round()
        return cycle
