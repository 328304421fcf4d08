"""Drafts of every kind behind one interface, chosen in one place.

A decoder drives its draft through a cached session with the same surface as :class:`CachedModel`:
``length`` (tokens consumed), ``forward(token_ids)`` (logits over the target's vocabulary for each fed
token's next token), ``rollback(length)``, ``reset()``, ``begin_round()`` (called as each round starts) and
``can_draft(confirmed)`` (whether the draft can propose after that many confirmed tokens), ``vocabulary`` (the
sorted target ids a reduced-vocabulary draft scores, or None: see :func:`adaptive.sampling.in_vocabulary`); for trees and
batched rollouts also ``forward_masked(token_ids, positions, mask)`` and ``keep(columns)``.
:func:`draft_session` picks the session for a draft:

* a transformers causal LM (the standalone draft): :class:`CachedModel` itself;
* an :class:`~adaptive.eagle3.Eagle3Head`: :class:`HeadSession`, which reads the target's hidden states
  from the target's session (:func:`target_taps` tells the target which layers to keep);
* a :class:`~adaptive.copy_draft.CopyDraft` or :class:`~adaptive.copy_draft.PromptLookupDraft`: their
  sessions in :mod:`adaptive.copy_draft` (no model; chains only).

``deterministic`` says how the decoder draws from a session's logits: False, a sample of their sampling
distribution (greedy: the arg-max); True (the copy drafters), always the arg-max, so q is one-hot under
sampling, and ``match_lengths`` holds the match length behind each row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from adaptive.cached_model import CachedModel, output_vocab_size
from adaptive.copy_draft import MODEL_FREE, CopyDraft, CopySession, PromptLookupDraft, PromptLookupSession
from adaptive.eagle3 import Eagle3Head, rotary
from adaptive.lean import KVCache, open_cache
from adaptive.lean_head import drafting_head

Draft = nn.Module | CopyDraft | PromptLookupDraft
"""Anything that drafts: a transformers causal LM, a distilled draft, an EAGLE-3 head or a copy drafter."""


def target_taps(draft: Draft) -> tuple[int, ...] | None:
    """Target layers whose incoming hidden states the draft reads (None: it reads none)."""
    return tuple(draft.config.layer_ids) if isinstance(draft, Eagle3Head) else None


def draft_session(draft: Draft, target: CachedModel) -> CachedModel | HeadSession | CopySession | PromptLookupSession:
    """The cached session a decoder drives ``draft`` through."""
    if isinstance(draft, MODEL_FREE):
        return draft.session(output_vocab_size(target.model), target.device)
    return HeadSession(draft, target) if isinstance(draft, Eagle3Head) else open_cache(draft)


def teacher_forced(target: nn.Module, draft: Draft, sequence: list[int]) -> tuple[CachedModel | HeadSession | CopySession | PromptLookupSession, torch.Tensor]:
    """A new session of ``draft`` that has read all of ``sequence``, and its logits ``[len, V]`` (row i: the
    draft's next-token logits after token i). A head reads the target's states of one teacher-forced target
    forward over the sequence; its row 0 is -inf (the first token makes no entry)."""
    taps = target_taps(draft)
    if taps and len(sequence) < 3:
        raise ValueError(f"a draft head reads the target's state before each token; give it 3 tokens or more, not {len(sequence)}")
    reading = open_cache(target, taps)
    if taps:
        reading.forward(sequence)
    session = draft_session(draft, reading)
    return session, session.forward(sequence)


def surviving(length: int, first_own: int | None) -> tuple[int, int]:
    """What a head keeps when rolled back to ``length`` tokens: (entries, tokens). Entry i is made from the
    target's state at token i and reads token i + 1; entries from ``first_own`` on were made from the head's
    own states and never survive (the next round remakes them from the target's), nor do the tokens past them."""
    entries = max(0, length - 1) if first_own is None else min(max(0, length - 1), first_own)
    return entries, min(length, entries + 1)


class HeadSession:
    """An EAGLE-3 head decoding one sequence, with its own KV cache.

    Feeding token x_p (p >= 1) adds the head's entry for position p - 1: token x_p with the target's state
    at p - 1 when the target has processed that position (the context), else the head's own output state
    of entry p - 2 (a drafted continuation). Rolling back drops every entry made from the head's own
    states, so that the next round remakes them from the target's states once it has verified them."""

    deterministic = False

    def __init__(self, head: Eagle3Head, target: CachedModel) -> None:
        if target.taps != tuple(head.config.layer_ids):
            raise ValueError(f"the target session keeps layers {target.taps}; this head reads {head.config.layer_ids}")
        self.model = head
        self.net = drafting_head(head)
        """What computes the entries: ``head``, or its low-bit copy under a lean engine."""
        self.own_step = getattr(self.net, "own_step", None)
        """The compiled step of an entry made from the head's own state, where the engine gave one (:class:`~adaptive.lean_head.HeadStep`)."""
        self.target = target
        self.device = head.d2t.device
        self.dtype = head.fc.weight.dtype
        self.vocabulary = head.target_ids
        """Sorted target ids of the columns the head scores (every other logit is -inf)."""
        self.reset()

    def reset(self) -> None:
        config = self.model.config
        self.tokens: list[int] = []
        self.cache = KVCache(1, config.num_key_value_heads, config.head_dim, self.dtype, self.device)
        """Keys and values of every entry (slots ``[0, entries)``; a rollback moves no memory)."""
        self.states = torch.empty(0, self.model.config.hidden_size, dtype=self.dtype, device=self.device)
        """Pre-norm output state of every entry."""
        self.first_own: int | None = None
        """Index of the first entry made from the head's own state (entries before it read the target)."""

    @property
    def length(self) -> int:
        return len(self.tokens)

    def can_draft(self, confirmed: int) -> bool:
        """The head needs the target's state at position confirmed - 2 (so two confirmed tokens at least)."""
        return confirmed >= 2

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Feed tokens; logits ``[n, V]`` over the target vocabulary for each one's entry (a token at
        position 0 makes no entry: its row is -inf). Entries read from the target go through the layer in
        one batch; each one made from the head's own state needs the one before it, so it goes alone."""
        head, token_ids = self.net, [int(t) for t in token_ids]
        rows = []
        if token_ids and not self.tokens:
            self.tokens.append(token_ids.pop(0))
            rows.append(torch.full((1, head.config.vocab_size), float("-inf"), dtype=self.dtype, device=self.device))
        from_target = max(0, min(len(token_ids), self.target.length - (len(self.tokens) - 1)))
        if from_target:
            first = len(self.tokens) - 1
            fused = head.fc(self.target.tapped[first : first + from_target].to(self.dtype))
            rows.append(head.target_logits(self._entries(token_ids[:from_target], fused)))
            self.tokens += token_ids[:from_target]
        for token in token_ids[from_target:]:
            self.first_own = len(self.states) if self.first_own is None else self.first_own
            rows.append(self._own_entry(token))
            self.tokens.append(token)
        return torch.cat(rows)

    @torch.inference_mode()
    def forward_masked(self, token_ids: Sequence[int], positions: Sequence[int], mask: torch.Tensor) -> torch.Tensor:
        """Feed drafted tokens (tree nodes) at the given position ids under an additive attention ``mask``
        ``[1, 1, n, length + n]`` over token slots, as :meth:`CachedModel.forward_masked` takes it; logits
        ``[n, V]``. Each token's entry reads the output state of the entry of the slot it attends to last
        before itself (its parent), all in one batch."""
        if not self.tokens:
            raise ValueError("a masked forward needs a context in the head's cache")
        allowed = mask[0, 0] > torch.finfo(mask.dtype).min / 2
        n, length = len(token_ids), len(self.tokens)
        before_self = allowed[:, : length + n].clone()
        before_self[torch.arange(n), length + torch.arange(n)] = False
        parents = (before_self * torch.arange(length + n, device=allowed.device)).amax(dim=1)  # last slot each token sees
        if bool((parents >= length).any()) or bool((parents < 1).any()):
            raise ValueError("each token fed in one masked forward must attend to a cached token past the first, and not to the others fed with it")
        self.first_own = len(self.states) if self.first_own is None else self.first_own
        positions = torch.tensor(list(positions), device=self.device) - 1  # an entry sits one position before its token
        out = self._entries([int(t) for t in token_ids], self.states[parents - 1], positions, allowed[:, 1:])
        self.tokens += [int(t) for t in token_ids]
        return self.net.target_logits(out)

    def begin_round(self) -> None:
        """A decoding round starts (nothing to do: :meth:`rollback` already dropped the head's own entries)."""

    def keep(self, columns: Sequence[int]) -> None:
        """Keep the leading run of ``columns`` that is the cache's own prefix, and no entry made from the
        head's own states (a tree's accepted path is remade from the target's states next round)."""
        prefix = 0
        while prefix < len(columns) and columns[prefix] == prefix:
            prefix += 1
        self.rollback(min(prefix, self.length))

    def _own_entry(self, token: int) -> torch.Tensor:
        """The entry of a drafted token, made from the last entry's output state; its logits ``[1, V]``. Through the
        head's compiled step where the engine gave it one (:class:`~adaptive.lean_head.HeadStep`)."""
        if self.own_step is None:
            return self.net.target_logits(self._entries([token], self.states[-1:]))
        end = len(self.states) + 1
        self.cache.reserve(end + 1)  # a spare slot, as the lean target's: the step never reads the whole tensor
        out, logits = self.own_step(torch.tensor([token], device=self.device), self.states[-1:], self.cache.keys[0], self.cache.values[0], end)
        self.states = torch.cat((self.states, out))
        return logits

    def _entries(self, tokens: list[int], inputs: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """New entries (tokens with their input states ``[n, H]``) through the layer; returns and keeps their
        output states. By default entry i sits at position (entry index) i and attends to every cached entry,
        the new ones before it and itself; ``positions`` and a boolean ``mask`` ``[n, entries + n]`` say otherwise."""
        head, layer, config = self.net, self.net.midlayer, self.net.config
        first, n = len(self.states), len(tokens)
        if positions is None:
            positions = torch.arange(first, first + n, device=self.device)
            mask = torch.arange(first + n, device=self.device)[None, :] <= positions[:, None]
        cos, sin = rotary(positions, config.head_dim, config.rope_theta, self.dtype)
        embeds = head.embedding(torch.tensor(tokens, device=self.device))
        q, k, v = layer.self_attn.project(layer.inputs(embeds, inputs), cos, sin)
        self.cache.reserve(first + n + 1)
        keys, values = self.cache.keys[0], self.cache.values[0]
        keys[:, first : first + n], values[:, first : first + n] = k, v
        out = layer.finish(inputs, layer.self_attn.attend(q, keys[:, : first + n], values[:, : first + n], mask))
        self.states = torch.cat((self.states, out))
        return out

    def rollback(self, length: int) -> None:
        """Keep at most the first ``length`` tokens, and no entry made from the head's own states."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to length {length}: the head holds {self.length} tokens")
        entries, tokens = surviving(length, self.first_own)
        self.states = self.states[:entries]
        self.tokens = self.tokens[:tokens]
        self.first_own = None
