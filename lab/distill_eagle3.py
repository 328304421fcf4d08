"""Training an EAGLE-3 draft head on the target's own responses (``adaptive distill --kind eagle3``).

The loop, data, held-out split and feature cache are :mod:`lab.draft_training`'s. What is the head's: its
training-time test — ``ttt_steps`` unrolled draft steps at every position
(:meth:`~adaptive.eagle3.Eagle3Head.unrolled`), loss Σ_k decay^k · CE(target distribution over the draft
vocabulary, renormalised; head), on response tokens — and its public EAGLE-3 layout on disk.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from adaptive.eagle3 import Eagle3Config, Eagle3Head, load_head, save_head
from adaptive.precision import bf16_matmuls
from lab.draft_training import Batch, DraftKind, LinearSoftCrossEntropy, aux_layers


def unrolled_loss(
    head: Eagle3Head, tokens, aux, target_log, mask, ttt_steps: int, decay: float, predict: bool = False
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Σ_k decay^k · soft cross-entropy at step k (base t learns the target's distribution at t + k + 1),
    averaged over response positions; with ``predict``, also each step's arg-max draft ids ``[B, T]``.

    The target's rows are gathered and exponentiated once for all steps (step k reads the head's states
    k + 1 rows earlier instead); the output layer and the cross-entropy are :class:`LinearSoftCrossEntropy`."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=aux.device.type == "cpu" and bf16_matmuls()):
        outputs = head.unrolled(tokens, aux, ttt_steps)
        rows, columns = mask.nonzero(as_tuple=True)  # where the target's row predicts a response token
        teacher = target_log[rows, columns].exp()
        total, predictions = 0.0, []
        for step, states in enumerate(outputs):
            bases = columns - (step + 1)  # the base whose step-k draft predicts what that row predicts
            reached = bases >= 0
            hidden = head.norm(states[rows[reached], bases[reached]])
            ce, argmax = LinearSoftCrossEntropy.apply(hidden, head.lm_head.weight, teacher if bool(reached.all()) else teacher[reached], predict)
            total = total + decay**step * ce / max(1, int(reached.sum()))
            if predict:
                predicted = torch.zeros(mask.shape, dtype=torch.long, device=mask.device)
                predicted[rows[reached], bases[reached]] = argmax
                predictions.append(predicted)
    return total, predictions


class Eagle3Kind(DraftKind):
    """An EAGLE-3 head: one decoder layer over the target's fused hidden states, trained with the training-time test."""

    name = "eagle3"
    lead = 1

    def __init__(self, ttt_steps: int = 7, decay: float = 0.8) -> None:
        self.ttt_steps, self.decay = ttt_steps, decay
        self.steps_predicted = ttt_steps

    def build(self, target, vocab: torch.Tensor) -> nn.Module:
        config = Eagle3Config.for_target(target.config, len(vocab), layer_ids=aux_layers(target))
        head = Eagle3Head(config, target.get_input_embeddings()).float()
        head.set_vocabulary(vocab)
        return head

    def load(self, folder: Path, target) -> nn.Module:
        return load_head(folder, target, torch.float32)

    def save(self, draft: nn.Module, folder: Path, metadata: dict) -> None:
        save_head(draft, folder, metadata)

    def describe(self, draft: nn.Module) -> str:
        config = draft.config
        return (
            f"An EAGLE-3 draft head (`adaptive.eagle3`, public EAGLE-3 layout: `config.json`, `model.safetensors` with `d2t`/`t2d`): "
            f"the target's hidden states entering layers {', '.join(map(str, config.layer_ids))} fused {3 * config.hidden_size}→{config.hidden_size}, "
            f"one decoder layer over [normed token embedding ; normed fused state], a final norm and an output head over "
            f"{config.draft_vocab_size:,} of the target's {config.vocab_size:,} tokens; the token embedding is the target's (not stored). "
            f"Trained with the training-time test: {self.ttt_steps} unrolled draft steps at every position, step k weighted {self.decay}^k, "
            "loss the soft cross-entropy against the target's distribution over the draft vocabulary. "
            "Load it with `adaptive.eagle3.load_head(FOLDER, target)` or `--draft FOLDER`."
        )

    def vocabulary(self, draft: nn.Module) -> torch.Tensor:
        return draft.target_ids

    def loss(self, draft: nn.Module, batch: Batch, predict: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return unrolled_loss(draft, batch.tokens, batch.aux, batch.target_log, batch.mask, self.ttt_steps, self.decay, predict)
