"""Statistical exactness of the whole decoder at T > 0.

The exact distribution of the first two generated tokens is enumerated from the target alone (full
forwards, no cache: an independent path). Speculative decoding is then run n = 20,000 times with fixed
seeds and the empirical joint frequencies are compared with it.

Tolerance, derived from n: for an outcome with probability p the frequency has standard error
σ = sqrt(p(1-p)/n). We require every outcome within 5σ (with K ≤ 256 outcomes, a correct sampler exceeds
that with probability ≤ K·5.7e-7 ≈ 1.5e-4) and the Pearson statistic within 5 standard deviations of its
mean (z = (χ² - df)/sqrt(2·df) < 5). The same test, with the naive "resample from p" correction plugged into
the same decoder, must fail — proof that it can.
"""

from __future__ import annotations

import math

import pytest
import torch

from adaptive import SamplingConfig, SpeculativeDecoder, naive_correction, residual_correction, sampling_distribution
from adaptive.copy_draft import CopyDraft
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from policies import HeuristicSchedule, StaticDepth

N_SAMPLES = 20_000
PROMPT = [3]  # one token: no prefill forward, so 20,000 samples stay affordable


def exact_two_token_distribution(target, prompt: list[int], sampling: SamplingConfig) -> torch.Tensor:
    """P(x1, x2 | prompt) under the target and the sampling contract, as a ``[V, V]`` matrix."""
    vocab = target.config.vocab_size
    with torch.no_grad():
        first = sampling_distribution(target(torch.tensor([prompt])).logits[0, -1], sampling).double()
        continuations = torch.tensor([prompt + [x] for x in range(vocab)])
        second = sampling_distribution(target(continuations).logits[:, -1], sampling).double()
    return first[:, None] * second


def empirical_two_token_counts(decoder: SpeculativeDecoder, n: int, prompt: list[int] = PROMPT) -> torch.Tensor:
    vocab = decoder.target.model.config.vocab_size
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    for seed in range(n):
        first, second = decoder.generate(prompt, max_new_tokens=2, seed=seed).token_ids
        counts[first, second] += 1
    return counts


def deviation_statistics(counts: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(largest per-outcome z-score, Pearson χ² z-score) of ``counts`` against ``exact``."""
    n = counts.sum()
    p = exact.flatten()
    freq = counts.flatten() / n
    if (freq[p == 0] > 0).any():
        return math.inf, math.inf
    support = p > 0
    sigma = (p[support] * (1 - p[support]) / n).sqrt()
    max_z = float(((freq[support] - p[support]).abs() / sigma).max())
    expected = n * p[support]
    chi2 = float((((counts.flatten()[support] - expected) ** 2) / expected).sum())
    df = int(support.sum()) - 1
    return max_z, (chi2 - df) / math.sqrt(2 * df)


def assert_exact_or_detected(decoder: SpeculativeDecoder, target, prompt: list[int], correction) -> None:
    """With the residual rule every outcome and the Pearson statistic lie within 5σ of the exact two-token
    distribution; with the naive rule both lie beyond it (the test detects the bias)."""
    exact = exact_two_token_distribution(target, prompt, decoder.sampling)
    max_z, chi2_z = deviation_statistics(empirical_two_token_counts(decoder, N_SAMPLES, prompt), exact)
    if correction is residual_correction:
        assert max_z < 5.0 and chi2_z < 5.0, (max_z, chi2_z)
    else:
        assert max_z > 5.0 and chi2_z > 5.0, "the naive rule should be detected as biased"


CASES = {
    "far draft, T=1, static:1 (bonus path)": ("far_draft", SamplingConfig(1.0), lambda: StaticDepth(1)),
    "far draft, T=1.3, top-p 0.8, static:3": ("far_draft", SamplingConfig(1.3, top_p=0.8), lambda: StaticDepth(3)),
    "reduced-vocabulary draft (7 of 16 tokens have q=0), T=1, static:2": (
        "subset_draft",
        SamplingConfig(1.0),
        lambda: StaticDepth(2),
    ),
    "near draft, T=0.8, top-k 6, top-p 0.9, heuristic": (
        "near_draft",
        SamplingConfig(0.8, top_k=6, top_p=0.9),
        lambda: HeuristicSchedule(2),
    ),
}
HEAD_PROMPT = [3, 11]
"""The head needs the target's state at the position before the last prompt token: two prompt tokens."""


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_speculative_samples_follow_target_distribution(case, target, request):
    draft_name, sampling, policy = CASES[case]
    decoder = SpeculativeDecoder(target, request.getfixturevalue(draft_name), policy(), sampling)
    exact = exact_two_token_distribution(target, PROMPT, sampling)
    max_z, chi2_z = deviation_statistics(empirical_two_token_counts(decoder, N_SAMPLES), exact)
    assert max_z < 5.0, f"an outcome deviates by {max_z:.1f} standard errors"
    assert chi2_z < 5.0, f"Pearson statistic {chi2_z:.1f} standard deviations above its mean"


@pytest.mark.slow
@pytest.mark.parametrize("correction", [residual_correction, naive_correction], ids=["residual", "naive"])
def test_an_eagle3_head_keeps_the_target_distribution_and_naive_resampling_does_not(eagle_head, target, correction):
    """A random EAGLE-3 head (reduced vocabulary, the target's hidden states as input), T = 1, static:2:
    exact with the residual rule; the naive rule, same head and decoder, is detected."""
    sampling = SamplingConfig(1.0)
    decoder = SpeculativeDecoder(target, eagle_head, StaticDepth(2), sampling, correction=correction)
    assert_exact_or_detected(decoder, target, HEAD_PROMPT, correction)


COPY_PROMPT = [3, 5, 3]
"""The copy drafter proposes 5 after it (p = 0.18 at T = 1), then 3 after an accepted 5."""


@pytest.mark.slow
@pytest.mark.parametrize("correction", [residual_correction, naive_correction], ids=["residual", "naive"])
def test_the_copy_drafter_keeps_the_target_distribution_and_naive_resampling_does_not(target, far_draft, correction):
    """Rounds drafted by the copy drafter (deterministic: q one-hot) and then the far draft model (sampled),
    T = 1, static:3 copy+model: exact with the residual rule; the naive rule, same drafters, is detected."""
    sampling = SamplingConfig(1.0)
    decoder = SpeculativeDecoder(target, far_draft, StaticDepth(3, "copy+model"), sampling, correction=correction, copy=CopyDraft())
    assert_exact_or_detected(decoder, target, COPY_PROMPT, correction)


def test_naive_resampling_fails_the_same_test(target, far_draft):
    sampling = SamplingConfig(1.0)
    decoder = SpeculativeDecoder(target, far_draft, StaticDepth(1), sampling, correction=naive_correction)
    exact = exact_two_token_distribution(target, PROMPT, sampling)
    max_z, chi2_z = deviation_statistics(empirical_two_token_counts(decoder, N_SAMPLES), exact)
    assert max_z > 5.0 and chi2_z > 5.0, "the naive rule should be detected as biased"


def test_exact_rule_is_the_default():
    assert SpeculativeDecoder.__init__.__kwdefaults__["correction"] is residual_correction


TREE_CASES = {
    "far draft, k=2 W=2 V=6, T=1": (TreeShape(2, 2, 6), SamplingConfig(1.0)),
    "far draft, k=4 W=2 V=5, T=1.3, top-p 0.8": (TreeShape(4, 2, 5), SamplingConfig(1.3, top_p=0.8)),
}


def empirical_tree_counts(decoder: TreeDecoder, n: int) -> torch.Tensor:
    """The first two tokens of ``n`` seeded generations of three tokens: the first round grows two levels (the budget
    caps a round at one level fewer than it has left), so both tokens can come from the tree's accepted path. Each
    generation stops at the round that emits its second token (later rounds cannot change the first two)."""
    vocab = decoder.target.model.config.vocab_size
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    for seed in range(n):
        tokens: list[int] = []
        for stats in decoder.stream(PROMPT, max_new_tokens=3, seed=seed):
            tokens += stats.tokens
            if len(tokens) >= 2:
                break
        counts[tokens[0], tokens[1]] += 1
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TREE_CASES))
def test_sampled_draft_trees_follow_the_target_distribution(case, target, far_draft):
    """Trees of two shapes (branching 2 and 4), grown two levels and verified by recursive rejection sampling over
    siblings: the first two tokens of 20,000 generations match the target's enumerated joint distribution."""
    shape, sampling = TREE_CASES[case]
    decoder = TreeDecoder(target, far_draft, StaticDepth(2), shape, sampling)
    exact = exact_two_token_distribution(target, PROMPT, sampling)
    max_z, chi2_z = deviation_statistics(empirical_tree_counts(decoder, N_SAMPLES), exact)
    assert max_z < 5.0, f"an outcome deviates by {max_z:.1f} standard errors"
    assert chi2_z < 5.0, f"Pearson statistic {chi2_z:.1f} standard deviations above its mean"


@pytest.mark.slow
def test_trying_siblings_against_an_unchanged_target_distribution_fails_the_same_test(target, far_draft):
    """The plausible shortcut — try each sibling against p itself and, when all fail, sample from p — over-produces
    the drafted tokens; the same test detects it."""
    shape, sampling = TREE_CASES["far draft, k=2 W=2 V=6, T=1"]
    decoder = TreeDecoder(target, far_draft, StaticDepth(2), shape, sampling, correction=naive_correction)
    max_z, chi2_z = deviation_statistics(empirical_tree_counts(decoder, N_SAMPLES), exact_two_token_distribution(target, PROMPT, sampling))
    assert max_z > 5.0 and chi2_z > 5.0, "the shortcut should be detected as biased"
