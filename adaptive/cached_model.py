"""A causal LM together with its KV cache: feed tokens, read logits, roll back.

One integer, :attr:`CachedModel.length`, says how many tokens the cache holds; rolling back means cropping
the cache to a shorter length. The wrapper hides the one place where transformers releases differ (the
cache keyword of ``forward``).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel


def cache_keyword(model: PreTrainedModel) -> str:
    """``cache`` in recent transformers releases, ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_vocab_size(model: PreTrainedModel) -> int:
    """Number of logits the model produces per position."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "out_features"):  # nn.Linear, or a reduced-vocabulary SubsetHead
        return int(head.out_features)
    return int(model.config.vocab_size)


def output_vocabulary(model: PreTrainedModel) -> torch.Tensor | None:
    """The sorted target ids a reduced-vocabulary output head (a SubsetHead) scores, or None when it scores
    every column (or its ids are not sorted): what :func:`adaptive.sampling.in_vocabulary` takes."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    ids = getattr(head, "token_ids", None)
    if ids is None or len(ids) < 2 or not bool((ids[1:] > ids[:-1]).all()):
        return None
    return ids


class CachedModel:
    """Wraps a transformers causal LM and one DynamicCache for batch-1 incremental decoding.

    With ``taps`` (layer indices, HF ``hidden_states[i]``: the residual stream entering layer i) it also
    keeps those hidden states of every cached position, concatenated, in :attr:`tapped` ``[length, k·H]``
    (what a feature-conditioned draft reads), rolled back with the cache."""

    deterministic = False
    """A sample of the sampling distribution of its logits is its proposal (see :mod:`adaptive.drafts`)."""

    def __init__(self, model: PreTrainedModel, taps: tuple[int, ...] | None = None) -> None:
        self.model = model
        self.device = model.device
        self.dtype = next(model.parameters()).dtype
        self.cache_keyword = cache_keyword(model)
        self.taps = taps
        self.vocabulary = output_vocabulary(model)
        """Sorted target ids of the columns the model scores, the others -inf (None: it scores all)."""
        self.reset()

    def reset(self) -> None:
        """Drop the whole cache (start a new sequence)."""
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0
        self.tapped = torch.empty(0, 0, dtype=self.dtype, device=self.device)

    def can_draft(self, confirmed: int) -> bool:
        """A standalone draft can propose after any context."""
        return True

    def _keep_taps(self, output) -> None:
        if self.taps:
            new = torch.cat([output.hidden_states[i][0] for i in self.taps], dim=-1)
            self.tapped = new if self.tapped.numel() == 0 else torch.cat((self.tapped, new))

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Append ``token_ids`` after the cached prefix; return their logits ``[len(token_ids), V]``."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        output = self.model(input_ids=ids, use_cache=True, output_hidden_states=bool(self.taps), **{self.cache_keyword: self.cache})
        self.length += len(token_ids)
        self._keep_taps(output)
        return output.logits[0]

    @torch.inference_mode()
    def forward_masked(self, token_ids: Sequence[int], positions: Sequence[int], mask: torch.Tensor) -> torch.Tensor:
        """Append ``token_ids`` at the given position ids under a custom additive attention ``mask``
        ``[1, 1, n, length + n]`` (draft trees); return their logits ``[n, V]``."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        position_ids = torch.tensor([list(positions)], dtype=torch.long, device=self.device)
        output = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            output_hidden_states=bool(self.taps),
            **{self.cache_keyword: self.cache},
        )
        self.length += len(token_ids)
        self._keep_taps(output)
        return output.logits[0]

    def keep(self, columns: Sequence[int]) -> None:
        """Keep only the cache entries at ``columns`` (in that order): a tree's accepted path after its context."""
        if any(not 0 <= c < self.length for c in columns):
            raise ValueError(f"cache columns must lie in [0, {self.length}), got {list(columns)}")
        if list(columns) == list(range(len(columns))):
            self.rollback(len(columns))
            return
        index = torch.tensor(list(columns), dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
        if self.taps:
            self.tapped = self.tapped.index_select(0, index)
        self.length = len(columns)

    def begin_round(self) -> None:
        """A decoding round starts (nothing to do: a model's proposals depend on the tokens alone)."""

    def rollback(self, length: int) -> None:
        """Discard cached entries past ``length`` (keep the first ``length`` tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to length {length}: the cache holds {self.length} tokens")
        if length < self.length:
            self.cache.crop(length - self.length)  # a negative argument removes that many entries
            self.length = length
            self.tapped = self.tapped[:length]
