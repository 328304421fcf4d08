"""A causal LM decoding several sequences at once: one forward for every row, each row its own length.

Rows share one KV cache ``[B, heads, C, head_dim]`` per layer. A forward feeds each row its own tokens
(``n_b`` of them, padded to the longest; padding is never attended to), at the row's own positions, under a
4-D attention mask built from which cache columns hold each row's entries (:attr:`BatchedCachedModel.valid`).
Rolling a row back hides its dropped entries instead of moving memory: the columns stay, masked, as holes,
until :meth:`BatchedCachedModel.compact` packs every row's entries to the left (done when holes pile up).
Rows join (prefilled together, apart from the rows already decoding, then spliced in) and leave between
forwards.

Positions count a row's own entries, so a row sees exactly what the same sequence decoded alone would see:
the same tokens at the same positions, nothing else.

On a model with a lean engine attached (:func:`~adaptive.lean.make_lean`) the forward is the lean one
(:meth:`~adaptive.lean.LeanLlama.batched`: its low-bit weights; under a compiled engine every forward after the rows'
prefill runs on one compiled graph), else transformers'.

With ``taps`` (as :class:`~adaptive.cached_model.CachedModel` takes them) each row also keeps the hidden
states entering those layers at each of its positions, :attr:`BatchedCachedModel.tapped` (what a batched
EAGLE-3 head reads), rolled back with the row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from adaptive.cached_model import cache_keyword, output_vocabulary
from adaptive.lean import BatchedLeanCache, compile_batched

COMPACT_SLACK = 64
"""Compact once the cache holds this many more columns than the longest row's entries (and twice as many)."""


class BatchedCachedModel:
    """A transformers causal LM and one batched KV cache; rows are addressed by their index (0..rows-1)."""

    def __init__(self, model: PreTrainedModel, taps: tuple[int, ...] | None = None) -> None:
        self.model = model
        self.taps = taps
        self.device = model.device
        self.dtype = next(model.parameters()).dtype
        self.engine = getattr(model, "lean_engine", None)
        """The lean forward :func:`~adaptive.lean.make_lean` attached (a compiled one's batched forward compiled now,
        once per engine), else None: transformers' forward."""
        if self.engine is not None:
            compile_batched(self.engine)
        self.cache_keyword = cache_keyword(model)
        self.vocabulary = output_vocabulary(model)
        """Sorted target ids of the columns the model scores, the others -inf (None: it scores all)."""
        self.cache = self._new_cache()
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)
        """``[rows, columns]``: which cache columns hold each row's entries."""
        self.lengths: list[int] = []
        """Entries per row (its sequence length so far)."""
        self.tapped: list[torch.Tensor] = []
        """With taps: per row, the tapped states of its positions ``[length, k·H]``."""

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def columns(self) -> int:
        return int(self.valid.shape[1])

    def can_draft(self, confirmed: int) -> bool:
        """As a standalone draft: it can propose after any context."""
        return True

    def add_rows(self, token_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """New last rows holding ``token_ids[i]`` each, prefilled together (apart from the rows already here,
        then spliced in); returns each one's logits ``[n_i, V]``."""
        newcomers = BatchedCachedModel(self.model, self.taps)
        newcomers.valid = torch.zeros(len(token_ids), 0, dtype=torch.bool, device=self.device)
        newcomers.lengths = [0] * len(token_ids)
        newcomers.tapped = [self._no_taps() for _ in token_ids] if self.taps else []
        logits = newcomers.forward(token_ids)
        self._append(newcomers)
        return logits

    @torch.inference_mode()  # the cache stays inference tensors: a compiled forward's inputs keep one kind
    def _append(self, other: BatchedCachedModel) -> None:
        """Put ``other``'s rows after these (the cache widened to the wider of the two)."""
        width = max(self.columns, other.columns)
        self._widen(width)
        other._widen(width)
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            template = mine if _holds(mine) else theirs if _holds(theirs) else None
            if template is None:  # no row holds an entry yet
                continue
            old = (mine.keys, mine.values) if _holds(mine) else _holes(template, self.rows, width)
            new = (theirs.keys, theirs.values) if _holds(theirs) else _holes(template, other.rows, width)
            _store(mine, torch.cat((old[0], new[0])), torch.cat((old[1], new[1])))
        self.valid = torch.cat((self.valid.reshape(self.rows, width), other.valid.reshape(other.rows, width)))
        self.lengths += other.lengths
        self.tapped += other.tapped

    @torch.inference_mode()  # the cache stays inference tensors: a compiled forward's inputs keep one kind
    def remove_rows(self, rows: Sequence[int]) -> None:
        """Drop ``rows``; the others keep their order (and are renumbered 0..)."""
        keep = [r for r in range(self.rows) if r not in set(rows)]
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            if _holds(layer):
                _store(layer, layer.keys.index_select(0, index), layer.values.index_select(0, index))
        self.valid = self.valid.index_select(0, index)
        self.lengths = [self.lengths[r] for r in keep]
        self.tapped = [self.tapped[r] for r in keep] if self.taps else []
        if not keep:
            self.cache = self._new_cache()
            self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)

    @torch.inference_mode()
    def forward(self, feeds: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Append ``feeds[b]`` to row b (every row, possibly nothing); return each row's logits ``[n_b, V]``."""
        if len(feeds) != self.rows:
            raise ValueError(f"give one list of tokens per row: {self.rows} rows, got {len(feeds)}")
        n = max(map(len, feeds), default=0)
        if n == 0:
            return [torch.empty(0, 0, device=self.device) for _ in feeds]
        counts = torch.tensor([len(f) for f in feeds], device=self.device)
        ids = torch.tensor([list(f) + [0] * (n - len(f)) for f in feeds], dtype=torch.long, device=self.device)
        positions = torch.tensor(self.lengths, device=self.device)[:, None] + torch.arange(n, device=self.device)[None, :]
        new = torch.arange(n, device=self.device)[None, :] < counts[:, None]
        if self.engine is not None:
            logits, hidden = self.engine.batched(ids, positions, self.cache.layers, self._allowed(new), self.taps or ())
        else:
            output = self.model(
                input_ids=ids,
                attention_mask=self._mask(new),
                position_ids=positions,
                use_cache=True,
                output_hidden_states=bool(self.taps),
                **{self.cache_keyword: self.cache},
            )
            logits, hidden = output.logits, [output.hidden_states[i] for i in self.taps or ()]
        self.valid = torch.cat((self.valid, new), dim=1)
        self.lengths = [length + len(f) for length, f in zip(self.lengths, feeds)]
        if self.taps:
            states = torch.cat(hidden, dim=-1)
            self.tapped = [torch.cat((kept, states[b, : len(f)])) for b, (kept, f) in enumerate(zip(self.tapped, feeds))]
        return [logits[b, : len(f)] for b, f in enumerate(feeds)]

    def rollback(self, row: int, length: int) -> None:
        """Keep the first ``length`` entries of ``row`` (the rest become holes)."""
        if not 0 <= length <= self.lengths[row]:
            raise ValueError(f"cannot roll row {row} back to length {length}: it holds {self.lengths[row]} tokens")
        if length < self.lengths[row]:
            keep = torch.ones_like(self.valid)
            keep[row] = self.valid[row].cumsum(0) <= length
            self.valid = self.valid & keep
            self.lengths[row] = length
            if self.taps:
                self.tapped[row] = self.tapped[row][:length]
            if self.columns > max(2 * max(self.lengths), max(self.lengths) + COMPACT_SLACK):
                self.compact()

    @torch.inference_mode()  # the cache stays inference tensors: a compiled forward's inputs keep one kind
    def compact(self) -> None:
        """Pack every row's entries into the first columns (in order), dropping the holes."""
        width = max(self.lengths, default=0)
        order = torch.sort((~self.valid).to(torch.int8), dim=1, stable=True).indices[:, :width]  # valid columns first, in order
        for layer in self.cache.layers:
            if not _holds(layer):
                continue
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            _store(layer, layer.keys.gather(2, index), layer.values.gather(2, index))
        self.valid = torch.arange(width, device=self.device)[None, :] < torch.tensor(self.lengths, device=self.device)[:, None]

    def _no_taps(self) -> torch.Tensor:
        """A new row's tapped states: none yet."""
        return torch.empty(0, len(self.taps or ()) * self.model.config.hidden_size, dtype=self.dtype, device=self.device)

    def _widen(self, width: int) -> None:
        """At least ``width`` columns in every row (new ones are holes)."""
        if width <= self.columns:
            return
        for layer in self.cache.layers:
            if _holds(layer):
                _store(layer, _pad_columns(layer.keys, width), _pad_columns(layer.values, width))
        self.valid = torch.nn.functional.pad(self.valid, (0, width - self.columns), value=False)

    def _allowed(self, new: torch.Tensor) -> torch.Tensor:
        """Which columns each new token may attend to, ``[rows, n, columns + n]``: new token i of row b sees b's entries
        and b's new tokens up to i; a padding token sees itself only (its output is dropped)."""
        rows, n = new.shape
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        allowed = torch.cat((self.valid[:, None, :].expand(rows, n, -1), causal[None] & new[:, None, :]), dim=2)
        allowed[:, torch.arange(n), self.columns + torch.arange(n)] = True
        return allowed

    def _mask(self, new: torch.Tensor) -> torch.Tensor:
        """:meth:`_allowed` as transformers takes it: additive, ``[rows, 1, n, columns + n]``."""
        allowed = self._allowed(new)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return mask[:, None]

    def _new_cache(self) -> DynamicCache | BatchedLeanCache:
        """An empty cache for the forward the model runs through."""
        return DynamicCache(config=self.model.config) if self.engine is None else BatchedLeanCache(self.model.config.num_hidden_layers)


def _holds(layer) -> bool:
    """Whether a cache layer holds tensors yet (transformers creates them at the first update)."""
    return getattr(layer, "keys", None) is not None and layer.keys.numel() > 0


def _holes(layer, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value tensors of ``rows`` rows and ``width`` columns, all holes, shaped like ``layer``'s."""
    keys = layer.keys.new_zeros(rows, layer.keys.shape[1], width, layer.keys.shape[3])
    return keys, keys.clone()


def _store(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Set a cache layer's tensors (marking it initialised, so that transformers appends to them)."""
    layer.keys, layer.values = keys, values
    layer.is_initialized, layer.device = True, keys.device


def _pad_columns(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``[B, H, C, D]`` padded with zeros to ``width`` columns."""
    return torch.nn.functional.pad(tensor, (0, 0, 0, width - tensor.shape[2]))
