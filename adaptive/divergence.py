"""Where a speculative greedy output leaves plain greedy decoding, and whether that is a near-tie.

At float32 / float64 speculative greedy output is token-identical to plain greedy (a tested guarantee). At
bfloat16 a k-token verification forward and a 1-token forward round differently, so where the target's two
best tokens are nearly tied the two decoders can pick differently; the output still follows the target
(as the forward that verified it computes it). :func:`first_divergence` finds the first differing token and
measures the target's top-2 gap there under both kinds of forward, so a reader can check that every
divergence is such a near-tie and not a bug.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from adaptive.lean import open_cache

NEAR_TIE_ULPS = 4
"""A gap within this many units in the last place of the logits' magnitude, at the model's dtype, is a near-tie."""


@dataclass(frozen=True)
class Divergence:
    """The first token where two greedy outputs differ, and the target's logits there."""

    position: int
    """Index into the outputs."""
    plain_token: int
    speculative_token: int
    gap_one_token: float
    """Logit of the plain token minus the speculative token's, as plain decoding computes it (1-token forwards)."""
    gap_k_token: float
    """The same from one forward over the whole prefix (as a verification forward computes it)."""
    tolerance: float
    """The near-tie bound: ``NEAR_TIE_ULPS`` units in the last place of the largest logit, at the model's dtype."""

    @property
    def near_tie(self) -> bool:
        """Both tokens within ``tolerance`` of each other under both forwards."""
        return abs(self.gap_one_token) <= self.tolerance and abs(self.gap_k_token) <= self.tolerance

    def describe(self, decode=None) -> str:
        name = decode or str
        verdict = "a near-tie" if self.near_tie else "NOT a near-tie"
        return (
            f"diverges at token {self.position}: plain {name(self.plain_token)!r}, speculative {name(self.speculative_token)!r}; "
            f"target logit gap {self.gap_one_token:+.4f} (1-token forward), {self.gap_k_token:+.4f} (k-token forward), "
            f"tolerance {self.tolerance:.4f}: {verdict}"
        )


def ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` numbers at ``value``."""
    mantissa = torch.finfo(dtype).eps  # spacing at 1.0
    return mantissa * 2.0 ** math.floor(math.log2(max(abs(value), torch.finfo(dtype).tiny)))


@torch.inference_mode()
def first_divergence(target: PreTrainedModel, prompt: list[int], plain: list[int], speculative: list[int]) -> Divergence | None:
    """The first position where ``speculative`` leaves ``plain`` (None if one is a prefix of the other), with
    the target's gap between the two tokens there: after the prompt and the shared tokens fed one at a time
    (as plain decoding feeds them), and in one forward over prompt + shared tokens."""
    position = next((i for i, (a, b) in enumerate(zip(plain, speculative)) if a != b), None)
    if position is None:
        return None
    shared = plain[:position]
    a, b = plain[position], speculative[position]
    incremental = open_cache(target)
    logits = incremental.forward(prompt)[-1]
    for token in shared:
        logits = incremental.forward([token])[-1]
    whole = target(input_ids=torch.tensor([prompt + shared], device=target.device)).logits[0, -1]
    dtype = next(target.parameters()).dtype
    largest = max(float(logits.abs().max()), float(whole.abs().max()))
    return Divergence(position, a, b, float(logits[a] - logits[b]), float(whole[a] - whole[b]), NEAR_TIE_ULPS * ulp(largest, dtype))
