"""The live measurement protocol on a tiny pair: rotating order, repeats and medians, paired intervals and
their wording (no timing assertions)."""

from __future__ import annotations

import statistics

import pytest

from adaptive.decoder import SpeculativeDecoder
from lab import live_protocol
from lab.evaluation import paired_ratio, verdict
from policies import make_policy

PROMPTS = [{"id": "a", "lang": "en"}, {"id": "b", "lang": "it"}, {"id": "c", "lang": "en"}]
IDS = [[1, 4, 6, 2], [9, 2, 2, 5, 11], [3, 7]]


class Logged:
    """A real decoder that notes, in a shared log, when it generates."""

    def __init__(self, name: str, decoder, log: list[str]) -> None:
        self.name, self.decoder, self.log = name, decoder, log

    def generate(self, ids, new_tokens, seed=None):
        self.log.append(self.name)
        return self.decoder.generate(ids, new_tokens, seed=seed)


def test_rotation_puts_every_configuration_first_equally_often():
    names = ["plain", "x", "y"]
    assert [live_protocol.rotation(names, t) for t in range(3)] == [["plain", "x", "y"], ["x", "y", "plain"], ["y", "plain", "x"]]
    firsts = [live_protocol.rotation(names, t)[0] for t in range(9)]
    assert all(firsts.count(name) == 3 for name in names)


def test_measure_rotates_repeats_and_keeps_medians(target, near_draft):
    log: list[str] = []
    decoders = {
        name: (lambda name=name, depth=depth: Logged(name, SpeculativeDecoder(target, near_draft, make_policy(f"static:{depth}")), log))
        for name, depth in (("static:1", 1), ("static:3", 3))
    }
    live = live_protocol.measure(target, PROMPTS, IDS, decoders, new_tokens=12, repeats=3)
    assert set(live) == {"plain", "static:1", "static:3"}
    # orders plain,1,3 / 1,3,plain / 3,plain,1 / ... (plain is not logged)
    assert log[:6] == ["static:1", "static:3", "static:1", "static:3", "static:3", "static:1"]
    assert len(log) == 2 * 3 * len(PROMPTS)
    for rows in live.values():
        assert [r["id"] for r in rows] == ["a", "b", "c"]
        for row in rows:
            assert len(row["seconds_runs"]) == 3 and row["seconds"] == statistics.median(row["seconds_runs"])
            assert 0 < row["prefill"] < row["seconds"]
            assert row["identical"] and row["tokens"] == 12
    summary = live_protocol.summarise(live)
    assert summary["plain"]["all"]["speedup"] == pytest.approx(1.0)
    assert summary["static:3"]["all"]["low"] <= summary["static:3"]["all"]["speedup"] <= summary["static:3"]["all"]["high"]
    kept = {name: [live_protocol.kept_row(r) for r in rows] for name, rows in live.items()}  # as a result file keeps them
    assert live_protocol.summarise(kept) == summary
    row, again = live["static:3"][0], kept["static:3"][0]
    assert "token_ids" not in again and again["output_digest"] == live_protocol.output_digest(row["token_ids"])
    assert sum(n for _, n in again["gaps"]) == len(row["gaps"]) and len(again["gaps"]) == row["rounds"]  # one run per round
    assert live_protocol.kept_row(again) == again
    with pytest.raises(ValueError, match="repeats"):
        live_protocol.measure(target, PROMPTS, IDS, decoders, new_tokens=4, repeats=0)


def test_a_checkpointed_measurement_resumes_where_it_was_killed(target, near_draft, tmp_path):
    """Each finished prompt is kept in the checkpoint; a rerun measures only what is missing (a line cut short by
    a kill included) and gives the same rows; other settings are refused, not mixed in."""
    log: list[str] = []
    decoders = {"static:2": lambda: Logged("static:2", SpeculativeDecoder(target, near_draft, make_policy("static:2")), log)}
    checkpoint = tmp_path / "live.partial.jsonl"
    first = live_protocol.measure(target, PROMPTS, IDS, decoders, new_tokens=8, repeats=1, checkpoint=checkpoint)
    assert len(log) == len(PROMPTS) and len(checkpoint.read_text().splitlines()) == 1 + len(PROMPTS)
    again = live_protocol.measure(target, PROMPTS, IDS, decoders, new_tokens=8, repeats=1, checkpoint=checkpoint)
    assert len(log) == len(PROMPTS) and again == first  # nothing measured twice
    lines = checkpoint.read_text().splitlines()
    checkpoint.write_text("\n".join([*lines[:-1], lines[-1][:40]]))  # killed while writing the last prompt
    resumed = live_protocol.measure(target, PROMPTS, IDS, decoders, new_tokens=8, repeats=1, checkpoint=checkpoint)
    assert len(log) == len(PROMPTS) + 1 and [r["id"] for r in resumed["static:2"]] == ["a", "b", "c"]
    assert resumed["plain"][:2] == first["plain"][:2] and resumed["plain"][2]["token_ids"] == first["plain"][2]["token_ids"]
    with pytest.raises(ValueError, match="other repeats"):
        live_protocol.measure(target, PROMPTS, IDS, decoders, new_tokens=8, repeats=2, checkpoint=checkpoint)


def test_a_measurement_waits_between_generations_while_the_pause_file_exists(target, near_draft, tmp_path, monkeypatch):
    """The pause file, made during a generation, holds the next one back until it is removed; the timed run it
    was made in is not interrupted."""
    pause = tmp_path / "pause"
    monkeypatch.setenv("ADAPTIVE_PAUSE_FILE", str(pause))
    log: list[str] = []

    class PausingDecoder(Logged):
        def generate(self, ids, new_tokens, seed=None):
            pause.touch()  # other work starts while this generation runs
            return super().generate(ids, new_tokens, seed=seed)

    def removing_sleep(seconds: float) -> None:
        log.append("waiting")
        if log.count("waiting") % 3 == 0:
            pause.unlink()  # the other work is done

    real_wait = live_protocol.wait_while_paused
    monkeypatch.setattr(live_protocol, "wait_while_paused", lambda path: real_wait(path, sleep=removing_sleep, say=log.append))
    decoders = {"static:2": lambda: PausingDecoder("static:2", SpeculativeDecoder(target, near_draft, make_policy("static:2")), log)}
    live = live_protocol.measure(target, PROMPTS[:1], IDS[:1], decoders, new_tokens=6, repeats=2)
    assert live_protocol.pause_file() == pause and not pause.exists()
    # rotation: repeat 1 runs plain, then static:2; repeat 2 static:2, then plain; each static:2 run makes the file
    waits = ["paused", "waiting", "waiting", "waiting", "resumed"]
    assert [entry.split(":")[0].split(" ")[0] for entry in log] == ["static", *waits, "static", *waits]
    assert len(live["plain"]) == len(live["static:2"]) == 1 and len(live["plain"][0]["seconds_runs"]) == 2
    assert real_wait(pause, sleep=removing_sleep, say=log.append) == 0.0  # no file: no wait


def test_paired_intervals_and_their_wording():
    base = [(10, 1.0), (10, 2.0), (10, 1.5), (10, 1.2)]
    twice = [(t, s / 2) for t, s in base]
    ratio, low, high = paired_ratio(twice, base)
    assert ratio == pytest.approx(2.0) and low == pytest.approx(2.0) and high == pytest.approx(2.0)
    assert verdict(low, high) == "faster" and verdict(0.5, 0.9) == "slower" and verdict(0.9, 1.1) == "not significant"
    mixed = [(10, 0.5), (10, 4.0), (10, 0.75), (10, 2.4)]  # faster on two prompts, slower on two
    ratio, low, high = paired_ratio(mixed, base)
    assert low < 1.0 < high and verdict(low, high) == "not significant"
    with pytest.raises(ValueError, match="same prompts"):
        paired_ratio(mixed[:3], base)


def test_the_report_marks_intervals_that_cover_one():
    def rows(seconds):
        return [
            {"id": str(i), "lang": lang, "tokens": 10, "seconds": s, "rounds": 5, "ttft": 0.01, "gaps": [s / 10] * 10, "identical": True, "peak_mib": None}
            for i, (lang, s) in enumerate(zip(["it", "en", "zh", "es"] * 2, seconds))
        ]

    live = {"plain": rows([1, 1, 1, 1, 1, 1, 1, 1]), "fast": rows([0.5] * 8), "noisy": rows([0.5, 2, 0.6, 1.8, 0.5, 2, 0.6, 1.8])}
    summary = live_protocol.summarise(live)
    assert summary["fast"]["all"]["verdict"] == "faster" and summary["noisy"]["all"]["verdict"] == "not significant"
    text = "\n".join(live_protocol.report(summary, repeats=2))
    assert "| noisy" in text and "n.s." in text.split("| noisy")[1].split("\n")[0]
    assert "n.s." not in text.split("| fast")[1].split("\n")[0]
    assert "each prompt 2x per configuration, rotating order" in text


def test_the_pair_benchmark_pairs_each_learned_policy_with_every_static_depth_best_first():
    from benchmarks.pair_speedup import learned_against_static

    def rows(seconds):
        return [
            {"id": str(i), "lang": lang, "tokens": 10, "seconds": s, "rounds": 5, "ttft": 0.01, "gaps": [s / 10] * 10, "identical": True, "peak_mib": None}
            for i, (lang, s) in enumerate(zip(["it", "en", "zh", "es"] * 2, seconds))
        ]

    live = {"plain": rows([1.0] * 8), "static:2": rows([0.6] * 8), "static:4": rows([0.5] * 8), "static:4:copy": rows([0.1] * 8), "heuristic": rows([0.1] * 8)}
    live["runs/learned"] = rows([0.25] * 8)
    lines = learned_against_static(live, live_protocol.summarise(live))
    assert len(lines) == 1 and lines[0].startswith("`runs/learned` against each static depth")
    best, other = lines[0].split("; ")
    assert best.endswith("`static:4` (best static) 2.000x [2.000, 2.000] (faster)")  # a copy-sourced depth or a heuristic is no static depth
    assert other.startswith("`static:2` 2.400x")
    assert learned_against_static({k: v for k, v in live.items() if not k.startswith("static")}, live_protocol.summarise(live)) == []


def test_calibration_compares_replays_modelled_time_with_live_time(target, near_draft):
    """On a tiny pair whose flat profile (10 ms a target step) is far from its real speed, calibration reports
    the modelled and measured seconds per token of plain and speculative decoding, and warns."""
    from conftest import flat_profile

    from adaptive.recorder import record
    from lab.calibration import calibrate, calibration_lines

    traces = record(SpeculativeDecoder(target, near_draft, make_policy("static:1")), PROMPTS, IDS, max_new_tokens=16, depth=4, metadata={})
    result = calibrate(
        target,
        lambda: SpeculativeDecoder(target, near_draft, make_policy("static:2")),
        PROMPTS[:2],
        IDS[:2],
        traces,
        flat_profile(),
        "static:2",
        lambda: make_policy("static:2"),
        max_depth=4,
        decision_seconds=0.0,
        repeats=1,
    )
    plain, speculative = result["rows"]["plain"], result["rows"]["static:2"]
    assert plain["modelled_ms_per_token"] == pytest.approx(10.0) and result["prompts"] == 2
    assert speculative["modelled_ms_per_token"] < plain["modelled_ms_per_token"]  # near draft: several tokens per 10-12 ms round
    for row in (plain, speculative):
        assert row["error"] == pytest.approx(row["modelled_ms_per_token"] / row["measured_ms_per_token"] - 1)
        assert 0 < row["decoding_ms_per_token"] < row["measured_ms_per_token"]  # the prefill taken out
        assert row["decoding_modelled_ms_per_token"] == pytest.approx(row["modelled_ms_per_token"])  # the profile has no prefill
        assert row["decoding_error"] == pytest.approx(row["modelled_ms_per_token"] / row["decoding_ms_per_token"] - 1)
    text = "\n".join(calibration_lines(result))
    assert "| plain | 10.0 (no prefill) |" in text and ("Warning" in text) == (max(abs(r["error"]) for r in result["rows"].values()) > 0.15)
    assert ("predates the prefill's measurement" in text) == ("Warning" in text)
    with pytest.raises(ValueError, match="no.*trace|none of"):
        calibrate(target, lambda: None, [{"id": "zz", "lang": "en"}], [[1, 2]], traces, flat_profile(), "x", lambda: make_policy("static:1"), 4, 0.0)


def test_calibration_adds_the_modelled_prefill_and_takes_the_measured_one_out_where_the_rows_hold_it():
    """The whole call is compared with the rounds and the prefill replay models, decoding alone with the rounds alone;
    rows of a checkpoint written before live rows carried their prefill are compared whole only."""
    from lab.calibration import compare_rows

    rows = [{"tokens": 10, "seconds": 0.12, "prefill": 0.02}, {"tokens": 30, "seconds": 0.28, "prefill": 0.04}]
    compared = compare_rows({"tokens": 40, "seconds": 0.32, "prefill": 0.04}, rows)
    assert compared["measured_ms_per_token"] == pytest.approx(10.0) and compared["modelled_ms_per_token"] == pytest.approx(9.0)
    assert compared["error"] == pytest.approx(-0.1) and compared["prefill_modelled"]
    assert compared["decoding_ms_per_token"] == pytest.approx(8.5) and compared["decoding_error"] == pytest.approx(0.008 / 0.0085 - 1)
    older = compare_rows({"tokens": 40, "seconds": 0.32, "prefill": None}, [{k: v for k, v in row.items() if k != "prefill"} for row in rows])
    assert "decoding_error" not in older and older["error"] == pytest.approx(-0.2) and not older["prefill_modelled"]


def test_calibration_uses_rows_measured_already_instead_of_decoding_again(target, near_draft):
    """Grid search's live check decodes plain and the chosen depth on the same val prompts: calibration reads those
    rows (its decoder is never built) and refuses rows of other prompts."""
    from conftest import flat_profile

    from adaptive.recorder import record
    from lab.calibration import calibrate

    traces = record(SpeculativeDecoder(target, near_draft, make_policy("static:1")), PROMPTS, IDS, max_new_tokens=16, depth=4, metadata={})
    decoders = {"static:2": lambda: SpeculativeDecoder(target, near_draft, make_policy("static:2"))}
    rows = live_protocol.measure(target, PROMPTS[:2], IDS[:2], decoders, 16, repeats=1)

    def never() -> None:
        raise AssertionError("calibration decoded again")

    args = (traces, flat_profile(), "static:2", lambda: make_policy("static:2"), 4, 0.0, 1, None, None)
    result = calibrate(target, never, PROMPTS[:2], IDS[:2], *args, rows)
    for key in ("plain", "static:2"):
        seconds_per_token = sum(r["seconds"] for r in rows[key]) / sum(r["tokens"] for r in rows[key])
        assert result["rows"][key]["measured_ms_per_token"] == pytest.approx(seconds_per_token * 1e3)
    with pytest.raises(ValueError, match="calibration needs"):
        calibrate(target, never, PROMPTS, IDS, *args, rows)


def test_every_row_of_a_live_table_is_set_beside_what_replay_models_for_it_with_the_prefill(target, near_draft):
    """An evaluation's live table, plain and each policy, is replayed on the same prompts' traces: plain as one target
    step per emitted token, a policy as its replayed rounds, each with the profile's prefill per prompt."""
    from dataclasses import replace

    from conftest import flat_profile

    from adaptive.recorder import record
    from envs.replay import ReplayBackend
    from lab.calibration import live_against_replay
    from lab.evaluation import play

    traces = record(SpeculativeDecoder(target, near_draft, make_policy("static:1")), PROMPTS, IDS, max_new_tokens=16, depth=4, metadata={})
    live = live_protocol.measure(target, PROMPTS, IDS, {"static:2": lambda: SpeculativeDecoder(target, near_draft, make_policy("static:2"))}, 16, repeats=1)
    prefill = {"plain": {"fixed_ms": 5.0, "token_ms": 1.0}, "speculative": {"fixed_ms": 8.0, "token_ms": 1.0}}

    def compared(profile):
        replay = {"static:2": play(ReplayBackend(traces, profile, 4), lambda: make_policy("static:2"), range(len(traces)), traces.langs, 0.0)}
        return live_against_replay(live, replay, traces, profile)

    bare, priced = compared(flat_profile()), compared(replace(flat_profile(), prefill_ms=prefill))
    assert set(bare) == set(priced) == {"plain", "static:2"}
    tokens = sum(r["tokens"] for r in live["plain"])
    prompt_tokens = sum(len(ids) for ids in IDS)
    assert bare["plain"]["modelled_ms_per_token"] == pytest.approx(10.0) and not bare["plain"]["prefill_modelled"]
    assert priced["plain"]["modelled_ms_per_token"] == pytest.approx(10.0 + (3 * 5.0 + prompt_tokens) / tokens)
    assert priced["static:2"]["modelled_ms_per_token"] == pytest.approx(bare["static:2"]["modelled_ms_per_token"] + (3 * 8.0 + prompt_tokens) / tokens)
    assert priced["static:2"]["decoding_modelled_ms_per_token"] == pytest.approx(bare["static:2"]["modelled_ms_per_token"])
    for row in priced.values():
        assert row["error"] == pytest.approx(row["modelled_ms_per_token"] / row["measured_ms_per_token"] - 1)


def test_the_round_cost_benchmark_sets_a_policy_s_rounds_beside_static_rounds_of_the_same_depth(target, near_draft):
    """benchmarks/round_costs.py decodes every configuration on every prompt and groups each one's rounds by the depth
    it drafted: static:2 drafts 2 wherever the token budget allows, the cycling rule drafts 1 and 3 in turn, and the
    report sets every configuration's rounds of one depth together."""
    from adaptive.pair import ModelPair
    from benchmarks.round_costs import CycleDepths, FeaturedStaticDepth, measure, report

    makers = {
        "heuristic": lambda: make_policy("heuristic"),
        "static:2": lambda: make_policy("static:2"),
        "static:2+features": lambda: FeaturedStaticDepth(2),
        "cycle:1,3": lambda: CycleDepths((1, 3)),
    }
    found = measure(ModelPair(target, near_draft, None, "tiny"), makers, IDS, new_tokens=12, repeats=1, max_depth=4)
    assert set(found["static:2"]["by_depth"]) <= {0, 1, 2} and len(found["static:2"]["by_depth"][2]) >= len(IDS)
    assert {depth for depth, rows in found["cycle:1,3"]["by_depth"].items() if depth} <= {1, 2, 3} and found["cycle:1,3"]["by_depth"][3]
    assert found["static:2"]["tokens"] == found["heuristic"]["tokens"] == found["static:2+features"]["tokens"] == 12 * len(IDS)
    lines = report(found, [2])
    assert lines[0].startswith("heuristic: ") and any(line.startswith("  depth 2 static:2: ") for line in lines)
    assert any(line.startswith("  depth 2 static:2+features: ") for line in lines)
