"""Replay evaluation: grid search, cost-model depths from traces, bootstrap summaries."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import flat_profile

from adaptive.costmodel import optimal_gamma
from adaptive.decoder import SpeculativeDecoder
from adaptive.recorder import record
from adaptive.traces import TraceSet
from envs.replay import ReplayBackend
from lab.evaluation import PromptRecord, acceptance_rate, costmodel_depths, grid_search, oracle_share, play, summarise
from policies import make_policy

PROMPTS = [[1, 4, 6], [9, 2, 2, 5, 11], [3], [7, 7, 1, 0], [2, 9], [5, 5, 5]]


@pytest.fixture(scope="module")
def traces(target, near_draft):
    decoder = SpeculativeDecoder(target, near_draft, make_policy("static:1"))
    rows = [{"id": str(i), "lang": ("it", "en")[i % 2]} for i in range(len(PROMPTS))]
    return record(decoder, rows, PROMPTS, max_new_tokens=40, depth=6, metadata={})


def test_grid_search_picks_the_fastest_static_depth(traces):
    backend = ReplayBackend(traces, flat_profile(0.05))
    best, speeds = grid_search(backend, range(len(PROMPTS)), 6, 0.0)
    assert speeds[best] == max(speeds.values()) and set(speeds) == set(range(1, 7))
    records = play(backend, lambda: make_policy(f"static:{best}"), range(len(PROMPTS)), traces.langs, 0.0)
    assert summarise(records, backend.target_step_seconds).speedup == pytest.approx(speeds[best])


def test_acceptance_rate_is_the_maximum_likelihood_alpha_of_iid_traces():
    rng = np.random.default_rng(0)
    alpha, depth, n = 0.6, 16, 20_000
    match = np.minimum(rng.geometric(1 - alpha, size=n) - 1, depth)
    traces = TraceSet(
        ["p"],
        ["en"],
        np.array([3]),
        np.array([0, n + 100]),
        np.zeros(n + 100, dtype=np.int32),
        np.concatenate([match, np.zeros(100, dtype=int)]),
        np.zeros((n + 100, depth, 4), np.float32),
        metadata={},
    )
    # 100 trailing zeros are rejections too: the estimate is of the whole set
    expected = match.sum() / (match.sum() + (match < depth).sum() + 100)
    assert acceptance_rate(traces) == pytest.approx(expected, rel=1e-9)
    assert abs(acceptance_rate(traces) - alpha) < 0.02


def test_costmodel_depths_follow_the_profile(traces):
    cheap, dear = costmodel_depths(traces, flat_profile(0.01), 6), costmodel_depths(traces, flat_profile(0.5), 6)
    assert cheap["iid"] >= dear["iid"] and cheap["lengths"] >= dear["lengths"]
    alpha = acceptance_rate(traces)
    assert cheap["iid"] == optimal_gamma(alpha, 0.01, dict(enumerate(flat_profile(0.01).g)), 6).gamma


def test_bootstrap_interval_brackets_the_estimate_and_narrows_with_more_prompts():
    rng = np.random.default_rng(1)
    make = lambda n: [PromptRecord(i, "en", int(rng.integers(50, 150)), float(rng.uniform(1, 3)), 40, 20) for i in range(n)]  # noqa: E731
    small, large = summarise(make(10), 0.05), summarise(make(400), 0.05)
    for s in (small, large):
        assert s.low <= s.speedup <= s.high
    assert large.high - large.low < small.high - small.low


def test_the_share_of_the_oracle_s_gain_a_policy_captures():
    """(policy - grid) / (oracle - grid): a quarter here, negative for a policy slower than grid search, undefined
    where the oracle gains nothing."""
    assert oracle_share(1.5, 1.4, 1.8) == pytest.approx(0.25)
    assert oracle_share(1.3, 1.4, 1.8) == pytest.approx(-0.25)
    assert np.isnan(oracle_share(1.5, 1.4, 1.4))
