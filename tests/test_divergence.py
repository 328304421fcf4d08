"""First divergence between greedy outputs and the target's gap there (the near-tie check used at bfloat16)."""

from __future__ import annotations

import pytest
import torch

from adaptive.decoder import generate_plain
from adaptive.divergence import first_divergence, ulp

PROMPT = [1, 5, 2, 9, 4, 4, 7]


def test_identical_outputs_have_no_divergence(target):
    plain = generate_plain(target, PROMPT, 12).token_ids
    assert first_divergence(target, PROMPT, plain, plain) is None
    assert first_divergence(target, PROMPT, plain, plain[:5]) is None


@pytest.mark.parametrize("rank", [1, 15])
def test_the_gap_is_the_targets_logit_difference_at_the_first_differing_token(target, rank):
    """Swap the plain output's token 5 for the target's rank-th choice: the divergence is found there, its gap is
    the logit difference of an independent forward, and only a near-equal pair would count as a near-tie."""
    plain = generate_plain(target, PROMPT, 12).token_ids
    with torch.no_grad():
        logits = target(input_ids=torch.tensor([PROMPT + plain[:5]])).logits[0, -1]
    other = int(torch.argsort(logits, descending=True)[rank])
    divergence = first_divergence(target, PROMPT, plain, plain[:5] + [other] + plain[6:])
    assert (divergence.position, divergence.plain_token, divergence.speculative_token) == (5, plain[5], other)
    expected = float(logits[plain[5]] - logits[other])
    assert divergence.gap_k_token == pytest.approx(expected, abs=1e-9) and divergence.gap_one_token == pytest.approx(expected, abs=1e-9)
    assert divergence.gap_k_token >= 0 and not divergence.near_tie  # float64: the tolerance is ~1e-14
    assert "NOT a near-tie" in divergence.describe()


def test_ulp_is_the_spacing_of_the_dtype():
    assert ulp(1.0, torch.bfloat16) == 2**-7 and ulp(20.0, torch.bfloat16) == 2**-3
    assert ulp(-3.0, torch.float32) == 2**-22
