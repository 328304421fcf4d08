"""Baseline draft policies: static depth, cost-model optimum, transformers' heuristic schedule,
confidence threshold, entropy stop, and SuffixDecoding's rule for copy drafters. Each verifies every drafted
token (chain drafts) but SuffixDecoding's, which leaves out a last token below its probability floor."""

from __future__ import annotations

import math
import random

from adaptive.costmodel import GCurve, optimal_gamma, verification_cost
from adaptive.policy import RULE_DECISION_SECONDS, SOURCES, BasePolicy, DraftState, RoundStats


class StaticDepth(BasePolicy):
    """Always draft ``gamma`` tokens (the classic fixed γ), drafted by ``source`` when the decoder also has a
    copy drafter (:data:`~adaptive.policy.SOURCES`; a copy drafter may run out of proposals sooner)."""

    reads_step_features = False
    decision_seconds = RULE_DECISION_SECONDS

    def __init__(self, gamma: int, source: str = "model") -> None:
        if gamma < 1:
            raise ValueError(f"static depth must be >= 1, got {gamma}")
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}; allowed: {', '.join(SOURCES)}")
        self.gamma, self.drafter = gamma, source
        self.name = f"static:{gamma}" if source == "model" else f"static:{gamma}:{source}"

    def source(self, state: DraftState) -> str:
        return self.drafter

    def should_continue(self, state: DraftState) -> bool:
        return state.depth < self.gamma


class HeuristicSchedule(BasePolicy):
    """transformers' "heuristic" schedule: +2 after a fully accepted round, else -1 (never below 1)."""

    reads_step_features = False
    decision_seconds = RULE_DECISION_SECONDS

    def __init__(self, initial: int = 5) -> None:
        if initial < 1:
            raise ValueError(f"initial depth must be >= 1, got {initial}")
        self.initial = initial
        self.depth = initial
        self.name = "heuristic" if initial == 5 else f"heuristic:{initial}"

    def reset(self) -> None:
        self.depth = self.initial

    def should_continue(self, state: DraftState) -> bool:
        return state.depth < self.depth

    def observe(self, stats: RoundStats) -> None:
        if stats.drafted == 0:
            return
        self.depth = self.depth + 2 if stats.accepted == stats.verified else max(1, self.depth - 1)


class ConfidenceStop(BasePolicy):
    """Stop drafting when the drafted token's draft probability falls below ``threshold``
    (transformers' assistant_confidence_threshold, default 0.4). The low-confidence token is still verified."""

    def __init__(self, threshold: float = 0.4) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"confidence threshold must be in (0, 1), got {threshold}")
        self.threshold = threshold
        self.name = f"confidence:{threshold:g}"

    def should_continue(self, state: DraftState) -> bool:
        return math.exp(state.steps[-1].log_prob) >= self.threshold


class EntropyStop(BasePolicy):
    """Stop drafting when the draft's next-token entropy (nats) exceeds ``threshold`` (AdaEDL/SVIP style)."""

    def __init__(self, threshold: float = 2.0) -> None:
        if threshold <= 0:
            raise ValueError(f"entropy threshold must be > 0 nats, got {threshold}")
        self.threshold = threshold
        self.name = f"entropy:{threshold:g}"

    def should_continue(self, state: DraftState) -> bool:
        return state.steps[-1].entropy <= self.threshold


class SuffixRule(BasePolicy):
    """SuffixDecoding's rule (arXiv 2411.04975; vLLM's defaults) for a copy drafter: draft at most
    ⌊m · factor + offset⌋ tokens, m the match length the round's first proposal copies from, and stop at a
    token whose estimated probability — the product of the drafter's continuation frequencies this round —
    is below ``min_prob``; that token is left out of the verification unless it is the only one. With a model
    draft (m = 0) it drafts one token. Beside a draft model it drafts with the copy drafter."""

    def __init__(self, factor: float = 1.0, offset: float = 0.0, min_prob: float = 0.1) -> None:
        if factor < 0 or not 0.0 < min_prob <= 1.0:
            raise ValueError(f"SuffixDecoding's rule needs factor >= 0 and min_prob in (0, 1], got factor={factor}, min_prob={min_prob}")
        self.factor, self.offset, self.min_log_prob = factor, offset, math.log(min_prob)
        self.name = "suffix" if (factor, offset, min_prob) == (1.0, 0.0, 0.1) else f"suffix:{factor:g}"

    def source(self, state: DraftState) -> str:
        return "copy"

    def should_continue(self, state: DraftState) -> bool:
        limit = math.floor(state.steps[0].match_length * self.factor + self.offset)
        return state.depth < limit and state.steps[-1].cumulative_log_prob >= self.min_log_prob

    def verify_size(self, state: DraftState) -> int:
        return max(1, sum(step.cumulative_log_prob >= self.min_log_prob for step in state.steps))


class CostModelPolicy(BasePolicy):
    """Draft γ* = argmax_γ E(α̂, γ) / (g(γ) + ĉ·γ), re-solved after every round.

    α̂ is a running estimate (decayed counts of accepted tokens and rejections, with a prior); ĉ is either
    given or estimated online as (draft time per step) / (target step time), where the target step time is
    the measured verification time divided by g(verified). Estimates persist across generations: they
    describe the pair and the workload, not one prompt.

    Args:
        c: draft step cost in target steps; None to measure it online.
        g: verification cost curve g(γ) (constant or per-γ mapping); 1.0 is the seed's simple model.
        max_gamma: largest depth considered.
        prior_alpha: α assumed before any observation.
        prior_weight: pseudo-observations behind the prior.
        decay: per-round forgetting factor of the counts (1.0 = never forget).
    """

    reads_step_features = False
    decision_seconds = RULE_DECISION_SECONDS

    def __init__(
        self,
        c: float | None = None,
        g: GCurve = 1.0,
        max_gamma: int = 16,
        prior_alpha: float = 0.6,
        prior_weight: float = 4.0,
        decay: float = 0.98,
    ) -> None:
        if c is not None and c < 0:
            raise ValueError(f"c must be >= 0, got {c}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.fixed_c = c
        self.g = g
        self.max_gamma = max_gamma
        self.accepted = prior_alpha * prior_weight
        self.trials = prior_weight
        self.decay = decay
        self.step_time: float | None = None
        self.target_step_time: float | None = None
        self.gamma = optimal_gamma(self.alpha, self.c, g, max_gamma).gamma
        self.name = "costmodel" if c is None else f"costmodel:{c:g}"

    @property
    def alpha(self) -> float:
        """Current estimate of the per-token acceptance probability."""
        return self.accepted / self.trials

    @property
    def c(self) -> float:
        """Given c, or the online estimate (0.05 until both times have been seen)."""
        if self.fixed_c is not None:
            return self.fixed_c
        if self.step_time is None or not self.target_step_time:
            return 0.05
        return self.step_time / self.target_step_time

    def should_continue(self, state: DraftState) -> bool:
        return state.depth < self.gamma

    def observe(self, stats: RoundStats) -> None:
        if stats.verified == 0:
            return
        rejected = 1 if stats.accepted < stats.verified else 0
        self.accepted = self.decay * self.accepted + stats.accepted
        self.trials = self.decay * self.trials + stats.accepted + rejected
        self.step_time = _ema(self.step_time, stats.draft_time / stats.drafted)
        self.target_step_time = _ema(self.target_step_time, stats.verify_time / verification_cost(self.g, stats.verified))
        self.gamma = optimal_gamma(self.alpha, self.c, self.g, self.max_gamma).gamma


def _ema(previous: float | None, value: float, weight: float = 0.1) -> float:
    return value if previous is None else (1 - weight) * previous + weight * value


class RandomDepth(BasePolicy):
    """Draft a uniformly random depth in 1..max_depth each round (the size policy's first partner)."""

    reads_step_features = False
    decision_seconds = RULE_DECISION_SECONDS
    name = "random-depth"

    def __init__(self, max_depth: int, seed: int = 0) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self._rng = random.Random(seed)
        self._target = 1

    def should_continue(self, state: DraftState) -> bool:
        if state.depth == 1:
            self._target = self._rng.randint(1, self.max_depth)
        return state.depth < self._target
