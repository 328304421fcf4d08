"""Baseline policies: spec strings, and each rule's behaviour on hand-made states."""

from __future__ import annotations

import math

import pytest

from adaptive.costmodel import optimal_gamma
from adaptive.policy import DraftPolicy, DraftState, DraftStep, RoundStats
from policies import ConfidenceStop, CostModelPolicy, EntropyStop, HeuristicSchedule, StaticDepth, make_policy
from policies.acceptance import SpecDecStop


def state(*probs: float, entropy: float = 1.0) -> DraftState:
    steps, cumulative = [], 0.0
    for prob in probs:
        cumulative += math.log(prob)
        steps.append(DraftStep(token=0, top1_prob=prob, entropy=entropy, log_prob=math.log(prob), cumulative_log_prob=cumulative))
    return DraftState(context_length=10, steps=tuple(steps), max_depth=16)


def round_stats(drafted: int, accepted: int, draft_time: float = 0.001, verify_time: float = 0.02) -> RoundStats:
    return RoundStats(10, drafted, drafted, accepted, accepted + 1, (), draft_time, verify_time, 0.0, 0.0)


@pytest.mark.parametrize(
    ("spec", "kind", "name"),
    [
        ("static:4", StaticDepth, "static:4"),
        ("heuristic", HeuristicSchedule, "heuristic"),
        ("confidence", ConfidenceStop, "confidence:0.4"),
        ("confidence:0.6", ConfidenceStop, "confidence:0.6"),
        ("entropy:2", EntropyStop, "entropy:2"),
        ("specdec", SpecDecStop, "specdec:0.7"),
        ("specdec:0.5", SpecDecStop, "specdec:0.5"),
        ("costmodel", CostModelPolicy, "costmodel"),
        ("costmodel:0.05", CostModelPolicy, "costmodel:0.05"),
    ],
)
def test_specs_build_named_policies(spec, kind, name):
    policy = make_policy(spec)
    assert isinstance(policy, kind) and isinstance(policy, DraftPolicy)
    assert policy.name == name


@pytest.mark.parametrize(
    ("spec", "message"),
    [("greedy:3", "unknown policy 'greedy:3'; allowed: static:G"), ("static", "needs a value"), ("static:0", ">= 1"), ("confidence:2", r"\(0, 1\)")],
)
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message):
        make_policy(spec)


def test_static_depth_stops_at_gamma():
    policy = StaticDepth(3)
    assert [policy.should_continue(state(*[0.9] * d)) for d in (1, 2, 3)] == [True, True, False]


def test_heuristic_schedule_plus_two_minus_one_min_one():
    policy = HeuristicSchedule(5)
    policy.observe(round_stats(5, 5))
    assert policy.depth == 7
    for _ in range(10):
        policy.observe(round_stats(policy.depth, 0))
    assert policy.depth == 1
    policy.reset()
    assert policy.depth == 5


def test_confidence_stops_after_a_low_probability_token():
    policy = ConfidenceStop(0.4)
    assert policy.should_continue(state(0.9, 0.5))
    assert not policy.should_continue(state(0.9, 0.3))


def test_entropy_stop():
    policy = EntropyStop(2.0)
    assert policy.should_continue(state(0.9, entropy=1.0))
    assert not policy.should_continue(state(0.9, entropy=2.5))


def test_cost_model_policy_converges_to_the_analytic_optimum():
    policy = CostModelPolicy(c=0.05, decay=1.0, prior_weight=1.0)
    # i.i.d. acceptance α = 0.7 observed over many rounds of depth 16: accepted k with P = α^k(1-α), k < 16
    for k in range(16):
        for _ in range(round(10_000 * 0.7**k * 0.3)):
            policy.observe(round_stats(16, k))
    assert policy.alpha == pytest.approx(0.7, abs=0.01)
    assert policy.gamma == optimal_gamma(policy.alpha, 0.05).gamma
    assert policy.gamma in (5, 6)  # S(5) and S(6) differ by 2e-6 at α = 0.7: either is the optimum


def test_cost_model_policy_estimates_c_online():
    policy = CostModelPolicy(decay=1.0)
    for _ in range(50):
        policy.observe(round_stats(4, 2, draft_time=4 * 0.002, verify_time=0.02))
    assert policy.c == pytest.approx(0.1)
