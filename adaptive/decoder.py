"""Exact speculative decoding over a pair of transformers causal LMs (batch 1, chain drafts), and plain
decoding of the target with the same cache, clock and sampling contract.

The generation scaffold (prompt, budget, prefill, clock, policy loop, result) is :mod:`adaptive.generation`;
this module implements a chain round: draft steps, one target forward over the drafted tokens, the accept
rule min(1, p/q) with the residual on rejection (or arg-max agreement when greedy), cache rollback.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from transformers import PreTrainedModel

from adaptive.copy_draft import MODEL_FREE, CopyDraft, proposes
from adaptive.drafts import Draft, draft_session
from adaptive.generation import Clock, Decoder, Generation, GenerationResult, TokenBudget, context_positions, eos_token_ids, prompt_token_ids
from adaptive.lean import open_cache
from adaptive.policy import DraftPolicy, DraftState, DraftStep, RoundStats, verifiable
from adaptive.sampling import (
    GREEDY,
    SamplingConfig,
    arg_max,
    draft_features,
    greedy_token,
    in_vocabulary,
    proposal_distribution,
    sample,
    sampling_distribution,
    target_ids,
)
from adaptive.verification import CorrectionRule, residual_correction, verify_drafts


class SpeculativeDecoder(Decoder):
    """Speculative decoding that keeps the target's output distribution exactly.

    Args:
        target: the model whose distribution is preserved.
        draft: a cheaper model with the same vocabulary that proposes tokens, an EAGLE-3 head, or the
            model-free :class:`~adaptive.copy_draft.CopyDraft`.
        policy: decides draft depth and verification size (see ``policies`` for the baselines).
        sampling: temperature / top-k / top-p, applied identically to target and draft; default greedy.
        tokenizer: optional; enables text prompts, text output and the tokenizer compatibility check.
        draft_tokenizer: optional; checked against ``tokenizer`` when given.
        max_depth: hard cap on drafted tokens per round.
        eos_token_id: stop token(s); default from the target's generation config.
        correction: the rule used at a rejection; keep the default (exact residual) except to audit.
        copy: a :class:`~adaptive.copy_draft.CopyDraft` beside the draft model; the policy's ``source``
            then picks, each round, the model, the copy drafter, or the copy drafter then the model.

    Example:
        >>> decoder = SpeculativeDecoder(target, draft, policy=StaticDepth(4), tokenizer=tok)  # doctest: +SKIP
        >>> result = decoder.generate("The capital of Italy is", max_new_tokens=32)  # doctest: +SKIP
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: Draft,
        policy: DraftPolicy,
        sampling: SamplingConfig = GREEDY,
        *,
        tokenizer=None,
        draft_tokenizer=None,
        max_depth: int = 16,
        eos_token_id: int | Sequence[int] | None = None,
        correction: CorrectionRule = residual_correction,
        copy: CopyDraft | None = None,
    ) -> None:
        super().__init__(target, draft, policy, tokenizer=tokenizer, draft_tokenizer=draft_tokenizer, max_depth=max_depth, eos_token_id=eos_token_id)
        if copy is not None:
            if isinstance(draft, MODEL_FREE):
                raise ValueError(f"the draft is already a model-free drafter ({draft.name}); a copy drafter goes beside a draft model")
            self.copy = draft_session(copy, self.target)
        self.sampling = sampling
        self.correction = correction
        self.generator = torch.Generator(device=target.device)

    def _begin(self, prompt_ids: list[int], output: TokenBudget, seed: int | None) -> ChainGeneration:
        return ChainGeneration(self, prompt_ids, output, seed)


class ChainGeneration(Generation):
    """A chain generation in progress: each round drafts a chain of tokens, one draft forward per step."""

    decoder: SpeculativeDecoder

    def __init__(self, decoder: SpeculativeDecoder, prompt_ids: list[int], output: TokenBudget, seed: int | None) -> None:
        if seed is not None:
            decoder.generator.manual_seed(seed)
        super().__init__(decoder, prompt_ids, output)

    def _begin_round(self) -> None:
        super()._begin_round()
        self._drafted = _DraftedRound()
        self._deferred_logits: list[torch.Tensor] = []
        self._deferred_vocabularies: list[torch.Tensor | None] = []
        self._context_row: torch.Tensor | None = None
        """The last row of a draft session that read the context before the round drafted (choose_source)."""
        self._copy_done = False
        """copy+model rounds: the copy drafter ran out of proposals; the model drafts on."""

    def _read_context(self, draft) -> torch.Tensor:
        t0 = self.decoder.clock()
        self._context_row = draft.forward(self.tokens[draft.length :])[-1]
        seconds = self.decoder.clock() - t0
        self._drafted.draft_time += seconds
        self._drafted.forward_time += seconds
        return self._context_row

    def _drafting(self):
        """The session that drafts the next step under this round's source."""
        decoder = self.decoder
        if self.source == "model" or (self.source == "copy+model" and self._copy_done):
            return decoder.draft
        return decoder.copy

    def _next_row(self, session) -> torch.Tensor:
        """``session``'s logits after the context and this round's drafted tokens (feeding what it has not read)."""
        fed = (self.tokens + [step.token for step in self._drafted.steps])[session.length :]
        if fed:
            return session.forward(fed)[-1]
        if self._context_row is None:
            raise RuntimeError("a draft session holds every token but has no row for the next one")
        row, self._context_row = self._context_row, None
        return row

    @property
    def depth(self) -> int:
        """Tokens drafted so far in this round."""
        return len(self._drafted.steps)

    def steps(self) -> tuple[DraftStep, ...]:
        return tuple(self._drafted.steps)

    def draft_step(self, features: bool = True) -> DraftStep | None:
        """Draft one more token. With ``features=False`` the step's features are NaN until
        :meth:`end_drafting` computes them for the whole round in one pass. A draft with nothing to propose
        (the copy drafter without a match) ends the round's drafting: None, and the cap drops to the depth."""
        if self.depth >= self.max_depth:
            raise ValueError(f"this round is already {self.depth} tokens deep, its cap (max_depth or token budget)")
        clock, drafted, draft = self.decoder.clock, self._drafted, self._drafting()
        t0 = clock()
        steps = drafted.steps
        logits = self._next_row(draft)
        if draft.deterministic and not proposes(logits):
            if self.source != "copy+model":
                elapsed = clock() - t0
                drafted.forward_time += elapsed
                drafted.draft_time += elapsed
                self.max_depth = self.depth
                return None
            self._copy_done, draft = True, self.decoder.draft  # the model drafts on where the copy drafter ran out
            logits = self._next_row(draft)
        drafted.forward_time += clock() - t0
        sampled = None
        if not self.decoder.sampling.is_greedy:
            drafted.q_rows.append(proposal_distribution(logits, self.decoder.sampling, draft.deterministic))
            sampled = sample(drafted.q_rows[-1], self.decoder.generator)
        match = draft.match_lengths[-1] if draft.deterministic else 0
        if features:
            steps.append(replace(_draft_steps(logits[None], None if sampled is None else sampled[None], steps, draft.vocabulary)[0], match_length=match))
        else:
            self._deferred_logits.append(logits)
            self._deferred_vocabularies.append(draft.vocabulary)
            top = target_ids(arg_max(in_vocabulary(logits, draft.vocabulary)), draft.vocabulary)
            steps.append(DraftStep(int(top if sampled is None else sampled), *_NO_FEATURES, match, math.nan))
        drafted.draft_time += clock() - t0
        return steps[-1]

    def end_drafting(self) -> DraftState:
        """Finish drafting (computing any deferred features) and return the state for the size decision."""
        if self._deferred_logits:
            t0 = self.decoder.clock()
            logits = torch.stack(self._deferred_logits)
            tokens = torch.tensor([s.token for s in self._drafted.steps], device=logits.device)
            matches = [step.match_length for step in self._drafted.steps]
            first, *rest = self._deferred_vocabularies
            vocabulary = first if all(v is first for v in rest) else None  # a copy+model round mixes two drafts
            self._drafted.steps = [replace(step, match_length=m) for step, m in zip(_draft_steps(logits, tokens, [], vocabulary), matches)]
            self._deferred_logits, self._deferred_vocabularies = [], []
            self._drafted.draft_time += self.decoder.clock() - t0
        return self.state()

    def choose_size(self, policy: DraftPolicy, state: DraftState) -> int:
        """The policy's verification size (1..depth); a size outside that is the policy's error."""
        size = policy.verify_size(state) if state.depth else 0
        if not verifiable(size, state.depth):
            raise ValueError(f"policy {policy.name!r} asked to verify {size} of {state.depth} drafted tokens")
        return size

    def verify(self, size: int, policy_time: float = 0.0) -> RoundStats:
        """Verify the first ``size`` drafted tokens with one target forward, emit, roll both caches back to
        the accepted prefix, and start the next round."""
        self.end_drafting()
        decoder, drafted, tokens = self.decoder, self._drafted, self.tokens
        steps = drafted.steps
        if not verifiable(size, len(steps)):
            raise ValueError(f"cannot verify {size} of {len(steps)} drafted tokens (allowed: 1..{len(steps)})")
        clock = decoder.clock
        verify_start = clock()
        context_length = len(tokens)
        draft_ids = [step.token for step in steps[:size]]
        target_logits = decoder.target.forward(tokens[decoder.target.length :] + draft_ids)[-(size + 1) :]
        target_forward = clock() - verify_start
        drafted_ids = torch.tensor(draft_ids, dtype=torch.long, device=target_logits.device)
        verdict = verify_drafts(target_logits, drafted_ids, drafted.q_rows[:size], decoder.sampling, decoder.generator, decoder.correction)
        emitted = self.output.emit(draft_ids[: verdict.accepted] + [verdict.next_token])
        decoder.target.rollback(context_length + verdict.accepted)
        for draft in decoder.drafts:
            draft.rollback(min(draft.length, context_length + verdict.accepted))
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
            source=self.source,
            target_forward_time=target_forward,
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


_NO_FEATURES = (math.nan, math.nan, math.nan, math.nan)
"""Placeholder features while drafting for a policy that does not read them (filled in after drafting)."""


def _draft_steps(logits: torch.Tensor, tokens: torch.Tensor | None, previous: list[DraftStep], vocabulary: torch.Tensor | None) -> list[DraftStep]:
    """DraftSteps for ``[n, V]`` logits (of a draft scoring ``vocabulary``), continuing the cumulative
    log-probability of ``previous``."""
    cumulative = previous[-1].cumulative_log_prob if previous else 0.0
    steps = []
    for token, top1, entropy, log_prob, margin in draft_features(logits, tokens, vocabulary):
        cumulative += log_prob
        steps.append(DraftStep(token, top1, entropy, log_prob, cumulative, margin=margin))
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
    model = open_cache(target)
    clock = Clock(target.device)
    generator = torch.Generator(device=target.device)
    if seed is not None:
        generator.manual_seed(seed)
    tokens = prompt_token_ids(prompt, tokenizer)
    prompt_ids = list(tokens)
    output = TokenBudget(max_new_tokens, eos_token_ids(target, eos_token_id), len(tokens), context_positions(target))
    start = clock()
    if len(tokens) > 1:
        model.forward(tokens[:-1])
    prefill = clock() - start
    rounds = []
    while not output.stop_reason:
        t0 = clock()
        logits = model.forward(tokens[model.length :])[-1]
        t1 = clock()
        token = greedy_token(logits) if sampling.is_greedy else int(sample(sampling_distribution(logits, sampling), generator))
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
