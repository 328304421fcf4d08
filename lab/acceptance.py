"""Fitting and checking the acceptance predictor (:mod:`policies.acceptance`) on replay traces.

Every position t of a chain trace says how many of the draft's K tokens drafted there the target accepts, m(t), and
what the draft showed at each step. Step k is an example wherever it would be verified after an accepted prefix
(m(t) ≥ k − 1); it is accepted when m(t) ≥ k. The predictor is a logistic regression on those examples (Newton's
method, a small ridge), fitted on the training side only; :func:`calibration` bins its predictions on held-out
traces against what happened, beside the draft's own top-1 probability read as the same probability;
:func:`sweep_thresholds` prices SpecDec++'s rule over a grid of thresholds in replay.
"""

from __future__ import annotations

import numpy as np

from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from envs.replay import ReplayBackend
from envs.rollout import run_policy
from policies.acceptance import AcceptancePredictor, SpecDecStop, design
from policies.baselines import ConfidenceStop

RIDGE = 1e-4
"""L2 penalty on the standardised weights (keeps Newton's steps defined on separable data)."""
BINS = 10


def examples(traces: TraceSet, max_depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Design rows and accepted labels of every step that would be verified after an accepted prefix, up to
    ``max_depth`` steps per position (default: the traces' K)."""
    depth = traces.depth if max_depth is None else min(max_depth, traces.depth)
    match = np.asarray(traces.match)
    features = np.asarray(traces.features[:, :depth], dtype=np.float64)
    steps = np.arange(1, depth + 1)
    reached = match[:, None] >= steps[None, :] - 1
    accepted = match[:, None] >= steps[None, :]
    rows = design(features[reached], np.broadcast_to(steps, reached.shape)[reached])
    keep = np.isfinite(rows).all(axis=1)
    return rows[keep], accepted[reached][keep]


def fit_predictor(parts: list[TraceSet], max_depth: int | None = None, iterations: int = 25) -> AcceptancePredictor:
    """The logistic regression of acceptance on :data:`policies.acceptance.COLUMNS` over the examples of every
    trace set in ``parts`` (recorded with one pair, precision and engine)."""
    found = [examples(traces, max_depth) for traces in parts]
    rows, labels = np.concatenate([r for r, _ in found]), np.concatenate([y for _, y in found])
    traces = parts[0]
    if len(np.unique(labels)) < 2:
        raise ValueError(f"the traces hold {len(labels)} examples of one outcome only: nothing to fit")
    mean, scale = rows.mean(axis=0), rows.std(axis=0)
    scale[scale == 0] = 1.0
    x = np.column_stack([(rows - mean) / scale, np.ones(len(rows))])
    y = labels.astype(np.float64)
    theta = np.zeros(x.shape[1])
    penalty = np.full(x.shape[1], RIDGE * len(rows))
    penalty[-1] = 0.0  # the bias is not shrunk
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(x @ theta)))
        gradient = x.T @ (p - y) + penalty * theta
        hessian = (x * (p * (1 - p))[:, None]).T @ x + np.diag(penalty)
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if np.abs(step).max() < 1e-8:
            break
    metadata = {"examples": int(len(rows)), "accepted": float(y.mean()), "pair": traces.metadata.get("pair"), "engine": traces.metadata.get("engine", "eager")}
    metadata |= {"dtype": traces.metadata.get("dtype"), "splits": [t.metadata.get("split") for t in parts], "max_depth": int(max_depth or traces.depth)}
    return AcceptancePredictor(tuple(theta[:-1]), float(theta[-1]), tuple(mean), tuple(scale), metadata)


def _scores(probabilities: np.ndarray, labels: np.ndarray) -> dict:
    """Brier score, log-loss, expected calibration error and the reliability bins of ``probabilities``."""
    p = np.clip(probabilities, 1e-6, 1 - 1e-6)
    y = labels.astype(np.float64)
    edges = np.linspace(0.0, 1.0, BINS + 1)
    which = np.clip(np.digitize(p, edges) - 1, 0, BINS - 1)
    bins = []
    for b in range(BINS):
        inside = which == b
        if inside.any():
            entry = {"low": float(edges[b]), "high": float(edges[b + 1]), "count": int(inside.sum())}
            bins.append(entry | {"predicted": float(p[inside].mean()), "observed": float(y[inside].mean())})
    ece = sum(entry["count"] * abs(entry["predicted"] - entry["observed"]) for entry in bins) / len(p)
    log_loss = float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())
    return {"brier": float(((p - y) ** 2).mean()), "log_loss": log_loss, "ece": float(ece), "bins": bins}


def calibration(predictor: AcceptancePredictor, traces: TraceSet, max_depth: int | None = None) -> dict:
    """On ``traces`` (held out): the predictor's scores and reliability bins, and the same for the draft's top-1
    probability read as P(accepted) (what ``confidence`` thresholds), over the same examples."""
    rows, labels = examples(traces, max_depth)
    scores = {"predictor": _scores(predictor.probabilities(rows), labels), "top1": _scores(rows[:, 0], labels)}
    return {"examples": int(len(rows)), "accepted": float(labels.mean()), **scores}


def sweep_thresholds(
    splits: dict[str, TraceSet], profile: CostProfile, predictor: AcceptancePredictor, thresholds: list[float], max_depth: int, decision_seconds: float
) -> dict[str, dict[str, float]]:
    """SpecDec++'s rule at each threshold, and ``confidence:0.4`` beside it, in replay on every trace split given:
    tokens per modelled second per split and over all (the threshold is chosen on the training side's splits)."""
    policies = {f"specdec:{h:g}": (lambda h=h: SpecDecStop(h, predictor)) for h in thresholds} | {"confidence:0.4": lambda: ConfidenceStop(0.4)}
    result: dict[str, dict[str, float]] = {}
    for name, make in policies.items():
        tokens = seconds = 0.0
        for split, traces in splits.items():
            episodes = run_policy(ReplayBackend(traces, profile, max_depth), make(), range(len(traces)), decision_seconds=decision_seconds)
            split_tokens, split_seconds = sum(e.tokens for e in episodes), sum(e.seconds for e in episodes)
            result.setdefault(name, {})[split] = split_tokens / split_seconds
            tokens, seconds = tokens + split_tokens, seconds + split_seconds
        result[name]["all"] = tokens / seconds
    return result
