"""The acceptance predictor (SpecDec++ style): fitted on real traces of the tiny pair, calibrated in the mean, stored
as JSON only; the stopping rule built on it stops where the predicted chance of a rejection first exceeds its threshold."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import flat_profile

from adaptive.decoder import SpeculativeDecoder
from adaptive.recorder import record
from adaptive.traces import TraceSet
from envs.factory import default_traces
from envs.replay import ReplayBackend
from envs.rollout import run_policy
from lab.acceptance import calibration, examples, fit_predictor, sweep_thresholds
from policies import make_policy
from policies.acceptance import COLUMNS, SHIPPED, AcceptancePredictor, SpecDecStop

PROMPTS = [[1, 4, 6], [9, 2, 2, 5, 11], [3], [7, 7, 1, 0], [2, 8], [5, 5, 5]]


@pytest.fixture(scope="module")
def traces(target, far_draft):
    """Chain traces of the tiny pair (K = 6) whose draft disagrees often enough for both outcomes to be common."""
    decoder = SpeculativeDecoder(target, far_draft, make_policy("static:1"))
    rows = [{"id": str(i), "lang": "en"} for i in range(len(PROMPTS))]
    return record(decoder, rows, PROMPTS, max_new_tokens=60, depth=6, metadata={"pair": "tiny"})


def test_examples_are_the_steps_verified_after_an_accepted_prefix(traces):
    """Step k of position t is an example when m(t) >= k - 1, accepted when m(t) >= k: per position, min(m + 1, K)
    examples of which min(m, K) are accepted."""
    rows, labels = examples(traces)
    match = np.asarray(traces.match)
    assert len(rows) == np.minimum(match + 1, traces.depth).sum()
    assert labels.sum() == np.minimum(match, traces.depth).sum()
    assert rows.shape[1] == len(COLUMNS)


def test_the_fitted_predictor_is_calibrated_in_the_mean_and_beats_a_constant(traces):
    """A logistic regression with an intercept predicts, on its own examples, the observed acceptance rate on
    average (up to its small ridge); its log-loss is below that of the best constant probability (the base rate)."""
    predictor = fit_predictor([traces])
    rows, labels = examples(traces)
    p = predictor.probabilities(rows)
    assert p.mean() == pytest.approx(labels.mean(), abs=2e-3)
    base = labels.mean()
    constant = -(labels * math.log(base) + (1 - labels) * math.log(1 - base)).mean()
    checked = calibration(predictor, traces)
    assert checked["predictor"]["log_loss"] < constant
    assert checked["examples"] == len(rows) and sum(b["count"] for b in checked["predictor"]["bins"]) == len(rows)


def test_a_predictor_round_trips_through_json_and_anything_else_is_refused(traces, tmp_path):
    predictor = fit_predictor([traces], max_depth=4)
    predictor.save(tmp_path / "p.json")
    loaded = AcceptancePredictor.load(tmp_path / "p.json")
    assert loaded == predictor and loaded.metadata["max_depth"] == 4
    (tmp_path / "bad.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not an acceptance predictor"):
        AcceptancePredictor.load(tmp_path / "bad.json")
    (tmp_path / "pickle.json").write_bytes(b"\x80\x04\x95")
    with pytest.raises(Exception, match="pickle.json"):
        AcceptancePredictor.load(tmp_path / "pickle.json")


def test_specdec_stops_where_the_chance_of_a_rejection_first_exceeds_its_threshold(traces):
    """With a predictor that says 0.8 at every step, 1 - 0.8^d is 0.2, 0.36, 0.488, 0.590: at threshold 0.5 every
    round drafts 4 tokens (the one that crosses is still verified) unless its cap is lower; at 0.3, 2."""
    constant = AcceptancePredictor((0.0,) * len(COLUMNS), math.log(0.8 / 0.2), (0.0,) * len(COLUMNS), (1.0,) * len(COLUMNS))
    for threshold, depth in ((0.5, 4), (0.3, 2)):
        backend = ReplayBackend(traces, flat_profile(), 6)
        for episode in run_policy(backend, SpecDecStop(threshold, constant), range(len(traces)), decision_seconds=0.0):
            assert all(cycle.drafted == depth for cycle in episode.cycles[:-depth])  # the last rounds meet the token budget
            assert {cycle.drafted for cycle in episode.cycles} <= set(range(depth + 1))


def test_threshold_sweep_prices_each_threshold_and_confidence_in_replay(traces):
    predictor = fit_predictor([traces])
    speeds = sweep_thresholds({"t": traces}, flat_profile(), predictor, [0.3, 0.7], 6, 0.0)
    assert set(speeds) == {"specdec:0.3", "specdec:0.7", "confidence:0.4"}
    assert all(entry["all"] == entry["t"] > 0 for entry in speeds.values())


def test_the_shipped_predictor_loads_and_is_calibrated_on_the_default_pair_s_val_traces():
    """The shipped predictor (fitted on the default pair's train traces) on the val traces: expected calibration
    error under 0.02, where the draft's top-1 probability read as P(accepted) is off by more than 0.1."""
    checked = calibration(AcceptancePredictor.load(SHIPPED), TraceSet.load(default_traces("val")), 8)
    assert checked["predictor"]["ece"] < 0.02 < 0.1 < checked["top1"]["ece"]
