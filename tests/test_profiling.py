"""Cost profiles: structure, consistency of c and g with the raw timings, and the cost model reading them."""

from __future__ import annotations

import pytest

from adaptive.costmodel import optimal_gamma
from adaptive.profile import CostProfile
from adaptive.profiling import CATCH_UP, DRAFT_RUN, PREFILL_LENGTHS, hardware_description, hardware_differences, profile_pair
from adaptive.tree_decoder import DEFAULT_SHAPE


@pytest.fixture(scope="module")
def measured(target, near_draft):
    return profile_pair(target, near_draft, max_verify=6, contexts=(8, 32), reference_context=32, repetitions=3)


@pytest.fixture(scope="module")
def profile(measured):
    return measured.document


def test_profile_has_every_point_with_median_and_spread(profile):
    for ctx in ("8", "32"):
        assert set(profile["verify"][ctx]) == {str(n) for n in range(1, 7)}
        for point in [profile["draft_step"][ctx], *profile["verify"][ctx].values()]:
            assert 0 < point["p25_ms"] <= point["median_ms"] <= point["p75_ms"]


def test_the_draft_run_keeps_each_step_and_replay_prices_a_round_by_position(profile):
    """The profile keeps each step of the draft run timed after a target forward (their mean is the draft step up to
    the medians' spread); a round's draft time sums the run's first steps, later steps at the last one's price, and
    a profile without a run charges every step the draft step."""
    for ctx in ("8", "32"):
        run = profile["draft_run"][ctx]
        assert len(run) == DRAFT_RUN and all(0 < p["p25_ms"] <= p["median_ms"] <= p["p75_ms"] for p in run)
    priced = CostProfile.from_dict({**profile, "draft_run": {ctx: [{"median_ms": ms} for ms in (3.0, 1.0, 1.0, 0.5)] for ctx in ("8", "32")}})
    assert priced.drafting_seconds(32, 2) == pytest.approx(4.0e-3)
    assert priced.drafting_seconds(32, 6) == pytest.approx(6.5e-3)
    without = CostProfile.from_dict({key: value for key, value in profile.items() if key != "draft_run"})
    assert without.drafting_seconds(32, 3) == pytest.approx(3 * without.draft_seconds(32))


def test_the_profile_times_the_draft_s_first_step_after_each_verification_and_the_decoder_s_own_work(profile, measured):
    """A round's first draft step reads what the last verification emitted: the profile times it after each target
    forward of n = 1..min(CATCH_UP, max_verify) tokens; the decoder's own work per round is fitted from a short decode
    (fixed + per token, none below 0); a profile without either prices as before (first step from the run, no work)."""
    for ctx in ("8", "32"):
        points = profile["draft_catch_up"][ctx]
        assert len(points) == min(CATCH_UP, 6) and all(0 < p["p25_ms"] <= p["median_ms"] <= p["p75_ms"] for p in points)
    work = profile["round_work"]
    assert work["rounds"] > 10 and min(work[key] for key in work if key.endswith("_ms")) >= 0
    assert measured.drafting_work_seconds(1) + measured.verifying_work_seconds(1) > 0
    first = profile["draft_catch_up"]["32"][2]["median_ms"]
    assert measured.drafting_seconds(32, 2, 3) == pytest.approx((first + profile["draft_run"]["32"][1]["median_ms"]) / 1e3)
    assert measured.drafting_work_seconds(4) == pytest.approx((work["draft_fixed_ms"] + 4 * work["draft_token_ms"]) / 1e3)
    assert measured.verifying_work_seconds(4) == pytest.approx((work["verify_fixed_ms"] + 4 * work["verify_token_ms"]) / 1e3)
    older = CostProfile.from_dict({key: value for key, value in profile.items() if key not in ("draft_catch_up", "round_work")})
    assert older.drafting_seconds(32, 2, 3) == older.drafting_seconds(32, 2) == pytest.approx(measured.drafting_seconds(32, 2))
    assert older.drafting_work_seconds(4) == older.verifying_work_seconds(4) == 0.0


def test_the_profile_times_a_generation_s_prefill_by_prompt_length(profile, measured):
    """Live decoding reports a generation's time outside its rounds (the prompt's prefill and set-up): the profile times
    it at several prompt lengths, for plain decoding and for speculative decoding (which feeds the draft too), and fits
    fixed + per prompt token; a profile measured before has none and says so when asked."""
    prefill = profile["prefill"]
    assert prefill["lengths"] == list(PREFILL_LENGTHS)
    for kind in ("plain", "speculative"):
        fit = prefill[kind]
        assert len(fit["median_ms"]) == len(PREFILL_LENGTHS) and min(fit["median_ms"]) > 0 and min(fit["fixed_ms"], fit["token_ms"]) >= 0
        assert measured.prefill_seconds(96, kind == "speculative") == pytest.approx((fit["fixed_ms"] + 96 * fit["token_ms"]) / 1e3)
    assert sum(prefill["speculative"]["median_ms"]) > sum(prefill["plain"]["median_ms"])  # the draft reads the prompt too
    older = CostProfile.from_dict({key: value for key, value in profile.items() if key != "prefill"})
    with pytest.raises(ValueError, match="no prefill time"):
        older.prefill_seconds(96, speculative=False)


@pytest.fixture(scope="module")
def tree_measured(target, near_draft):
    return profile_pair(target, near_draft, max_verify=6, contexts=(8, 32), reference_context=32, repetitions=2, tree_mask=True, prefill_lengths=())


def test_a_tree_profile_times_what_a_tree_round_adds_as_the_tree_decoder_runs_it(tree_measured, profile, measured):
    """With the tree mask the profile fits, from a short tree decode, a later level's draft forward over W nodes and the
    tree decoder's own work (fixed + per level, fixed + per verified node, none below 0); tree replay prices a round
    from them, and from the chain's parts where a profile lacks them."""
    work = tree_measured.document["tree_round_work"]
    assert (work["branching"], work["width"]) == (DEFAULT_SHAPE.branching, DEFAULT_SHAPE.width)
    assert work["rounds"] > 10 and min(work[key] for key in work if key.endswith("_ms")) >= 0
    assert work["level_forward_ms"] > 0 and work["draft_level_ms"] + work["verify_node_ms"] > 0  # deeper or wider rounds cost more
    first = tree_measured.drafting_seconds(32, 1, 3)
    own = work["draft_fixed_ms"] + 3 * work["draft_level_ms"]
    assert tree_measured.round_drafting_seconds(32, 3, 3, tree=True) == pytest.approx(first + (2 * work["level_forward_ms"] + own) / 1e3)
    assert tree_measured.round_verifying_seconds(32, 4, tree=True) == pytest.approx(
        tree_measured.verify_seconds(32, 4) + (work["verify_fixed_ms"] + 4 * work["verify_node_ms"]) / 1e3
    )
    assert "tree_round_work" not in profile  # a chain profile times none of it
    assert measured.round_drafting_seconds(32, 3, 3, tree=True) == pytest.approx(measured.drafting_seconds(32, 3, 3) + measured.drafting_work_seconds(3))
    assert measured.round_verifying_seconds(32, 4, tree=True) == pytest.approx(measured.verify_seconds(32, 4) + measured.verifying_work_seconds(4))


def test_c_and_g_are_ratios_of_the_reference_timings(profile):
    reference = profile["verify"]["32"]
    assert profile["g"]["0"] == pytest.approx(1.0)
    assert profile["g"]["3"] == pytest.approx(reference["4"]["median_ms"] / reference["1"]["median_ms"])
    assert profile["c"] == pytest.approx(profile["draft_step"]["32"]["median_ms"] / reference["1"]["median_ms"])
    assert profile["hardware"]["cpu_count"] >= 1 and profile["dtype"] == "float64"


def test_cost_model_consumes_the_profile(tmp_path, measured):
    path = tmp_path / "profile.json"
    measured.save(path)
    loaded = CostProfile.load(path)
    assert loaded == measured and loaded.document == measured.document
    assert optimal_gamma(0.8, loaded.c, loaded.g_curve(), max_gamma=5).gamma in range(1, 6)


def test_a_document_without_a_summary_is_refused(profile):
    broken = {key: value for key, value in profile.items() if key != "g"}
    with pytest.raises(ValueError, match="'g' is missing"):
        CostProfile.from_dict(broken, "broken.json")


def test_reference_context_must_be_measured(target, near_draft):
    with pytest.raises(ValueError, match="reference_context 100"):
        profile_pair(target, near_draft, contexts=(8,), reference_context=100)


def test_a_profile_knows_whether_it_was_measured_on_this_machine(profile, target):
    here = hardware_description(target.device)
    assert profile["hardware"] == here and hardware_differences(profile["hardware"], here) == []
    elsewhere = {**here, "processor": "Other CPU", "torch_threads": 99}
    assert hardware_differences(elsewhere, here) == [
        f"processor: 'Other CPU' there, {here['processor']!r} here",
        f"torch_threads: 99 there, {here['torch_threads']!r} here",
    ]
    assert hardware_differences({**here, "python": "2.7"}, here) == []  # Python's version does not time a forward; torch's does
    assert "matrix_flags: 'not recorded' there" in hardware_differences({k: v for k, v in here.items() if k != "matrix_flags"}, here)[0]
