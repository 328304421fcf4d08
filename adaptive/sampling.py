"""The probability contract: logits -> the distribution that is actually sampled.

One function, :func:`sampling_distribution`, turns raw logits into the distribution a token is drawn
from (temperature, top-k, top-p, masks). The decoder applies it identically to the target's logits (p)
and the draft's logits (q) before any acceptance test, so the correction is computed on the same objects
that are sampled. Temperature 0 means greedy: the distribution is one-hot on the arg-max.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

STEP_FEATURES = ("top1", "entropy", "log_prob", "margin")
"""What a draft step shows, in the order of :func:`draft_features` and of recorded traces' feature arrays: the
draft's top-1 probability, its entropy in nats, the drafted token's log-probability, and the margin between
its two most probable tokens' probabilities."""


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are drawn; the same config is applied to target and draft.

    Attributes:
        temperature: 0 for greedy decoding; otherwise logits are divided by it.
        top_k: keep only the k most probable tokens (None or 0: keep all).
        top_p: keep the smallest set of most probable tokens whose mass reaches top_p (1.0: keep all).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k must be a positive integer or None, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

    @property
    def is_greedy(self) -> bool:
        """True when tokens are chosen by arg-max."""
        return self.temperature == 0.0

    def describe(self) -> str:
        """A short human-readable label, e.g. ``greedy`` or ``T=0.7 top_k=50``."""
        if self.is_greedy:
            return "greedy"
        parts = [f"T={self.temperature:g}"]
        if self.top_k:
            parts.append(f"top_k={self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top_p={self.top_p:g}")
        return " ".join(parts)


GREEDY = SamplingConfig()


def check_logits(logits: torch.Tensor) -> None:
    """Raise ValueError if logits hold NaN or +inf, or a row is entirely masked (-inf).

    -inf is allowed: it is how a token is masked out (probability exactly 0).
    """
    if math.isfinite(float(logits.sum())):  # the common case: one reduction (NaN and ±inf poison a sum)
        return
    if torch.isnan(logits).any():
        raise ValueError("logits contain NaN; the model produced invalid values (check dtype/overflow)")
    if torch.isposinf(logits).any():
        raise ValueError("logits contain +inf; the model produced invalid values (check dtype/overflow)")
    if torch.isneginf(logits).all(dim=-1).any():
        raise ValueError("every logit in a row is -inf: no token is allowed (check the mask)")


def sampling_distribution(
    logits: torch.Tensor,
    config: SamplingConfig,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Return the distribution actually sampled from, for each row of ``logits``.

    Args:
        logits: ``[..., V]`` raw scores.
        config: temperature / top-k / top-p, applied in that order.
        mask: optional boolean ``[V]`` or ``[..., V]``; False marks a token that may never be produced.

    Returns:
        float32 probabilities ``[..., V]``, each row summing to 1. Greedy configs give a one-hot row.

    Example:
        >>> sampling_distribution(torch.tensor([1.0, 3.0, 2.0]), SamplingConfig()).tolist()
        [0.0, 1.0, 0.0]
    """
    check_logits(logits)
    scores = logits
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
        check_logits(scores)
    if config.is_greedy:  # the arg-max of the model's own logits (widening them is exact)
        return torch.nn.functional.one_hot(arg_max(scores), scores.shape[-1]).float()
    scores = scores.float() / config.temperature
    vocab = scores.shape[-1]
    if config.top_k and config.top_k < vocab:
        kth_largest = torch.topk(scores, config.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_largest, float("-inf"))
    if config.top_p < 1.0:
        scores = _top_p_filter(scores, config.top_p)
    return torch.softmax(scores, dim=-1)


def _top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Mask all but the smallest prefix of sorted tokens whose probability mass reaches ``top_p``."""
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_scores, dim=-1)
    # A token is dropped when the mass of the tokens strictly before it already reaches top_p.
    drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def proposal_distribution(logits: torch.Tensor, config: SamplingConfig, deterministic: bool = False) -> torch.Tensor:
    """q: the distribution a draft's tokens are drawn from, per row of ``logits``. A model draft's is its
    :func:`sampling_distribution`; a deterministic draft (the copy drafter) proposes its arg-max whatever the
    sampling settings, so its q is one-hot there."""
    if not deterministic:
        return sampling_distribution(logits, config)
    return torch.nn.functional.one_hot(arg_max(logits), logits.shape[-1]).to(torch.float32)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row of ``probs`` (``[..., V]`` -> ``[...]``) by inverse CDF.

    A uniform u in [0, total) picks the first index whose cumulative mass exceeds u, so a token with
    probability 0 (a flat step of the CDF) is never drawn. Cheaper than ``torch.multinomial`` per call.
    """
    cdf = probs.double().cumsum(dim=-1)
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, dtype=cdf.dtype, device=probs.device) * cdf[..., -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_max(probs.shape[-1] - 1).squeeze(-1)


def arg_max(logits: torch.Tensor) -> torch.Tensor:
    """The arg-max over the last dimension (the first index on ties). Half-precision logits are widened to
    float32 first: exact, and torch's CPU arg-max is 3-4x faster on float32 than on bfloat16."""
    return (logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits).argmax(dim=-1)


def greedy_token(logits: torch.Tensor) -> int:
    """The greedy choice from one row of logits (checked: NaN or +inf raise), without building a distribution."""
    check_logits(logits)
    return int(arg_max(logits))


def in_vocabulary(logits: torch.Tensor, vocabulary: torch.Tensor | None) -> torch.Tensor:
    """The columns of full-vocabulary ``logits`` that a reduced-vocabulary draft scores: ``vocabulary`` holds
    their target ids, sorted (None: every column). Every other column is -inf, so a softmax, its entropy and
    its arg-max (ties included: sorted ids keep the target's order) are the same over these columns alone, at
    a fraction of the cost (exp over -inf is slow)."""
    return logits if vocabulary is None else logits.index_select(-1, vocabulary)


def target_ids(columns: torch.Tensor, vocabulary: torch.Tensor | None) -> torch.Tensor:
    """Target token ids of column indices into :func:`in_vocabulary`'s output."""
    return columns if vocabulary is None else vocabulary[columns]


def top1_probabilities(logits: torch.Tensor, vocabulary: torch.Tensor | None = None) -> list[float]:
    """Per row of ``[n, V]`` draft logits, the top-1 probability of the draft's untempered softmax — the
    ``top1`` of :func:`draft_features`, alone (``vocabulary`` as there)."""
    scored = in_vocabulary(logits, vocabulary).float()
    return torch.log_softmax(scored, dim=-1).amax(dim=-1).exp().tolist()


def draft_features(
    logits: torch.Tensor, tokens: torch.Tensor | None = None, vocabulary: torch.Tensor | None = None
) -> list[tuple[int, float, float, float, float]]:
    """Drafted tokens and their confidence features, from the draft's untempered softmax, in one pass.

    Features do not depend on the sampling config, so a policy sees the same signals greedy or sampled.

    Args:
        logits: ``[n, V]`` draft logits of n steps.
        tokens: ``[n]`` the tokens drawn from the sampling distribution; None for greedy (the arg-max).
        vocabulary: the sorted target ids a reduced-vocabulary draft scores (the others are -inf), or None;
            only speed depends on it.

    Returns:
        Per step: (token, top-1 probability, entropy in nats, log-probability of the token, margin: top-1
        minus top-2 probability). The four features, in this order, are :data:`STEP_FEATURES`.
    """
    scored = in_vocabulary(logits, vocabulary)
    if scored.dtype not in (torch.float32, torch.float64):
        scored = scored.float()
    log_probs = torch.log_softmax(scored, dim=-1)
    top_log_prob, top_column = log_probs.max(dim=-1)
    chosen = target_ids(top_column, vocabulary) if tokens is None else tokens
    if tokens is None:
        chosen_log_prob = top_log_prob
    else:
        columns = tokens if vocabulary is None else torch.searchsorted(vocabulary, tokens).clamp_max(len(vocabulary) - 1)
        chosen_log_prob = log_probs.gather(-1, columns[:, None])[:, 0]
        if vocabulary is not None:  # a token outside the draft's vocabulary has probability 0 under it
            chosen_log_prob = chosen_log_prob.masked_fill(vocabulary[columns] != tokens, -math.inf)
    two = torch.topk(log_probs, min(2, log_probs.shape[-1]), dim=-1).values.exp()
    margin = two[:, 0] - two[:, 1] if two.shape[-1] > 1 else two[:, 0]
    features = torch.stack([top_log_prob, torch.special.entr(log_probs.exp()).sum(dim=-1), chosen_log_prob, margin])
    top1, entropy, chosen_log_prob, margin = features.tolist()
    if any(math.isnan(value) for value in top1):  # NaN or +inf logits poison the softmax; raise the precise error
        check_logits(logits)
    return [(token, math.exp(t), h, lp, m) for token, t, h, lp, m in zip(chosen.tolist(), top1, entropy, chosen_log_prob, margin)]
