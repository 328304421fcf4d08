"""The project's draft: a few transformer layers and a reduced output vocabulary, sharing the target's
tokenizer and input embeddings.

The draft's output layer scores only a subset S of the vocabulary (the most frequent target tokens) and
returns full-vocabulary logits with -inf outside S, so q(x) = 0 for x ∉ S. Exactness is untouched: such a
token is never proposed, and when the target wants it, it comes through the residual max(p - q, 0).

On disk a draft folder holds ``config.json`` (a Llama config) and ``draft.safetensors`` (its layers, final
norm, head rows and the subset ids) — but not the 49k x d input embedding, which is taken from the target
at load time. That keeps the file small and guarantees the embedding matches the target exactly.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from adaptive.files import UnreadableFile, load_weights, read_json, read_tensors

WEIGHTS = "draft.safetensors"
EMBEDDING_KEY = "model.embed_tokens.weight"


class SubsetHead(torch.nn.Module):
    """Linear output layer over a token subset, scattered into full-vocabulary logits (-inf elsewhere)."""

    def __init__(self, weight: torch.Tensor, token_ids: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.register_buffer("token_ids", token_ids.long())
        self.out_features = vocab_size

    def subset_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., d]`` -> ``[..., |S|]`` scores of the subset tokens (used for training)."""
        return torch.nn.functional.linear(hidden, self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scores = self.subset_logits(hidden)
        full = scores.new_full((*scores.shape[:-1], self.out_features), float("-inf"))
        return full.index_copy_(-1, self.token_ids, scores)


def build_draft(target: PreTrainedModel, num_layers: int, token_ids: torch.Tensor) -> LlamaForCausalLM:
    """A draft initialised from the target: its first ``num_layers`` layers, final norm, head rows for the
    subset, and (shared, frozen) input embedding."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    config.tie_word_embeddings = False
    draft = LlamaForCausalLM(config)
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers}
    head = state.pop("lm_head.weight", target.get_output_embeddings().weight)
    draft.load_state_dict(state, strict=False)
    draft.lm_head = SubsetHead(head[token_ids].clone(), token_ids, config.vocab_size)
    _share_embedding(draft, target)
    return draft.to(target.dtype).eval()


def _share_embedding(draft: LlamaForCausalLM, target: PreTrainedModel) -> None:
    draft.model.embed_tokens.weight = target.get_input_embeddings().weight
    draft.model.embed_tokens.weight.requires_grad_(False)


def save_draft(draft: LlamaForCausalLM, folder: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write config and weights (without the shared input embedding) as fp16 safetensors."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    draft.config.to_json_file(folder / "config.json")
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in draft.state_dict().items() if k != EMBEDDING_KEY}
    tensors["lm_head.token_ids"] = draft.lm_head.token_ids.to(torch.int32)  # ids, not weights: no fp16
    save_file(tensors, folder / WEIGHTS, metadata=metadata)


def load_draft(folder: str | Path, target: PreTrainedModel) -> LlamaForCausalLM:
    """Rebuild a saved draft around the target's input embedding, in the target's dtype and device."""
    folder = Path(folder)
    if not (folder / WEIGHTS).is_file():
        raise UnreadableFile(f"{folder} holds no {WEIGHTS}; is it a draft made by `adaptive distill`?")
    config = LlamaConfig.from_dict(read_json(folder / "config.json", "draft config"))
    if config.vocab_size != target.config.vocab_size or config.hidden_size != target.config.hidden_size:
        raise ValueError(
            f"draft in {folder} was made for vocab {config.vocab_size}, hidden {config.hidden_size}; "
            f"the target has vocab {target.config.vocab_size}, hidden {target.config.hidden_size}"
        )
    tensors = read_tensors(folder / WEIGHTS, "draft weights")
    if "lm_head.token_ids" not in tensors:
        raise UnreadableFile(f"draft weights {folder / WEIGHTS} lack lm_head.token_ids; is it a draft made by `adaptive distill`?")
    token_ids = tensors.pop("lm_head.token_ids").long()
    draft = LlamaForCausalLM(config)
    draft.lm_head = SubsetHead(torch.empty(len(token_ids), config.hidden_size), token_ids, config.vocab_size)
    shared = {key: value for key, value in draft.state_dict().items() if key in (EMBEDDING_KEY, "lm_head.token_ids")}  # both set above
    load_weights(draft, {**{k: v.float() for k, v in tensors.items()}, **shared}, folder / WEIGHTS, "draft weights (as its config.json sizes them)")
    _share_embedding(draft, target)
    return draft.to(device=target.device, dtype=target.dtype).eval()


def read_metadata(folder: str | Path) -> dict[str, str]:
    """The provenance metadata stored inside a draft's safetensors file."""
    with safe_open(Path(folder) / WEIGHTS, framework="pt") as handle:
        return dict(handle.metadata() or {})
