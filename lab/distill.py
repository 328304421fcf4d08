"""Distilling the standalone draft on the target's own responses (``adaptive distill --kind standalone``).

The loop, data (the draft-training prompt pool's responses, disjoint from every policy workload prompt),
held-out split and feature cache are :mod:`lab.draft_training`'s. What is the standalone draft's: a few
transformer layers initialised from the target's first layers (or a saved draft, ``init``) and an output
layer over the draft vocabulary (:mod:`adaptive.draft_model`); loss KL(p_S || q) on response positions,
p_S being the target's distribution restricted to the draft vocabulary S and renormalised.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from adaptive.draft_model import build_draft, load_draft, save_draft
from adaptive.precision import bf16_matmuls
from lab.draft_training import Batch, DraftKind, LinearSoftCrossEntropy


def _own_embedding(draft: nn.Module) -> nn.Module:
    """Train in float32 without touching the target: the draft gets a frozen float32 copy of the shared
    input embedding (not saved: a loaded draft shares the target's again)."""
    shared = draft.model.embed_tokens.weight
    draft.model.embed_tokens.weight = nn.Parameter(shared.detach().float().clone(), requires_grad=False)
    return draft.float()


def kl_loss(draft: nn.Module, batch: Batch, predict: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mean over response positions of KL(target over the draft vocabulary || draft) — the cross-entropy
    (:class:`~lab.draft_training.LinearSoftCrossEntropy`, fused with the output layer) less the target's
    entropy; with ``predict``, also the draft's arg-max (draft ids) ``[B, T]``."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=batch.tokens.device.type == "cpu" and bf16_matmuls()):
        hidden = draft.model(input_ids=batch.tokens, attention_mask=batch.attention).last_hidden_state[batch.mask]
        teacher = batch.target_log[batch.mask]
        probabilities = teacher.exp()
        cross_entropy, argmax = LinearSoftCrossEntropy.apply(hidden, draft.lm_head.weight, probabilities, predict)
    entropy = -torch.dot(probabilities.flatten(), teacher.flatten())
    predicted = None
    if predict:
        predicted = torch.zeros(batch.mask.shape, dtype=torch.long, device=batch.mask.device)
        predicted[batch.mask] = argmax
    return (cross_entropy - entropy) / max(1, int(batch.mask.sum())), predicted


class StandaloneKind(DraftKind):
    """A small causal LM drafting on its own (measured teacher-forced: its first draft step's agreement)."""

    name = "standalone"
    steps_predicted = 1
    lead = 0

    def __init__(self, num_layers: int = 2, init: str | Path | None = None) -> None:
        self.num_layers, self.init = num_layers, init

    def build(self, target, vocab: torch.Tensor) -> nn.Module:
        if self.init is not None:  # a saved draft's layers and vocabulary
            return self.load(Path(self.init), target)
        return _own_embedding(build_draft(target, self.num_layers, vocab))

    def load(self, folder: Path, target) -> nn.Module:
        return _own_embedding(load_draft(folder, target))

    def save(self, draft: nn.Module, folder: Path, metadata: dict) -> None:
        save_draft(draft, folder, {key: str(value) for key, value in metadata.items()})

    def describe(self, draft: nn.Module) -> str:
        return (
            f"A standalone draft model (`adaptive.draft_model`): {draft.config.num_hidden_layers} Llama layers "
            f"{'from the draft in ' + str(self.init) if self.init else 'initialised from the target' + chr(39) + 's first'}, "
            f"an output head over {len(draft.lm_head.token_ids):,} of the target's tokens, the target's input embedding (not stored). "
            "Loss: KL(target distribution over the draft vocabulary, renormalised || draft) per response position. "
            "Load it with `adaptive.draft_model.load_draft(FOLDER, target)` or `--draft FOLDER`."
        )

    def vocabulary(self, draft: nn.Module) -> torch.Tensor:
        return draft.lm_head.token_ids

    def loss(self, draft: nn.Module, batch: Batch, predict: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        loss, predicted = kl_loss(draft, batch, predict)
        return loss, [predicted] if predict else []
