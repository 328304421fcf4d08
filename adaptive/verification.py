"""Verification of a drafted block (Leviathan, Kalman, Matias, ICML 2023).

Each drafted token x ~ q is accepted with probability min(1, p(x)/q(x)); at the first rejection the
replacement is drawn from the *correction* distribution, which for the exact rule is the residual
norm(max(p - q, 0)). When every drafted token is accepted, one bonus token is drawn from the target's
next distribution. A block therefore emits 1..γ+1 tokens.

The correction is a parameter so that the exactness auditor and the statistical tests can run the naive
"resample from p" rule through exactly the same code and show that it is wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from adaptive.sampling import SamplingConfig, arg_max, check_logits, sample, sampling_distribution

CorrectionRule = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""Maps (p, q) rows ``[..., V]`` to the distribution sampled after a rejection."""


def residual_correction(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The exact rule: norm(max(p - q, 0)).

    Z = sum(max(p - q, 0)) is the rejection probability. When Z = 0 (p == q) a rejection has probability
    zero, so the residual is never needed; we return p there instead of computing 0/0. Only float
    rounding can reach that branch, and whatever it returns carries zero probability mass.
    """
    residual = (p - q).clamp_min(0.0)
    z = residual.sum(dim=-1, keepdim=True)
    return torch.where(z > 0, residual / z.clamp_min(torch.finfo(residual.dtype).tiny), p)


def naive_correction(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The tempting but wrong rule: after a rejection, resample from p. Kept to prove the tests can fail."""
    return p


@dataclass(frozen=True)
class BlockVerdict:
    """What one verification decided.

    Attributes:
        accepted: how many drafted tokens were kept (0..γ), a prefix of the block.
        next_token: the token emitted after them: the correction draw, or the bonus token if all were kept.
    """

    accepted: int
    next_token: int


def acceptance_probabilities(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)) for each drafted token x; never divides by q = 0.

    Args:
        p: ``[γ, V]`` target distributions at the drafted positions.
        q: ``[γ, V]`` draft distributions the tokens were drawn from.
        tokens: ``[γ]`` drafted token ids.
    """
    index = tokens.unsqueeze(-1)
    p_x = p.gather(-1, index).squeeze(-1)
    q_x = q.gather(-1, index).squeeze(-1)
    if (q_x <= 0).any():
        bad = tokens[q_x <= 0].tolist()
        raise ValueError(f"drafted token(s) {bad} have draft probability 0, so they cannot have been drawn from q")
    return torch.where(p_x >= q_x, torch.ones_like(p_x), p_x / q_x)


def verify_block(
    p: torch.Tensor,
    q: torch.Tensor,
    tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    correction: CorrectionRule = residual_correction,
) -> BlockVerdict:
    """Accept a prefix of the drafted block and draw the next token, vectorised over the block.

    Args:
        p: ``[γ+1, V]`` target distributions: one per drafted position plus the bonus position.
        q: ``[γ, V]`` draft distributions the drafted tokens were sampled from.
        tokens: ``[γ]`` drafted token ids (γ may be 0).
        generator: source of the uniform draws and the correction/bonus sample.
        correction: the rule applied at the first rejection (default: the exact residual).

    Returns:
        The number accepted and the token that follows them.
    """
    gamma = tokens.shape[0]
    if p.shape[0] != gamma + 1 or q.shape[0] != gamma:
        raise ValueError(f"expected p with {gamma + 1} rows and q with {gamma} rows, got {p.shape[0]} and {q.shape[0]}")
    if gamma == 0:
        return BlockVerdict(0, int(sample(p[0], generator)))
    accept_prob = acceptance_probabilities(p[:gamma], q, tokens)
    uniforms = torch.rand(gamma, generator=generator, device=p.device, dtype=accept_prob.dtype)
    kept = torch.cumprod((uniforms < accept_prob).to(torch.int32), dim=0)
    accepted = int(kept.sum())
    if accepted == gamma:
        return BlockVerdict(gamma, int(sample(p[gamma], generator)))
    return BlockVerdict(accepted, int(sample(correction(p[accepted], q[accepted]), generator)))


def verify_block_greedy(target_logits: torch.Tensor, tokens: torch.Tensor) -> BlockVerdict:
    """Greedy verification: keep drafted tokens while they equal the target's arg-max, then emit its arg-max.

    Identical in outcome to :func:`verify_block` on the one-hot distributions of temperature 0 (a test
    checks this), without building any distribution.

    Args:
        target_logits: ``[γ+1, V]`` target logits at the drafted positions plus the bonus position.
        tokens: ``[γ]`` drafted token ids.
    """
    choices = arg_max(target_logits).tolist()
    accepted = 0
    for drafted in tokens.tolist():
        if drafted != choices[accepted]:
            break
        accepted += 1
    return BlockVerdict(accepted, choices[accepted])


def verify_drafts(
    target_logits: torch.Tensor,
    tokens: torch.Tensor,
    q_rows: list[torch.Tensor],
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    correction: CorrectionRule = residual_correction,
) -> BlockVerdict:
    """One round's verdict under ``sampling``, as every decoder reaches it: arg-max agreement when greedy
    (:func:`verify_block_greedy`), else :func:`verify_block` on the sampling distributions of the target's
    ``[γ+1, V]`` logits and the draft's ``q_rows`` (γ rows, the distributions the tokens were drawn from)."""
    if sampling.is_greedy:
        check_logits(target_logits)
        return verify_block_greedy(target_logits, tokens)
    p = sampling_distribution(target_logits, sampling)
    q = torch.stack(q_rows) if q_rows else p[:0]
    return verify_block(p, q, tokens, generator, correction)
