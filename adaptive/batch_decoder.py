"""Batched speculative decoding (chains): several requests share each draft forward and each verification
forward, and every request stays exact on its own.

A round, for the requests in the batch: a :class:`~adaptive.policy.BatchPolicy` picks one depth d for all
of them (why one: on this hardware a padded forward costs what its widest row costs, so a shallower row
saves nothing; vLLM and SmartSpec choose per batch too); each request drafts d tokens (d batched draft
forwards; a request its draft cannot draft for yet — an EAGLE-3 head after a one-token prompt — drafts
none; a :class:`~adaptive.policy.SteppedBatchPolicy` may stop the whole batch after any step, seeing each
request's top-1 draft probabilities so far), then one target forward verifies every request's drafted tokens; each request accepts with its own
rule — min(1, p/q) with the residual norm(max(p − q, 0)) on rejection, or arg-max agreement when greedy —
with its own random generator, emits, and rolls its own rows of both caches back
(:class:`~adaptive.batched_model.BatchedCachedModel`, or for an EAGLE-3 head
:class:`~adaptive.batched_head.BatchedHeadSession`, which reads the target's hidden states from the
verification forward itself). d = 0 is a plain batched decoding step.

Requests join (prefilled together, then spliced into the batch) and leave (EOS or budget) between rounds:
continuous batching at round boundaries, at most ``max_batch`` at a time, first come first served.

Cache invariant per request, as in :mod:`adaptive.generation`: between rounds the target caches every
confirmed token but the last, the draft at most that many.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from adaptive.batched_head import batched_sessions
from adaptive.eagle3 import Eagle3Head
from adaptive.generation import Clock, TokenBudget, context_positions, eos_token_ids, prompt_token_ids
from adaptive.pair import check_compatible
from adaptive.policy import RECENT_ROUNDS, BatchDraftStep, BatchPolicy, BatchState, asks_each_step
from adaptive.sampling import GREEDY, SamplingConfig, arg_max, check_logits, in_vocabulary, sample, sampling_distribution, target_ids, top1_probabilities
from adaptive.verification import BlockVerdict, CorrectionRule, residual_correction, verify_drafts


@dataclass
class Request:
    """One request: its prompt, output so far, random generator and timings (decoder clock seconds)."""

    id: int
    prompt_ids: list[int]
    output: TokenBudget
    generator: torch.Generator
    submitted_at: float
    tokens: list[int] = field(default_factory=list)
    """Prompt + emitted tokens."""
    started_at: float | None = None
    """When it joined the batch (prefill starts)."""
    token_times: list[float] = field(default_factory=list)
    """When each emitted token was emitted (the end of its round)."""
    accepted: list[int] = field(default_factory=list)
    """Accepted drafted tokens per round."""
    drafted: list[int] = field(default_factory=list)
    """Drafted tokens per round."""

    @property
    def done(self) -> bool:
        return bool(self.output.stop_reason)


@dataclass(frozen=True)
class BatchRound:
    """One batched round, as measured."""

    requests: tuple[int, ...]
    """Ids of the requests decoded in it, in batch order."""
    depth: int
    accepted: tuple[int, ...]
    emitted: tuple[int, ...]
    draft_time: float
    verify_time: float
    policy_time: float
    admit_time: float
    """Prefill of the requests that joined before the round."""

    @property
    def total_time(self) -> float:
        return self.draft_time + self.verify_time + self.policy_time + self.admit_time


@dataclass(frozen=True)
class RequestResult:
    """A finished request: its output and when things happened (seconds on the decoder's clock)."""

    id: int
    prompt_ids: list[int]
    token_ids: list[int]
    stop_reason: str
    submitted_at: float
    started_at: float
    token_times: list[float]
    accepted: list[int]
    drafted: list[int]
    text: str | None = None

    @property
    def first_token_latency(self) -> float:
        """TTFT: from submission to the first emitted token."""
        return self.token_times[0] - self.submitted_at if self.token_times else float("nan")

    @property
    def latency(self) -> float:
        """End to end: from submission to the last token."""
        return self.token_times[-1] - self.submitted_at if self.token_times else float("nan")

    @property
    def inter_token_latencies(self) -> list[float]:
        """Gaps between consecutive tokens (tokens of one round arrive together: gap 0)."""
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


class BatchedSpeculativeDecoder:
    """Continuous-batching speculative decoder over a target and a standalone draft model or an EAGLE-3 head.

    Args:
        target: the model whose output distribution each request keeps.
        draft: a cheaper transformers causal LM with the same vocabulary, or an
            :class:`~adaptive.eagle3.Eagle3Head` for the target.
        policy: picks each round's depth for the whole batch (:mod:`policies.batch`).
        sampling: applied identically to target and draft; default greedy.
        tokenizer: optional; enables text prompts and text output.
        max_depth: cap on drafted tokens per round.
        max_batch: requests decoded at once; more wait in the queue.
        eos_token_id: stop token(s); default from the target's generation config.
        correction: the rule used at a rejection; keep the default (exact residual) except to audit.
        clock: what its timings read (seconds); default the wall clock, after queued GPU work. A load test that
            lets decoders take turns gives each one a clock that runs only in its own turns.

    Example:
        >>> decoder = BatchedSpeculativeDecoder(target, draft, FixedBatchDepth(3), max_batch=8)  # doctest: +SKIP
        >>> results = decoder.generate(["Ciao", "Hello"], max_new_tokens=64)  # doctest: +SKIP
    """

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | Eagle3Head,
        policy: BatchPolicy,
        sampling: SamplingConfig = GREEDY,
        *,
        tokenizer=None,
        max_depth: int = 8,
        max_batch: int = 8,
        eos_token_id: int | Sequence[int] | None = None,
        correction: CorrectionRule = residual_correction,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not isinstance(draft, PreTrainedModel | Eagle3Head):
            raise ValueError(f"batched decoding drafts with a standalone draft model (a transformers causal LM) or an EAGLE-3 head, got {type(draft).__name__}")
        check_compatible(target, draft, tokenizer, None)
        if max_depth < 0 or max_batch < 1:
            raise ValueError(f"max_depth must be >= 0 and max_batch >= 1, got {max_depth} and {max_batch}")
        if not isinstance(policy, BatchPolicy):
            raise TypeError(f"policy must implement BatchPolicy (depth(state) -> int), got {policy!r}")
        self.target, self.draft = batched_sessions(target, draft)
        self.policy, self.sampling, self.tokenizer = policy, sampling, tokenizer
        self.max_depth, self.max_batch = max_depth, max_batch
        self.eos = eos_token_ids(target, eos_token_id)
        self.positions = context_positions(target, draft)
        """The positions target and draft attend over (None: no stated limit); a request stops when it fills them."""
        self.correction = correction
        self.clock = clock if clock is not None else Clock(target.device)
        self.queue: deque[Request] = deque()
        self.batch: list[Request] = []
        """Requests decoding now; request ``batch[b]`` owns row b of both caches."""
        self.finished: dict[int, RequestResult] = {}
        self._next_id = 0

    # --- requests --------------------------------------------------------------------------------------

    def submit(self, prompt: str | Sequence[int] | torch.Tensor, max_new_tokens: int = 128, seed: int | None = None, at: float | None = None) -> int:
        """Queue a request (``at``: its submission time on :attr:`clock`, default now); returns its id."""
        ids = prompt_token_ids(prompt, self.tokenizer)
        generator = torch.Generator(device=self.target.device)
        generator.manual_seed(seed if seed is not None else self._next_id)
        budget = TokenBudget(max_new_tokens, self.eos, len(ids), self.positions)
        request = Request(self._next_id, ids, budget, generator, self.clock() if at is None else at, list(ids))
        self.queue.append(request)
        self._next_id += 1
        return request.id

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing decoding."""
        return not self.queue and not self.batch

    def generate(self, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 128, seeds: Sequence[int] | None = None) -> list[RequestResult]:
        """Decode every prompt (``max_batch`` at a time) and return their results in order."""
        ids = [self.submit(p, max_new_tokens, None if seeds is None else seeds[i]) for i, p in enumerate(prompts)]
        while not self.idle:
            self.step()
        return [self.finished.pop(i) for i in ids]

    # --- rounds ----------------------------------------------------------------------------------------

    def step(self) -> BatchRound | None:
        """Admit queued requests into free slots, then run one round for the batch (None when idle)."""
        admit_time = self._admit()
        if not self.batch:
            return None
        clock = self.clock
        t0 = clock()
        state = BatchState(
            len(self.batch),
            len(self.queue),
            self.max_depth,
            tuple(tuple(r.accepted[-RECENT_ROUNDS:]) for r in self.batch),
            tuple(tuple(r.drafted[-RECENT_ROUNDS:]) for r in self.batch),
        )
        depth = self.policy.depth(state)
        if not 0 <= depth <= self.max_depth:
            raise ValueError(f"batch policy {self.policy.name!r} chose depth {depth}; allowed: 0..{self.max_depth}")
        policy_time = clock() - t0
        if self.positions is not None:  # no forward may reach past the last position: near it, the batch drafts less
            depth = min(depth, min(self.positions - len(r.tokens) for r in self.batch) - 1)
        drafted, q_rows, step_policy_time = self._draft(depth, state)
        policy_time += step_policy_time
        draft_time = clock() - t0 - policy_time
        depth = max(map(len, drafted), default=0) or depth  # a stepped policy may have stopped the batch earlier
        t1 = clock()
        contexts = [len(r.tokens) for r in self.batch]
        logits = self.target.forward([r.tokens[self.target.lengths[b] :] + drafted[b] for b, r in enumerate(self.batch)])
        accepted, emitted = [], []
        for b, request in enumerate(self.batch):
            verdict = self._verify(request, logits[b][-(len(drafted[b]) + 1) :], drafted[b], q_rows[b] if q_rows else None)
            count = verdict.accepted
            new = request.output.emit(drafted[b][:count] + [verdict.next_token])
            request.tokens.extend(new)
            self.target.rollback(b, contexts[b] + count)
            self.draft.rollback(b, min(self.draft.lengths[b], contexts[b] + count))
            request.accepted.append(count)
            request.drafted.append(len(drafted[b]))
            accepted.append(count)
            emitted.append(len(new))
        now = clock()
        for request, n in zip(self.batch, emitted):
            request.token_times += [now] * n
        round_ = BatchRound(tuple(r.id for r in self.batch), depth, tuple(accepted), tuple(emitted), draft_time, now - t1, policy_time, admit_time)
        self._retire()
        return round_

    def _admit(self) -> float:
        """Prefill queued requests into free slots, together (both models cache every prompt token but the last)."""
        t0 = self.clock()
        joining = [self.queue.popleft() for _ in range(min(len(self.queue), self.max_batch - len(self.batch)))]
        if joining:
            for model in (self.target, self.draft):
                model.add_rows([request.tokens[:-1] for request in joining])
            for request in joining:
                request.started_at = t0
            self.batch += joining
        return self.clock() - t0

    def _draft(self, depth: int, state: BatchState) -> tuple[list[list[int]], list[list[torch.Tensor]], float]:
        """Up to ``depth`` tokens per request the draft can draft for (none for the others), all requests in one
        draft forward per step, fewer when a stepped policy stops the batch; with sampling also the draft
        distributions q they were drawn from; and the seconds the policy's per-step decisions took."""
        drafted: list[list[int]] = [[] for _ in self.batch]
        q_rows: list[list[torch.Tensor]] = [[] for _ in self.batch] if not self.sampling.is_greedy else []
        drafting = [b for b, r in enumerate(self.batch) if self.draft.can_draft(len(r.tokens))]
        if depth == 0 or not drafting:
            return drafted, q_rows, 0.0
        stepped = asks_each_step(self.policy)
        top1: list[list[float]] = [[] for _ in self.batch]
        policy_time = 0.0
        feeds = [r.tokens[self.draft.lengths[b] :] if b in drafting else [] for b, r in enumerate(self.batch)]
        for k in range(depth):
            outputs = self.draft.forward(feeds)
            rows = torch.stack([outputs[b][-1] for b in drafting])
            if self.sampling.is_greedy:
                check_logits(rows)
                vocabulary = self.draft.vocabulary
                tokens = target_ids(arg_max(in_vocabulary(rows, vocabulary)), vocabulary).tolist()
            else:
                q = sampling_distribution(rows, self.sampling)
                tokens = [int(sample(q[i], self.batch[b].generator)) for i, b in enumerate(drafting)]
                for i, b in enumerate(drafting):
                    q_rows[b].append(q[i])
            feeds = [[] for _ in self.batch]
            for b, token in zip(drafting, tokens):
                drafted[b].append(token)
                feeds[b] = [token]
            if stepped and k + 1 < depth:
                t0 = self.clock()
                for b, p in zip(drafting, top1_probabilities(rows, self.draft.vocabulary)):
                    top1[b].append(p)
                go_on = self.policy.should_continue(state, BatchDraftStep(k + 1, tuple(map(tuple, top1))))
                policy_time += self.clock() - t0
                if not go_on:
                    break
        return drafted, q_rows, policy_time

    def _verify(self, request: Request, target_logits: torch.Tensor, drafted: list[int], q_rows: list[torch.Tensor] | None) -> BlockVerdict:
        """Verify one request's drafted tokens against its ``len(drafted) + 1`` target rows, with its own
        generator: how many it accepts and the token that follows them (the residual draw or the bonus)."""
        ids = torch.tensor(drafted, dtype=torch.long, device=target_logits.device)
        return verify_drafts(target_logits, ids, q_rows or [], self.sampling, request.generator, self.correction)

    def _retire(self) -> None:
        """Move finished requests out of the batch (and their rows out of both caches)."""
        done = [b for b, r in enumerate(self.batch) if r.done]
        if not done:
            return
        for model in (self.target, self.draft):
            model.remove_rows(done)
        for b in done:
            r = self.batch[b]
            text = self.tokenizer.decode(r.output.tokens, skip_special_tokens=True) if self.tokenizer else None
            self.finished[r.id] = RequestResult(
                r.id, r.prompt_ids, r.output.tokens, r.output.stop_reason, r.submitted_at, r.started_at, r.token_times, r.accepted, r.drafted, text
            )
        self.batch = [r for b, r in enumerate(self.batch) if b not in set(done)]
