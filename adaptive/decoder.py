"""Exact speculative decoding over a pair of transformers causal LMs (batch 1, chain drafts).

Cache invariant, for both models: after every round the cache holds every confirmed token except the last
(and possibly fewer for the draft, when its last drafted token was never fed). The next forward therefore
feeds ``tokens[cache.length:]`` first, which also covers the all-accepted case where the draft must catch
up on its own last drafted token.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from adaptive.cached_model import CachedModel
from adaptive.pair import check_compatible
from adaptive.policy import RECENT_ROUNDS, DraftPolicy, DraftState, DraftStep, RoundStats
from adaptive.sampling import GREEDY, SamplingConfig, check_logits, draft_features, sample, sampling_distribution
from adaptive.verification import CorrectionRule, residual_correction, verify_block, verify_block_greedy


class Clock:
    """perf_counter that waits for queued GPU work first, so a reading covers the work it follows."""

    def __init__(self, device: torch.device) -> None:
        self._sync = torch.cuda.synchronize if device.type == "cuda" else None

    def __call__(self) -> float:
        if self._sync is not None:
            self._sync()
        return time.perf_counter()


@dataclass
class GenerationResult:
    """Output and measurements of one generation."""

    prompt_ids: list[int]
    token_ids: list[int]
    rounds: list[RoundStats]
    prefill_time: float
    """Time outside the rounds: prompt prefill of both models and per-call setup."""
    total_time: float
    stop_reason: str
    """"eos" or "length"."""
    text: str | None = None
    first_token_time: float = field(default=0.0)
    """Seconds from the start of the call to the first emitted token."""

    @property
    def tokens_per_second(self) -> float:
        """Emitted tokens per second of the whole call (prefill included)."""
        return len(self.token_ids) / self.total_time if self.total_time > 0 else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean accepted draft tokens per round (τ counts the emitted token too: mean_emitted)."""
        return sum(r.accepted for r in self.rounds) / len(self.rounds) if self.rounds else 0.0

    @property
    def mean_emitted(self) -> float:
        """Mean tokens emitted per round (τ)."""
        return sum(r.emitted for r in self.rounds) / len(self.rounds) if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified draft tokens over all rounds."""
        verified = sum(r.verified for r in self.rounds)
        return sum(r.accepted for r in self.rounds) / verified if verified else 0.0


def prompt_token_ids(prompt: str | Sequence[int] | torch.Tensor, tokenizer) -> list[int]:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer; pass tokenizer=... or token ids")
        ids = tokenizer(prompt)["input_ids"]
    elif isinstance(prompt, torch.Tensor):
        if prompt.dim() == 2 and prompt.shape[0] != 1:
            raise ValueError(f"only batch size 1 is supported, got input of shape {tuple(prompt.shape)}")
        ids = prompt.reshape(-1).tolist()
    else:
        ids = list(prompt)
    if not ids:
        raise ValueError("the prompt is empty: at least one token is needed")
    return [int(i) for i in ids]


def eos_token_ids(model: PreTrainedModel, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(i) for i in eos_token_id)


class TokenBudget:
    """Accumulates emitted tokens and decides when to stop."""

    def __init__(self, max_new_tokens: int, eos: frozenset[int]) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.tokens: list[int] = []
        self.max_new_tokens = max_new_tokens
        self.eos = eos
        self.stop_reason: str = ""

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.tokens)

    def emit(self, candidates: Sequence[int]) -> list[int]:
        """Append candidates up to EOS or the budget; return those kept."""
        kept = []
        for token in candidates[: self.remaining]:
            kept.append(token)
            if token in self.eos:
                self.stop_reason = "eos"
                break
        self.tokens.extend(kept)
        if not self.stop_reason and self.remaining == 0:
            self.stop_reason = "length"
        return kept


class SpeculativeDecoder:
    """Speculative decoding that keeps the target's output distribution exactly.

    Args:
        target: the model whose distribution is preserved.
        draft: a cheaper model with the same vocabulary that proposes tokens.
        policy: decides draft depth and verification size (see ``policies`` for the baselines).
        sampling: temperature / top-k / top-p, applied identically to target and draft; default greedy.
        tokenizer: optional; enables text prompts, text output and the tokenizer compatibility check.
        draft_tokenizer: optional; checked against ``tokenizer`` when given.
        max_depth: hard cap on drafted tokens per round.
        eos_token_id: stop token(s); default from the target's generation config.
        correction: the rule used at a rejection; keep the default (exact residual) except to audit.

    Example:
        >>> decoder = SpeculativeDecoder(target, draft, policy=StaticDepth(4), tokenizer=tok)  # doctest: +SKIP
        >>> result = decoder.generate("The capital of Italy is", max_new_tokens=32)  # doctest: +SKIP
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel,
        policy: DraftPolicy,
        sampling: SamplingConfig = GREEDY,
        *,
        tokenizer=None,
        draft_tokenizer=None,
        max_depth: int = 16,
        eos_token_id: int | Sequence[int] | None = None,
        correction: CorrectionRule = residual_correction,
    ) -> None:
        check_compatible(target, draft, tokenizer, draft_tokenizer)
        if target.device != draft.device:
            raise ValueError(f"target and draft must be on one device, got {target.device} and {draft.device}")
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        if not isinstance(policy, DraftPolicy):
            raise TypeError(f"policy must implement DraftPolicy (should_continue, verify_size, ...), got {policy!r}")
        self.target = CachedModel(target)
        self.draft = CachedModel(draft)
        self.policy = policy
        self.sampling = sampling
        self.tokenizer = tokenizer
        self.max_depth = max_depth
        self.eos = eos_token_ids(target, eos_token_id)
        self.correction = correction
        self.clock = Clock(target.device)
        self.generator = torch.Generator(device=target.device)

    def generate(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        max_new_tokens: int = 128,
        seed: int | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt``; return tokens, text and statistics."""
        prompt_ids = prompt_token_ids(prompt, self.tokenizer)
        output = TokenBudget(max_new_tokens, self.eos)
        start = self.clock()
        rounds: list[RoundStats] = []
        first_token_time = 0.0
        for stats in self._rounds(prompt_ids, output, seed):
            if not rounds:
                first_token_time = self.clock() - start
            rounds.append(stats)
        total = self.clock() - start
        prefill = total - sum(r.total_time for r in rounds)
        text = self.tokenizer.decode(output.tokens, skip_special_tokens=True) if self.tokenizer else None
        return GenerationResult(prompt_ids, output.tokens, rounds, prefill, total, output.stop_reason, text, first_token_time)

    def stream(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        max_new_tokens: int = 128,
        seed: int | None = None,
    ) -> Iterator[RoundStats]:
        """Yield each round's statistics (``.tokens`` holds the emitted ids) as soon as it completes."""
        yield from self._rounds(prompt_token_ids(prompt, self.tokenizer), TokenBudget(max_new_tokens, self.eos), seed)

    def start(self, prompt: str | Sequence[int] | torch.Tensor, max_new_tokens: int = 128, seed: int | None = None) -> Generation:
        """Prefill and return a :class:`Generation` to advance step by step (no policy involved)."""
        return Generation(self, prompt_token_ids(prompt, self.tokenizer), TokenBudget(max_new_tokens, self.eos), seed)

    def _rounds(self, prompt_ids: list[int], output: TokenBudget, seed: int | None) -> Iterator[RoundStats]:
        """Run rounds, asking the policy, until ``output`` says stop."""
        clock, policy = self.clock, self.policy
        policy.reset()
        generation = Generation(self, prompt_ids, output, seed)
        per_step = getattr(policy, "reads_step_features", True)
        while not generation.done:
            policy_time = 0.0
            while generation.depth < generation.max_depth:
                generation.draft_step(features=per_step)
                state = generation.state()
                t0 = clock()
                go_on = state.depth < state.max_depth and policy.should_continue(state)
                policy_time += clock() - t0
                if not go_on:
                    break
            state = generation.end_drafting()
            t0 = clock()
            verified = policy.verify_size(state) if state.depth else 0
            policy_time += clock() - t0
            if not _verifiable(verified, state.depth):
                raise ValueError(f"policy {policy.name!r} asked to verify {verified} of {state.depth} drafted tokens")
            stats = generation.verify(verified, policy_time)
            t0 = clock()
            policy.observe(stats)
            stats.policy_time += clock() - t0
            yield stats


class Generation:
    """One generation in progress, advanced one draft step or one verification at a time.

    :class:`SpeculativeDecoder` drives it with a policy; the live environment drives it with actions.
    Creating it prefills both models with the prompt.
    """

    def __init__(self, decoder: SpeculativeDecoder, prompt_ids: list[int], output: TokenBudget, seed: int | None) -> None:
        self.decoder = decoder
        self.output = output
        self.tokens = list(prompt_ids)
        self.recent: list[int] = []
        if seed is not None:
            decoder.generator.manual_seed(seed)
        decoder.target.reset()
        decoder.draft.reset()
        if len(self.tokens) > 1:  # every model caches all confirmed tokens but the last
            decoder.target.forward(self.tokens[:-1])
            decoder.draft.forward(self.tokens[:-1])
        self._begin_round()

    def _begin_round(self) -> None:
        self.max_depth = min(self.decoder.max_depth, self.output.remaining - 1)
        self._drafted = _DraftedRound()
        self._deferred_logits: list[torch.Tensor] = []

    @property
    def done(self) -> bool:
        """True once EOS or the token budget ended the generation."""
        return bool(self.output.stop_reason)

    @property
    def depth(self) -> int:
        """Tokens drafted so far in this round."""
        return len(self._drafted.steps)

    def state(self) -> DraftState:
        """What a policy knows now."""
        return DraftState(len(self.tokens), tuple(self._drafted.steps), self.max_depth, tuple(self.recent[-RECENT_ROUNDS:]))

    def draft_step(self, features: bool = True) -> DraftStep:
        """Draft one more token. With ``features=False`` the step's features are NaN until
        :meth:`end_drafting` computes them for the whole round in one pass."""
        if self.depth >= self.max_depth:
            raise ValueError(f"this round is already {self.depth} tokens deep, its cap (max_depth or token budget)")
        clock, drafted, draft = self.decoder.clock, self._drafted, self.decoder.draft
        t0 = clock()
        steps = drafted.steps
        logits = draft.forward(self.tokens[draft.length :] if not steps else [steps[-1].token])[-1]
        drafted.forward_time += clock() - t0
        sampled = None
        if not self.decoder.sampling.is_greedy:
            drafted.q_rows.append(sampling_distribution(logits, self.decoder.sampling))
            sampled = sample(drafted.q_rows[-1], self.decoder.generator)
        if features:
            steps.extend(_draft_steps(logits[None], None if sampled is None else sampled[None], steps))
        else:
            self._deferred_logits.append(logits)
            steps.append(DraftStep(int(logits.argmax() if sampled is None else sampled), *_NO_FEATURES))
        drafted.draft_time += clock() - t0
        return steps[-1]

    def end_drafting(self) -> DraftState:
        """Finish drafting (computing any deferred features) and return the state for the size decision."""
        if self._deferred_logits:
            t0 = self.decoder.clock()
            logits = torch.stack(self._deferred_logits)
            tokens = torch.tensor([s.token for s in self._drafted.steps], device=logits.device)
            self._drafted.steps = _draft_steps(logits, tokens, [])
            self._deferred_logits = []
            self._drafted.draft_time += self.decoder.clock() - t0
        return self.state()

    def verify(self, size: int, policy_time: float = 0.0) -> RoundStats:
        """Verify the first ``size`` drafted tokens with one target forward, emit, roll both caches back to
        the accepted prefix, and start the next round."""
        self.end_drafting()
        decoder, drafted, tokens = self.decoder, self._drafted, self.tokens
        steps = drafted.steps
        if not _verifiable(size, len(steps)):
            raise ValueError(f"cannot verify {size} of {len(steps)} drafted tokens (allowed: 1..{len(steps)})")
        clock = decoder.clock
        verify_start = clock()
        context_length = len(tokens)
        draft_ids = [step.token for step in steps[:size]]
        target_logits = decoder.target.forward(tokens[decoder.target.length :] + draft_ids)[-(size + 1) :]
        target_forward = clock() - verify_start
        drafted_ids = torch.tensor(draft_ids, dtype=torch.long, device=target_logits.device)
        if decoder.sampling.is_greedy:
            check_logits(target_logits)
            verdict = verify_block_greedy(target_logits, drafted_ids)
        else:
            p = sampling_distribution(target_logits, decoder.sampling)
            q = torch.stack(drafted.q_rows[:size]) if size else p[:0]
            verdict = verify_block(p, q, drafted_ids, decoder.generator, decoder.correction)
        emitted = self.output.emit(draft_ids[: verdict.accepted] + [verdict.next_token])
        decoder.target.rollback(context_length + verdict.accepted)
        decoder.draft.rollback(min(decoder.draft.length, context_length + verdict.accepted))
        tokens.extend(emitted)
        self.recent.append(verdict.accepted)
        stats = RoundStats(
            context_length=context_length,
            drafted=len(steps),
            verified=size,
            accepted=verdict.accepted,
            emitted=len(emitted),
            tokens=tuple(emitted),
            draft_time=drafted.draft_time,
            verify_time=clock() - verify_start,
            policy_time=policy_time,
            forward_time=drafted.forward_time + target_forward,
            steps=tuple(steps),
        )
        self._begin_round()
        return stats


@dataclass
class _DraftedRound:
    """What drafting produced: steps (with features), the sampled-from q rows, and its timings."""

    steps: list[DraftStep] = field(default_factory=list)
    q_rows: list[torch.Tensor] = field(default_factory=list)
    """Draft distributions the tokens were drawn from (empty when greedy)."""
    draft_time: float = 0.0
    forward_time: float = 0.0


def _verifiable(size: int, depth: int) -> bool:
    """A round of ``depth`` drafted tokens verifies 1..depth of them (0 only when nothing was drafted)."""
    return 0 <= size <= depth and (size >= 1 or depth == 0)


_NO_FEATURES = (math.nan, math.nan, math.nan, math.nan)
"""Placeholder features while drafting for a policy that does not read them (filled in after drafting)."""


def _draft_steps(logits: torch.Tensor, tokens: torch.Tensor | None, previous: list[DraftStep]) -> list[DraftStep]:
    """DraftSteps for ``[n, V]`` logits, continuing the cumulative log-probability of ``previous``."""
    cumulative = previous[-1].cumulative_log_prob if previous else 0.0
    steps = []
    for token, top1, entropy, log_prob in draft_features(logits, tokens):
        cumulative += log_prob
        steps.append(DraftStep(token, top1, entropy, log_prob, cumulative))
    return steps


def generate_plain(
    target: PreTrainedModel,
    prompt: str | Sequence[int] | torch.Tensor,
    max_new_tokens: int = 128,
    sampling: SamplingConfig = GREEDY,
    *,
    tokenizer=None,
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
) -> GenerationResult:
    """Plain autoregressive decoding of the target with the same cache, clock and sampling contract.

    Each token is reported as a round with nothing drafted, so results compare field by field.
    """
    model = CachedModel(target)
    clock = Clock(target.device)
    generator = torch.Generator(device=target.device)
    if seed is not None:
        generator.manual_seed(seed)
    tokens = prompt_token_ids(prompt, tokenizer)
    prompt_ids = list(tokens)
    output = TokenBudget(max_new_tokens, eos_token_ids(target, eos_token_id))
    start = clock()
    if len(tokens) > 1:
        model.forward(tokens[:-1])
    prefill = clock() - start
    rounds = []
    while not output.stop_reason:
        t0 = clock()
        logits = model.forward(tokens[model.length :])[-1]
        t1 = clock()
        token = int(sample(sampling_distribution(logits, sampling), generator))
        tokens.extend(output.emit([token]))
        t2 = clock()
        rounds.append(
            RoundStats(
                context_length=len(tokens) - 1,
                drafted=0,
                verified=0,
                accepted=0,
                emitted=1,
                tokens=(token,),
                draft_time=0.0,
                verify_time=t2 - t0,
                policy_time=0.0,
                forward_time=t1 - t0,
            )
        )
    total = clock() - start
    text = tokenizer.decode(output.tokens, skip_special_tokens=True) if tokenizer else None
    first = prefill + rounds[0].verify_time
    return GenerationResult(prompt_ids, output.tokens, rounds, prefill, total, output.stop_reason, text, first)
