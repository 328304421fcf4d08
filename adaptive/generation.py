"""What every decoder shares: prompt handling, the token budget, prefill, the clock, the policy loop and the
result of a generation.

A decoder (:class:`Decoder`) makes one :class:`Generation` per call. A generation is advanced one draft step
or one verification at a time (``draft_step`` / ``end_drafting`` / ``choose_size`` / ``verify``): the
decoder's own loop drives it with a policy, the live environment with actions. Chains
(:mod:`adaptive.decoder`) and trees (:mod:`adaptive.tree_decoder`) implement the steps.

Cache invariant, for both models: after every round the cache holds every confirmed token except the last
(and possibly fewer for the draft, when its last drafted token was never fed). The next forward therefore
feeds ``tokens[cache.length:]`` first.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from adaptive.copy_draft import MODEL_FREE, CopySession, proposes
from adaptive.drafts import Draft, draft_session, target_taps
from adaptive.lean import open_cache
from adaptive.pair import check_compatible
from adaptive.policy import RECENT_ROUNDS, SOURCES, DraftPolicy, DraftState, DraftStep, RoundStats, depth_cap
from adaptive.sampling import draft_features


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
    """"eos", "length" (``max_new_tokens``) or "context" (the models' positions are full)."""
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
    """Token ids of a text prompt (needs the tokenizer), a 1-row tensor or a sequence of ids."""
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
    """The stop tokens: as given, else from the model's generation config."""
    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None)
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(i) for i in eos_token_id)


def context_positions(*models) -> int | None:
    """The fewest positions any of ``models`` (transformers models, heads, draft sessions' models) can attend over:
    their configs' ``max_position_embeddings``; None when none of them states a limit (a copy drafter, a head)."""
    limits = [getattr(getattr(model, "config", None), "max_position_embeddings", None) for model in models]
    limits = [int(limit) for limit in limits if isinstance(limit, int) and limit > 0]
    return min(limits) if limits else None


class ContextTooLong(ValueError):
    """The prompt leaves no position for a new token."""


class TokenBudget:
    """Accumulates emitted tokens and decides when to stop: at EOS, after ``max_new_tokens``, or when the prompt and
    the new tokens fill the models' ``positions`` (stop reason ``context``)."""

    def __init__(self, max_new_tokens: int, eos: frozenset[int], prompt_length: int = 0, positions: int | None = None) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if positions is not None and prompt_length >= positions:
            raise ContextTooLong(f"the prompt has {prompt_length} tokens; the models attend over at most {positions} positions: shorten the prompt")
        self.tokens: list[int] = []
        self.requested = max_new_tokens
        self.max_new_tokens = max_new_tokens if positions is None else min(max_new_tokens, positions - prompt_length)
        """What will be generated at most: the request, or fewer when the context fills first."""
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
            self.stop_reason = "length" if self.max_new_tokens == self.requested else "context"
        return kept


class Generation(ABC):
    """One generation in progress. Creating it prefills both models with the prompt.

    Subclasses implement a round's steps: :meth:`draft_step` (one more draft step), :meth:`end_drafting`
    (the state for the size decision), :meth:`choose_size` (ask a policy) and :meth:`verify` (one target
    forward, emit, roll the caches back, begin the next round)."""

    def __init__(self, decoder: Decoder, prompt_ids: list[int], output: TokenBudget) -> None:
        self.decoder = decoder
        self.output = output
        self.tokens = list(prompt_ids)
        self.recent: list[int] = []
        for model in (decoder.target, *decoder.drafts):
            model.reset()
            if len(self.tokens) > 1:  # every model caches all confirmed tokens but the last
                model.forward(self.tokens[:-1])
        self.max_depth = 0
        self._begin_round()

    def _begin_round(self) -> None:
        for draft in self.decoder.drafts:
            draft.begin_round()
        self.source, self.copy_match, self.copy_first = "model", 0, (0.0, 0.0)
        self.max_depth = self._cap(self.decoder.draft)

    def _cap(self, *drafts) -> int:
        """The round's depth cap when ``drafts`` draft it (0 when none of them can draft yet)."""
        ready = any(draft.can_draft(len(self.tokens)) for draft in drafts)
        return depth_cap(self.decoder.max_depth, self.output.remaining) if ready else 0

    def choose_source(self, policy: DraftPolicy) -> float:
        """Before drafting, when the decoder has a copy drafter beside the draft model: let the policy pick
        what drafts this round, having shown it the copy drafter's match length and first proposal here.
        Returns the seconds the policy took."""
        copy = self.decoder.copy
        if copy is None:
            return 0.0
        row = self._read_context(copy)
        self.copy_match = copy.match_lengths[-1]
        t0 = self.decoder.clock()  # the first proposal's features are part of what the policy is shown
        if proposes(row):
            _, top1, entropy, _, _ = draft_features(row[None])[0]
            self.copy_first = (top1, entropy)
        source = policy.source(self.state())
        seconds = self.decoder.clock() - t0
        if source not in SOURCES:
            raise ValueError(f"policy {policy.name!r} chose the source {source!r}; allowed: {', '.join(SOURCES)}")
        self.source = source
        self.max_depth = self._cap(*{"model": (self.decoder.draft,), "copy": (copy,), "copy+model": (copy, self.decoder.draft)}[source])
        return seconds

    def _read_context(self, draft) -> torch.Tensor:
        """Bring a draft session up to the confirmed tokens before the round drafts and return its last row
        (chain rounds keep it for the first step)."""
        raise NotImplementedError(f"{type(self).__name__} drafts with its draft model only")

    @property
    def done(self) -> bool:
        """True once EOS or the token budget ended the generation."""
        return bool(self.output.stop_reason)

    @property
    @abstractmethod
    def depth(self) -> int:
        """Draft steps taken so far in this round."""

    @abstractmethod
    def steps(self) -> tuple[DraftStep, ...]:
        """This round's draft steps, as a policy sees them."""

    def state(self) -> DraftState:
        """What a policy knows now."""
        return DraftState(
            len(self.tokens),
            self.steps(),
            self.max_depth,
            tuple(self.recent[-RECENT_ROUNDS:]),
            self.copy_match,
            self.source,
            len(self.output.tokens),
            self.copy_first,
        )

    @abstractmethod
    def draft_step(self, features: bool = True) -> DraftStep | None:
        """Draft one more step (``features=False``: a policy that reads no features is asking); None when
        the draft has nothing to propose (the round's cap then drops to its depth)."""

    def end_drafting(self) -> DraftState:
        """Finish drafting and return the state for the size decision."""
        return self.state()

    @abstractmethod
    def choose_size(self, policy: DraftPolicy, state: DraftState) -> int:
        """How much of this round's draft the policy sends to the target."""

    @abstractmethod
    def verify(self, size: int, policy_time: float = 0.0) -> RoundStats:
        """Verify, emit, roll the caches back to the accepted prefix, and begin the next round."""


class Decoder(ABC):
    """A target, a draft and a policy; :meth:`generate`, :meth:`stream` and :meth:`start` over one policy loop.

    Args:
        target: the model whose output is preserved.
        draft: a cheaper model with the same vocabulary that proposes tokens.
        policy: decides draft depth and verification size (see ``policies`` for the baselines).
        tokenizer: optional; enables text prompts, text output and the tokenizer compatibility check.
        draft_tokenizer: optional; checked against ``tokenizer`` when given.
        max_depth: hard cap on draft steps per round.
        eos_token_id: stop token(s); default from the target's generation config.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: Draft,
        policy: DraftPolicy,
        *,
        tokenizer=None,
        draft_tokenizer=None,
        max_depth: int = 16,
        eos_token_id: int | Sequence[int] | None = None,
    ) -> None:
        if not isinstance(draft, MODEL_FREE):  # a copy drafter proposes the context's own tokens: any target, any device
            check_compatible(target, draft, tokenizer, draft_tokenizer)
            if target.device != draft.device:
                raise ValueError(f"target and draft must be on one device, got {target.device} and {draft.device}")
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        if not isinstance(policy, DraftPolicy):
            raise TypeError(f"policy must implement DraftPolicy (should_continue, verify_size, ...), got {policy!r}")
        self.target = open_cache(target, target_taps(draft))
        self.draft = draft_session(draft, self.target)
        self.copy: CopySession | None = None
        """A copy drafter beside the draft model (:class:`~adaptive.decoder.SpeculativeDecoder` only)."""
        self.policy = policy
        self.tokenizer = tokenizer
        self.max_depth = max_depth
        self.eos = eos_token_ids(target, eos_token_id)
        self.positions = context_positions(target, draft)
        """The positions target and draft attend over (None: no stated limit)."""
        self.clock = Clock(target.device)

    @property
    def drafts(self) -> tuple:
        """Every draft session: the draft's, and the copy drafter's when there is one."""
        return (self.draft,) if self.copy is None else (self.draft, self.copy)

    @abstractmethod
    def _begin(self, prompt_ids: list[int], output: TokenBudget, seed: int | None) -> Generation:
        """A new generation of this decoder's kind (prefilled)."""

    def budget(self, prompt_ids: list[int], max_new_tokens: int) -> TokenBudget:
        """The token budget of a generation: ``max_new_tokens``, or up to the models' positions (checked before any work)."""
        return TokenBudget(max_new_tokens, self.eos, len(prompt_ids), self.positions)

    def start(self, prompt: str | Sequence[int] | torch.Tensor, max_new_tokens: int = 128, seed: int | None = None) -> Generation:
        """Prefill and return a :class:`Generation` to advance step by step (no policy involved)."""
        prompt_ids = prompt_token_ids(prompt, self.tokenizer)
        return self._begin(prompt_ids, self.budget(prompt_ids, max_new_tokens), seed)

    def generate(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        max_new_tokens: int = 128,
        seed: int | None = None,
        on_round: Callable[[RoundStats], None] | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` (fewer where the context fills: stop reason
        ``context``); return tokens, text and statistics. ``on_round`` sees each round as it completes (e.g. to
        stream its tokens); its own time is left out of the generation's."""
        prompt_ids = prompt_token_ids(prompt, self.tokenizer)
        output = self.budget(prompt_ids, max_new_tokens)
        start = self.clock()
        rounds: list[RoundStats] = []
        first_token_time = outside = 0.0
        for stats in self._rounds(prompt_ids, output, seed):
            if not rounds:
                first_token_time = self.clock() - start
            rounds.append(stats)
            if on_round is not None:
                t0 = self.clock()
                on_round(stats)
                outside += self.clock() - t0
        total = self.clock() - start - outside
        prefill = total - sum(r.total_time for r in rounds)
        text = self.tokenizer.decode(output.tokens, skip_special_tokens=True) if self.tokenizer else None
        return GenerationResult(prompt_ids, output.tokens, rounds, prefill, total, output.stop_reason, text, first_token_time)

    def stream(self, prompt: str | Sequence[int] | torch.Tensor, max_new_tokens: int = 128, seed: int | None = None) -> Iterator[RoundStats]:
        """Yield each round's statistics (``.tokens`` holds the emitted ids) as soon as it completes."""
        prompt_ids = prompt_token_ids(prompt, self.tokenizer)
        yield from self._rounds(prompt_ids, self.budget(prompt_ids, max_new_tokens), seed)

    def _rounds(self, prompt_ids: list[int], output: TokenBudget, seed: int | None) -> Iterator[RoundStats]:
        """Run rounds, asking the policy, until ``output`` says stop."""
        clock, policy = self.clock, self.policy
        policy.reset()
        generation = self._begin(prompt_ids, output, seed)
        per_step = getattr(policy, "reads_step_features", True)
        while not generation.done:
            policy_time = generation.choose_source(policy)
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
            size = generation.choose_size(policy, state)
            policy_time += clock() - t0
            stats = generation.verify(size, policy_time)
            t0 = clock()
            policy.observe(stats)
            stats.policy_time += clock() - t0
            yield stats
