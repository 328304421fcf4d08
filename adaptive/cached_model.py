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
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "out_features"):  # nn.Linear, or a reduced-vocabulary SubsetHead
        return int(head.out_features)
    return int(model.config.vocab_size)


class CachedModel:
    """Wraps a transformers causal LM and one DynamicCache for batch-1 incremental decoding."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.device = model.device
        self.dtype = next(model.parameters()).dtype
        self.cache_keyword = cache_keyword(model)
        self.cache = DynamicCache(config=model.config)
        self.length = 0

    def reset(self) -> None:
        """Drop the whole cache (start a new sequence)."""
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Append ``token_ids`` after the cached prefix; return their logits ``[len(token_ids), V]``."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        output = self.model(input_ids=ids, use_cache=True, **{self.cache_keyword: self.cache})
        self.length += len(token_ids)
        return output.logits[0]

    @torch.inference_mode()
    def forward_masked(self, token_ids: Sequence[int], positions: Sequence[int], mask: torch.Tensor) -> torch.Tensor:
        """Append ``token_ids`` at the given position ids under a custom additive attention ``mask``
        ``[1, 1, n, length + n]`` (draft trees); return their logits ``[n, V]``."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        position_ids = torch.tensor([list(positions)], dtype=torch.long, device=self.device)
        output = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True, **{self.cache_keyword: self.cache})
        self.length += len(token_ids)
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
        self.length = len(columns)

    def rollback(self, length: int) -> None:
        """Discard cached entries past ``length`` (keep the first ``length`` tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to length {length}: the cache holds {self.length} tokens")
        if length < self.length:
            self.cache.crop(length - self.length)  # a negative argument removes that many entries
            self.length = length
