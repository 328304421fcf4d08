"""The copy drafter's evaluation on a tiny pair: the (depth, source) grid, every contender's drafters in
replay and live, the per-round source oracle's lookahead, and the per-task gains."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import flat_profile

from adaptive import SpeculativeDecoder
from adaptive.copy_draft import CopyDraft
from adaptive.recorder import record
from envs.replay import ReplayBackend
from lab.config import load_config
from lab.copy_comparison import contenders, gains, live_decoders, replay_records, source_grid, task_table
from policies import make_policy
from policies.baselines import StaticDepth
from policies.oracle import SourceOracle

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[15, 0, 9, 4, 2, 11, 15, 0, 9], [1, 2, 3, 1, 2], [7, 7, 7, 7], [3, 5, 8, 3, 5, 8, 3], [2, 9, 4, 2, 9]]
TASKS = ["fix", "question", "fix", "passage", "question"]


@pytest.fixture(scope="module")
def traces(target, near_draft):
    decoder = SpeculativeDecoder(target, near_draft, StaticDepth(1))
    rows = [{"id": str(i), "lang": lang} for i, lang in zip(range(len(PROMPTS)), ["it", "en", "zh", "es", "en"])]
    return record(decoder, rows, PROMPTS, 30, depth=4, metadata={}, copy=CopyDraft())


@pytest.fixture(scope="module")
def config():
    config = load_config(ROOT / "experiments" / "copy.yaml")
    config.env.max_depth, config.env.decision_seconds = 4, 0.0
    return config


def test_grid_search_covers_every_depth_and_source_and_ranks_by_the_mean_speedup(traces):
    ranked, speeds = source_grid({"train": traces, "val": traces}, flat_profile(), 4, 0.0)
    assert sorted(ranked) == sorted(f"{d}:{s}" for d in range(1, 5) for s in ("model", "copy", "copy+model"))
    assert speeds["train"] == speeds["val"]
    assert [speeds["train"][k] for k in ranked] == sorted(speeds["train"].values(), reverse=True)


def test_the_grid_refuses_traces_without_copy_chains(traces):
    from dataclasses import replace

    with pytest.raises(ValueError, match="record them with adaptive record --copy"):
        source_grid({"train": replace(traces, copy=None)}, flat_profile(), 4, 0.0)


def test_a_lookahead_is_the_round_that_playing_it_gives_and_moves_nothing(traces):
    backend = ReplayBackend(traces, flat_profile(), 4)
    backend.start_prompt(0)
    for source in backend.sources:
        for depth in range(1, 5):
            before = (backend.generated, list(backend.recent))
            seen = backend.lookahead(source, depth)
            assert (backend.generated, list(backend.recent)) == before
            other = ReplayBackend(traces, flat_profile(), 4)
            other.start_prompt(0)
            other.choose_source(source)
            while other._depth < depth and other.draft() is not None:
                pass
            assert other.verify(other._depth) == seen


def test_the_source_oracle_takes_each_round_at_its_best_rate(traces):
    backend = ReplayBackend(traces, flat_profile(), 4)
    oracle = SourceOracle(backend)
    backend.start_prompt(1)
    while not backend.done:
        source = oracle.source(None)
        best = max(_rate(backend.lookahead(s, d)) for s in backend.sources for d in range(1, backend.cap + 1))
        chosen = backend.lookahead(source, oracle._depth)
        assert _rate(chosen) == pytest.approx(best)
        backend.choose_source(source)
        while backend._depth < oracle._depth and backend.draft() is not None:
            pass
        assert backend.verify(backend._depth) == chosen


def _rate(cycle) -> float:
    return cycle.emitted / (cycle.draft_seconds + cycle.verify_seconds)


def test_every_contender_replays_with_its_drafters_and_live_decoders_match(traces, config, target, near_draft):
    chosen, fitted = contenders(config, flat_profile(), [], traces, traces)
    assert {c.drafters for c in chosen.values()} == {"model", "copy", "lookup"}
    assert fitted["grid_best"].split(":")[1] in ("model", "copy", "copy+model")
    records = replay_records(config, flat_profile(), chosen, traces)
    assert {"oracle, model draft (replay only)", "oracle, source and depth per round (replay only)"} <= set(records)
    outputs = [len(traces.output(i)) for i in range(len(traces))]
    assert all([r.tokens for r in mine] == outputs for mine in records.values())  # same greedy outputs for everyone

    pair = SimpleNamespace(target=target, draft=near_draft, tokenizer=None)
    decoders = live_decoders(pair, chosen, 4)
    for name in chosen:
        live = [decoders[name]().generate(p, 30) for p in PROMPTS]
        assert [len(g.token_ids) for g in live] == outputs, name
        assert [sum(r.accepted for r in g.rounds) for g in live] == [r.accepted for r in records[name]], name


def test_gains_compare_learned_runs_per_task_type(traces, config):
    chosen, _ = contenders(config, flat_profile(), [], traces, traces)
    from lab.copy_comparison import Contender

    chosen["learned (with copy)"] = Contender(lambda: make_policy("suffix"), "copy", learned_with_copy=True)
    chosen["learned, model only (run)"] = Contender(lambda: make_policy("static:2"), "model")
    records = replay_records(config, flat_profile(), chosen, traces)
    rows, data = task_table(records, TASKS, flat_profile().target_step_seconds)
    assert set(data["suffix"]) == {"question", "fix", "passage", "all"} and len(rows) == len(records)
    found = gains(records, chosen, TASKS)
    per_task = found["learned (with copy) vs learned, model only (run)"]
    assert set(per_task) == {"question", "fix", "passage", "all"}
    assert all(g["low"] <= g["ratio"] <= g["high"] for g in per_task.values())
    assert found["learned (with copy) vs suffix"]["all"]["ratio"] == pytest.approx(1.0)


def test_a_contender_names_the_drafters_it_may_use():
    from lab.copy_comparison import Contender

    with pytest.raises(ValueError, match="one of model, copy, lookup, got 'tree'"):
        Contender(lambda: make_policy("static:2"), "tree")
