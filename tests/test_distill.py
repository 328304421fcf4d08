"""Distillation pieces on tiny models: vocabulary subset, coverage, the KL loss and that training lowers it."""

from __future__ import annotations

import torch

from adaptive.draft_model import build_draft
from lab.distill import choose_subset, coverage, distillation_loss


def test_subset_keeps_the_most_frequent_tokens_and_the_required_ones():
    sequences = [[1, 1, 1, 2, 2, 3], [1, 2, 4]]
    assert choose_subset(sequences, 2, always=[9]).tolist() == [1, 9]
    assert choose_subset(sequences, 3, always=[]).tolist() == [1, 2, 3]


def test_coverage_counts_tokens_the_subset_can_propose():
    assert coverage([[1, 2, 3, 4]], torch.tensor([1, 2])) == 0.5


def test_loss_is_zero_for_a_draft_equal_to_the_target(target):
    full = build_draft(target, target.config.num_hidden_layers, torch.arange(16))
    ids, mask = torch.tensor([[1, 2, 3, 4, 5]]), torch.ones(1, 5, dtype=torch.long)
    assert distillation_loss(target, full, ids, mask, torch.arange(16)).item() < 1e-9


def test_training_steps_lower_the_loss(target):
    subset = torch.tensor([0, 1, 2, 3, 5, 8, 13])
    draft = build_draft(target, 1, subset).train()
    ids = torch.randint(0, 16, (4, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0  # padding must not count
    optimizer = torch.optim.Adam([p for p in draft.parameters() if p.requires_grad], lr=1e-2)
    first = distillation_loss(target, draft, ids, mask, subset).item()
    for _ in range(30):
        loss = distillation_loss(target, draft, ids, mask, subset)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.5 * first
    assert torch.equal(draft.get_input_embeddings().weight, target.get_input_embeddings().weight)  # frozen, shared
