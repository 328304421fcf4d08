"""An EAGLE-3 head drafting for several sequences at once: the batched decoder's draft session for a head.

The same surface as :class:`~adaptive.batched_model.BatchedCachedModel` (rows, ``lengths``, ``add_rows``,
``forward``, ``rollback``, ``remove_rows``) and, row by row, the same entries as
:class:`~adaptive.drafts.HeadSession`: feeding token x_p (p >= 1) adds the head's entry for position p - 1,
made from the target's state at p - 1 when the target has processed it (read from the batched target's
:attr:`~adaptive.batched_model.BatchedCachedModel.tapped`), else from the head's own output state of the
entry before (a drafted continuation); rolling back drops every entry made from the head's own states.

Entries of all rows go through the head's layer together: each row's new entries are padded to the longest,
at the row's own positions, attending to the row's own entries only. A row's entries are contiguous (a
rollback only drops its last ones), so its keys and values sit in the first columns of one padded cache.
Entries made from the head's own states need the entry before them: a forward runs a pass per such entry.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from adaptive.batched_model import BatchedCachedModel
from adaptive.drafts import surviving, target_taps
from adaptive.eagle3 import Eagle3Head, rotary
from adaptive.lean_head import drafting_head


def batched_sessions(target: nn.Module, draft: nn.Module) -> tuple[BatchedCachedModel, BatchedCachedModel | BatchedHeadSession]:
    """The batched target session (keeping the hidden states a head reads) and the draft's batched session."""
    reading = BatchedCachedModel(target, taps=target_taps(draft))
    return reading, BatchedHeadSession(draft, reading) if isinstance(draft, Eagle3Head) else BatchedCachedModel(draft)


class BatchedHeadSession:
    """An :class:`~adaptive.eagle3.Eagle3Head` and its cache for the rows of a batched target session."""

    def __init__(self, head: Eagle3Head, target: BatchedCachedModel) -> None:
        if target.taps != tuple(head.config.layer_ids):
            raise ValueError(f"the batched target keeps layers {target.taps}; this head reads {head.config.layer_ids}")
        self.model, self.target = head, target
        self.net = drafting_head(head)
        """What computes the entries: ``head``, or its low-bit copy under a lean engine."""
        self.device, self.dtype = head.d2t.device, head.fc.weight.dtype
        self.vocabulary = head.target_ids
        """Sorted target ids of the columns the head scores (every other logit is -inf)."""
        config = head.config
        self.keys = torch.zeros(0, config.num_key_value_heads, 0, config.head_dim, dtype=self.dtype, device=self.device)
        self.values = self.keys.clone()
        self.tokens: list[list[int]] = []
        """Per row, the tokens fed (its length)."""
        self.states: list[torch.Tensor] = []
        """Per row, the pre-norm output state of each entry ``[entries, H]``."""
        self.first_own: list[int | None] = []
        """Per row, the first entry made from the head's own state (None: all read the target)."""

    @property
    def rows(self) -> int:
        return len(self.tokens)

    @property
    def lengths(self) -> list[int]:
        return [len(tokens) for tokens in self.tokens]

    def can_draft(self, confirmed: int) -> bool:
        """The head needs the target's state at position confirmed - 2 (so two confirmed tokens at least)."""
        return confirmed >= 2

    def add_rows(self, token_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """New last rows fed ``token_ids[i]`` each (the target's rows for them must be there already)."""
        count = len(token_ids)
        self.keys = torch.cat((self.keys, self.keys.new_zeros(count, *self.keys.shape[1:])))
        self.values = torch.cat((self.values, self.values.new_zeros(count, *self.values.shape[1:])))
        self.tokens += [[] for _ in range(count)]
        self.states += [torch.empty(0, self.model.config.hidden_size, dtype=self.dtype, device=self.device) for _ in range(count)]
        self.first_own += [None] * count
        feeds = [[] for _ in range(self.rows - count)] + [list(ids) for ids in token_ids]
        return self.forward(feeds)[-count:] if count else []

    def remove_rows(self, rows: Sequence[int]) -> None:
        """Drop ``rows``; the others keep their order."""
        keep = [r for r in range(self.rows) if r not in set(rows)]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.keys, self.values = self.keys.index_select(0, index), self.values.index_select(0, index)
        self.tokens = [self.tokens[r] for r in keep]
        self.states = [self.states[r] for r in keep]
        self.first_own = [self.first_own[r] for r in keep]

    def rollback(self, row: int, length: int) -> None:
        """Keep at most the first ``length`` tokens of ``row``, and no entry made from the head's own states."""
        if not 0 <= length <= len(self.tokens[row]):
            raise ValueError(f"cannot roll row {row} back to length {length}: it holds {len(self.tokens[row])} tokens")
        entries, tokens = surviving(length, self.first_own[row])
        self.states[row] = self.states[row][:entries]
        self.tokens[row] = self.tokens[row][:tokens]
        self.first_own[row] = None

    @torch.inference_mode()
    def forward(self, feeds: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Feed ``feeds[b]`` to row b; each row's logits ``[n_b, V]`` over the target vocabulary (a row's
        very first token makes no entry: its row is -inf)."""
        if len(feeds) != self.rows:
            raise ValueError(f"give one list of tokens per row: {self.rows} rows, got {len(feeds)}")
        pending = [[int(t) for t in feed] for feed in feeds]
        logits: list[list[torch.Tensor]] = [[] for _ in feeds]
        for b, tokens in enumerate(pending):
            if tokens and not self.tokens[b]:
                self.tokens[b].append(tokens.pop(0))
                logits[b].append(torch.full((1, self.model.config.vocab_size), float("-inf"), dtype=self.dtype, device=self.device))
        while any(pending):
            for b, out in self._pass(pending).items():
                logits[b].append(out)
        empty = torch.empty(0, self.model.config.vocab_size, dtype=self.dtype, device=self.device)
        return [torch.cat(rows) if rows else empty for rows in logits]

    def _pass(self, pending: list[list[int]]) -> dict[int, torch.Tensor]:
        """One batched pass: per row, every pending token whose entry reads the target's state, or else the
        next one, made from the head's last output state. Consumes them from ``pending``; returns logits."""
        head = self.net
        tokens, inputs = [], []
        for b, feed in enumerate(pending):
            entries = len(self.states[b])
            from_target = max(0, min(len(feed), self.target.lengths[b] - entries))
            if from_target:
                tokens.append(feed[:from_target])
                inputs.append(head.fc(self.target.tapped[b][entries : entries + from_target].to(self.dtype)))
            elif feed:
                self.first_own[b] = entries if self.first_own[b] is None else self.first_own[b]
                tokens.append(feed[:1])
                inputs.append(self.states[b][-1:])
            else:
                tokens.append([])
                inputs.append(self.states[b][:0])
            del feed[: len(tokens[-1])]
        outputs = self._entries(tokens, inputs)
        for b, fed in enumerate(tokens):
            self.tokens[b] += fed
        filled = [b for b, out in enumerate(outputs) if len(out)]
        logits = head.target_logits(torch.cat([outputs[b] for b in filled])).split([len(outputs[b]) for b in filled])  # one product for all rows
        return dict(zip(filled, logits, strict=True))

    def _entries(self, tokens: list[list[int]], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """New entries of every row (``tokens[b]`` with input states ``inputs[b]`` ``[n_b, H]``) through the
        layer in one padded batch; keeps and returns each row's output states."""
        head, layer, config = self.net, self.net.midlayer, self.net.config
        rows, width = self.rows, max(map(len, tokens))
        counts = torch.tensor([len(t) for t in tokens], device=self.device)
        first = torch.tensor([len(s) for s in self.states], device=self.device)
        ids = torch.tensor([t + [0] * (width - len(t)) for t in tokens], dtype=torch.long, device=self.device)
        states = torch.zeros(rows, width, config.hidden_size, dtype=self.dtype, device=self.device)
        for b, x in enumerate(inputs):
            states[b, : len(x)] = x
        positions = first[:, None] + torch.arange(width, device=self.device)[None, :]  # entry e sits at position e
        cos, sin = rotary(positions, config.head_dim, config.rope_theta, self.dtype)
        q, k, v = layer.self_attn.project(layer.inputs(head.embedding(ids), states), cos, sin)
        columns = int((first + counts).max())
        if columns > self.keys.shape[2]:
            pad = (0, 0, 0, columns - self.keys.shape[2])
            self.keys, self.values = torch.nn.functional.pad(self.keys, pad), torch.nn.functional.pad(self.values, pad)
        new = torch.arange(width, device=self.device)[None, :] < counts[:, None]
        row_index, slot = new.nonzero(as_tuple=True)
        self.keys[row_index, :, first[row_index] + slot] = k[row_index, :, slot]
        self.values[row_index, :, first[row_index] + slot] = v[row_index, :, slot]
        mask = torch.arange(columns, device=self.device)[None, None, :] <= positions[:, :, None]  # own entries up to itself
        out = layer.finish(states, layer.self_attn.attend(q, self.keys[:, :, :columns], self.values[:, :, :columns], mask[:, None]))
        kept = [out[b, : len(t)] for b, t in enumerate(tokens)]
        self.states = [torch.cat((s, o)) for s, o in zip(self.states, kept)]
        return kept
