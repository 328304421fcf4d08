"""Replay evaluation of draft policies: grid search over static depths, the cost-model optimum, and
per-language speedups with bootstrap confidence intervals over prompts.

Everything here runs on greedy traces (exact acceptances, time from the cost profile). The live side of
the evaluation (real wall clock, the final word) builds on the same per-prompt records.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from adaptive.costmodel import optimal_gamma, optimal_gamma_from_lengths, throughput_speedup
from adaptive.policy import DraftPolicy
from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from envs.replay import ReplayBackend
from envs.rollout import run_policy
from policies.baselines import StaticDepth


@dataclass(frozen=True)
class PromptRecord:
    """One generation of one policy on one prompt."""

    prompt: int
    lang: str
    tokens: int
    seconds: float
    rounds: int
    accepted: int
    views: tuple = ()
    """Per round: :class:`envs.rollout.RoundView` (position, first-step confidence, depth, accepted)."""


@dataclass(frozen=True)
class Summary:
    """Speedup over plain decoding of a set of generations, with a bootstrap interval over prompts."""

    tokens: int
    seconds: float
    speedup: float
    low: float
    high: float
    tau: float
    """Mean tokens emitted per round."""


def play(
    backend, policy_factory: Callable[[], DraftPolicy], prompts: Sequence[int], langs: Sequence[str] | None, decision_seconds: float
) -> list[PromptRecord]:
    """Generate every prompt with the policy (reset before each generation); one record per prompt
    (``langs``: each prompt's language, or None where languages play no part)."""
    episodes = run_policy(backend, policy_factory(), prompts, decision_seconds)
    return [
        PromptRecord(e.prompt, langs[e.prompt] if langs else "", e.tokens, e.seconds, len(e.cycles), sum(c.accepted for c in e.cycles), e.views)
        for e in episodes
    ]


def summarise(records: Sequence[PromptRecord], step_seconds: float, resamples: int = 1000, seed: int = 0) -> Summary:
    """Σ tokens / Σ seconds in units of plain decoding, and its 95 % percentile-bootstrap interval over prompts."""
    if not records:
        raise ValueError("no records to summarise")
    tokens = np.array([r.tokens for r in records], dtype=float)
    seconds = np.array([r.seconds for r in records])
    speedup = throughput_speedup(tokens.sum(), seconds.sum(), step_seconds)
    picks = np.random.default_rng(seed).integers(0, len(records), size=(resamples, len(records)))
    ratios = throughput_speedup(tokens[picks].sum(axis=1), seconds[picks].sum(axis=1), step_seconds)
    low, high = np.percentile(ratios, [2.5, 97.5])
    rounds = sum(r.rounds for r in records)
    return Summary(int(tokens.sum()), float(seconds.sum()), float(speedup), float(low), float(high), float(tokens.sum() / rounds))


def paired_ratio(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(ratio, low, high): the rate Σ tokens / Σ seconds of ``a`` over that of ``b`` — (tokens, seconds) per
    prompt, the same prompts in the same order — and its 95 % percentile interval from a paired bootstrap
    over prompts (a resample keeps both runs of a prompt together)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired ratios need the same prompts on both sides, got {len(a)} and {len(b)}")
    (ta, sa), (tb, sb) = (np.array(x, dtype=float).T for x in (a, b))
    picks = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    ratios = ta[picks].sum(1) / sa[picks].sum(1) / (tb[picks].sum(1) / sb[picks].sum(1))
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(ta.sum() / sa.sum() / (tb.sum() / sb.sum())), float(low), float(high)


def ratio_interval(rows: Sequence[dict], top: str, bottom: str, resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Σ ``top`` / Σ ``bottom`` over ``rows`` (one per prompt) and its 95 % percentile interval from a bootstrap over them."""
    a, b = np.array([r[top] for r in rows], dtype=float), np.array([r[bottom] for r in rows], dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(rows), size=(resamples, len(rows)))
    low, high = np.percentile(a[picks].sum(1) / b[picks].sum(1), [2.5, 97.5])
    return float(a.sum() / b.sum()), float(low), float(high)


def verdict(low: float, high: float) -> str:
    """How a 95 % interval of a ratio reads: faster, slower, or not significant (it covers 1)."""
    if low > 1.0:
        return "faster"
    if high < 1.0:
        return "slower"
    return "not significant"


def records_gain(a: Sequence[PromptRecord], b: Sequence[PromptRecord]) -> dict:
    """Replay: policy ``a`` against policy ``b`` on the same prompts (ratio, interval, verdict)."""
    if [r.prompt for r in a] != [r.prompt for r in b]:
        raise ValueError("records of two policies must cover the same prompts in the same order")
    ratio, low, high = paired_ratio([(r.tokens, r.seconds) for r in a], [(r.tokens, r.seconds) for r in b])
    return {"ratio": ratio, "low": low, "high": high, "verdict": verdict(low, high)}


def oracle_share(policy: float, grid: float, oracle: float) -> float:
    """The share of the oracle's gain over grid search that a policy captures, from three speedups:
    (policy - grid) / (oracle - grid); below 0 when the policy is slower than grid search."""
    return (policy - grid) / (oracle - grid) if oracle > grid else float("nan")


def gain_line(label: str, gain: dict, where: str) -> str:
    """A report line for a :func:`records_gain` (or a live gain of the same keys): change and interval in per cent."""
    significance = "" if gain["verdict"] != "not significant" else ", not significant"
    return f"- {label} ({where}): {gain['ratio'] - 1:+.1%} [{gain['low'] - 1:+.1%}, {gain['high'] - 1:+.1%}]{significance}"


def records_speedup(records: Sequence[PromptRecord], step_seconds: float) -> float:
    """Σ tokens / Σ seconds of a set of generations, in units of plain decoding."""
    return throughput_speedup(sum(r.tokens for r in records), sum(r.seconds for r in records), step_seconds)


def static_sweep(backend, prompts: Sequence[int], max_depth: int, decision_seconds: float, source: str = "model") -> dict[int, list[PromptRecord]]:
    """Every static depth 1..max_depth (drafted by ``source``) played on ``prompts`` of a backend: the records per depth."""
    return {depth: play(backend, lambda d=depth: StaticDepth(d, source), prompts, None, decision_seconds) for depth in range(1, max_depth + 1)}


def static_speedups(backend, prompts: Sequence[int], max_depth: int, decision_seconds: float) -> dict[int, float]:
    """Replayed speedup of every static depth 1..max_depth on ``prompts``."""
    sweep = static_sweep(backend, prompts, max_depth, decision_seconds)
    return {depth: records_speedup(records, backend.target_step_seconds) for depth, records in sweep.items()}


def grid_search(backend, prompts: Sequence[int], max_depth: int, decision_seconds: float) -> tuple[int, dict[int, float]]:
    """The static depth with the highest replayed throughput on ``prompts``, and every depth's speedup."""
    speeds = static_speedups(backend, prompts, max_depth, decision_seconds)
    return max(speeds, key=lambda g: (speeds[g], -g)), speeds


def grid_search_splits(
    splits: dict[str, TraceSet], profile: CostProfile, max_depth: int, decision_seconds: float
) -> tuple[list[int], dict[str, dict[int, float]]]:
    """Grid search over static depth on several trace sets (e.g. train and val): depths ranked by their mean
    replayed speedup (best first, ties to the shallower), and every set's speedups."""
    speeds = {
        name: static_speedups(ReplayBackend(traces, profile, max_depth), range(len(traces)), max_depth, decision_seconds) for name, traces in splits.items()
    }
    mean = {g: sum(s[g] for s in speeds.values()) / len(speeds) for g in range(1, max_depth + 1)}
    return sorted(mean, key=lambda g: (-mean[g], g)), speeds


def acceptance_rate(traces: TraceSet) -> float:
    """Maximum-likelihood i.i.d. α from the match lengths: each position shows m(t) acceptances, then one
    rejection unless m(t) reached K (or the end of the output)."""
    ends = np.repeat(traces.offsets[1:], np.diff(traces.offsets))
    positions = np.arange(len(traces.match))
    censored = (traces.match >= traces.depth) | (positions + traces.match >= ends)
    accepted = traces.match.sum()
    return float(accepted / (accepted + (~censored).sum()))


def costmodel_depths(traces: TraceSet, profile: CostProfile, max_depth: int) -> dict[str, int]:
    """γ* of the cost model with α estimated from train traces (i.i.d.), and with the empirical match-length
    distribution (the generalised E); c and g(γ) from the profile."""
    g = profile.g_curve()
    return {
        "iid": optimal_gamma(acceptance_rate(traces), profile.c, g, max_depth).gamma,
        "lengths": optimal_gamma_from_lengths(np.minimum(traces.match, max_depth).tolist(), profile.c, g, max_depth).gamma,
    }


def accepted_histogram(records: Sequence[PromptRecord], max_depth: int) -> list[int]:
    """Rounds by accepted length 0..max_depth (longer if a policy drafted deeper)."""
    accepted = [view.accepted for record in records for view in record.views]
    return np.bincount(accepted, minlength=max_depth + 1).tolist() if accepted else [0] * (max_depth + 1)


def choices(records: Sequence[PromptRecord], bins: int = 10, position_width: int = 16) -> dict[str, list[dict]]:
    """Mean depth drafted and tokens accepted per round, binned by the first draft step's top-1 probability
    and by position in the generation: what a policy chose against what it saw."""
    views = [v for r in records for v in r.views]

    def binned(key, edges) -> list[dict]:
        rows = []
        for low, high in zip(edges[:-1], edges[1:]):
            mine = [v for v in views if low <= key(v) < high or (high == edges[-1] and key(v) == high)]
            if mine:
                rows.append(
                    {
                        "low": float(low),
                        "high": float(high),
                        "rounds": len(mine),
                        "depth": float(np.mean([v.drafted for v in mine])),
                        "accepted": float(np.mean([v.accepted for v in mine])),
                    }
                )
        return rows

    last = max((v.position for v in views), default=0)
    return {
        "confidence": binned(lambda v: v.first_top1, np.linspace(0.0, 1.0, bins + 1)),
        "position": binned(lambda v: v.position, np.arange(0, last + position_width + 1, position_width)),
    }
