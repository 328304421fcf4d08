"""adaptive evaluate on the shipped traces of the default pair, replay only (bounded: about a minute)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.comparison import evaluate
from lab.config import load_config

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_evaluation_report_compares_fitted_baselines_heuristics_and_the_oracle(tmp_path):
    config = load_config(ROOT / "experiments" / "quickstart.yaml")
    config.tracking.wandb = "disabled"
    profile = ROOT / "profiles" / "smollm2-135m.json"
    config.env.profile = str(profile)  # the README's numbers; auto would measure this machine
    result = evaluate(config, [], tmp_path, live_per_language=0, grid_live_per_language=0, calibration_per_language=0)
    replay = result["replay"]
    grid = next(name for name in replay if name.startswith("grid search"))
    oracle = replay["oracle (replay only)"]["all"]["speedup"]
    assert all(oracle >= data["all"]["speedup"] - 1e-9 for data in replay.values())
    assert all(data[lang]["low"] <= data[lang]["speedup"] <= data[lang]["high"] for data in replay.values() for lang in data)
    assert result["fitted"]["grid_best"] in range(1, 9) and set(result["fitted"]["costmodel"]) == {"iid", "lengths"}
    assert replay[grid]["all"]["speedup"] > 1.0  # the tuned static setting beats plain decoding in replay
    report = (tmp_path / "report.md").read_text()
    assert "parameter gain, grid search vs default static:4 (replay):" in report and "oracle" in report
    assert "Cost profile" in report and f"measured {json.loads(profile.read_text())['measured_at'][:10]}" in report and "## Verdict" in report
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"speedup_replay.png", "static_depth.png", "accepted_lengths.png", "learned_choices.png"}
    hist = {name: data["all"]["accepted_hist"] for name, data in replay.items()}
    for name, data in replay.items():
        assert sum(hist[name]) == sum(sum(data[lang]["accepted_hist"]) for lang in ("it", "en", "zh", "es"))
        assert data["all"]["tau"] == pytest.approx(data["all"]["tokens"] / sum(hist[name]))
    choices = result["choices"]
    assert set(choices) == {grid, "oracle (replay only)"}
    assert all(row["accepted"] <= row["depth"] <= result["fitted"]["grid_best"] for row in choices[grid]["confidence"])
    oracle_bins = choices["oracle (replay only)"]["confidence"]
    assert oracle_bins[-1]["accepted"] > oracle_bins[0]["accepted"]  # a confident draft is accepted for longer
    assert json.loads((tmp_path / "evaluation.json").read_text())["test_prompts"] == 368  # the whole test split (data/traces/README.md)


def test_grid_search_confirms_its_finalists_live_on_val_prompts(tmp_path):
    """... and, given a checkpoint, a second call (an evaluation run again after a kill) measures nothing anew;
    a checkpoint made with another draft is refused."""
    from lab.comparison import grid_live
    from lab.live_protocol import identity, warm_pair

    config = load_config(ROOT / "experiments" / "quickstart.yaml")
    pair = warm_pair(config.pair)
    checkpoint, draft = tmp_path / "live-grid.partial.jsonl", identity(pair, {"draft": pair.draft}, [])
    check, rows = grid_live(config, pair, 1, [1, 3], per_language=1, new_tokens=12, repeats=1, checkpoint=checkpoint, identity=draft)
    assert set(check["speedups"]) == {1, 3} and all(0.1 < c["ratio"] < 5.0 for c in check["speedups"].values())
    assert set(rows) == {"plain", "static:1", "static:3"} and all(len(r) == 4 for r in rows.values())  # what calibration may reuse
    assert set(check["against_replay_choice"]) == {3} and check["prompts"] == 4
    assert check["best"] == (3 if check["against_replay_choice"][3]["verdict"] == "faster" else 1)
    again, _ = grid_live(config, pair, 1, [1, 3], per_language=1, new_tokens=12, repeats=1, checkpoint=checkpoint, identity=draft)
    assert again == check  # the same seconds: read back, not measured again
    with pytest.raises(ValueError, match="other identity"):
        grid_live(config, pair, 1, [1, 3], per_language=1, new_tokens=12, repeats=1, checkpoint=checkpoint, identity={**draft, "drafts": {"draft": "another"}})


def test_tree_evaluation_compares_tree_and_chain_grid_searches_in_replay(tmp_path):
    from lab.tree_comparison import evaluate_trees

    config = load_config(ROOT / "experiments" / "tree.yaml")
    config.env.profile = str(ROOT / "profiles" / "smollm2-135m-tree.json")
    config.env.max_depth = 2
    result = evaluate_trees(config, [], tmp_path, live_per_language=0, sizes=(1, 2, 4))
    replay, fitted = result["replay"], result["fitted"]
    chain = next(name for name in replay if name.startswith("chain grid"))
    tree = next(name for name in replay if name.startswith("tree grid"))
    assert fitted["chain_best"] in (1, 2) and fitted["tree_best"]["depth"] in (1, 2)
    assert max(fitted["tree_grid"].values()) == fitted["tree_grid"][f"{fitted['tree_best']['depth']},{fitted['tree_best']['size']}"]
    assert replay[tree]["all"]["tokens"] == replay[chain]["all"]["tokens"]  # same greedy outputs
    assert replay["tree oracle (replay only)"]["all"]["speedup"] > replay[tree]["all"]["speedup"]
    assert {"chain confidence:0.4", "chain heuristic", "chain entropy:2", "chain specdec:0.7"} <= set(replay)
    assert "trees vs chains" in (tmp_path / "report.md").read_text()


def test_an_auto_profile_is_measured_on_this_machine_and_kept_with_the_output(tmp_path):
    from adaptive.profile import CostProfile
    from lab.environments import resolve_profile

    config = load_config(ROOT / "experiments" / "quickstart.yaml")
    config.env.max_depth = 2
    assert config.env.profile == "auto"
    config.engine = "eager"  # compiling the real target costs a minute here; test_cli covers the auto engine
    resolve_profile(config, tmp_path)
    assert config.env.profile == str(tmp_path / "profile.json")
    profile = CostProfile.load(config.env.profile)
    assert profile.max_verify == 2 and profile.document["order"] == "interleaved"  # verifications of 0..2 drafted tokens
    assert profile.document["contexts"] == [64, 128, 256] and profile.document["measured_for"] == "quickstart"
    assert 0 < profile.c < 1 and profile.document["measure_seconds"] < 60


def test_copy_evaluation_compares_sources_baselines_and_oracles_per_task_type(tmp_path):
    from lab.copy_comparison import evaluate_sources

    config = load_config(ROOT / "experiments" / "copy.yaml")
    config.tracking.wandb = "disabled"
    config.env.profile = str(ROOT / "profiles" / "smollm2-135m-bf16.json")
    result = evaluate_sources(config, [], tmp_path, live_per_language=0)
    replay, tasks = result["replay"], result["replay_tasks"]
    assert result["test_prompts"] == 368 and sum(result["tasks"].values()) == 368 and len(result["tasks"]) == 8
    grid = next(name for name in replay if name.startswith("grid search"))
    assert result["fitted"]["grid_best"].split(":")[1] in ("model", "copy", "copy+model")
    assert {"suffix", "oracle, model draft (replay only)", "oracle, source and depth per round (replay only)"} <= set(replay)
    assert len({data["all"]["tokens"] for data in replay.values()}) == 1  # every contender emits the same greedy outputs
    assert all(set(data) == {*result["tasks"], "all"} for data in tasks.values())
    assert replay["oracle, source and depth per round (replay only)"]["all"]["speedup"] > replay[grid]["all"]["speedup"] > 1.0
    report = (tmp_path / "report.md").read_text()
    assert "per task type" in report and "Grid search over static (depth, source)" in report
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"speedup_replay.png", "speedup_replay_tasks.png"}


def test_a_rule_listed_under_two_names_is_decoded_once_live_and_shown_under_both(tmp_path):
    """Grid search and the cost model often pick the same static depth: the live test decodes it once."""
    from lab.comparison import live_comparison
    from lab.live_protocol import warm_pair
    from policies import make_policy

    config = load_config(ROOT / "experiments" / "quickstart.yaml")
    pair = warm_pair(config.pair)
    policies = {name: (lambda: make_policy("static:2")) for name in ("grid search (static:2)", "cost model iid (static:2)")}
    live = live_comparison(config, pair, policies, 1, 8, repeats=1, measured_as={"cost model iid (static:2)": "grid search (static:2)"})
    assert list(live) == ["plain", "grid search (static:2)", "cost model iid (static:2)"]
    assert live["cost model iid (static:2)"] is live["grid search (static:2)"] and len(live["plain"]) == 4


def test_candidates_name_the_rules_that_repeat_another_under_a_second_name():
    from adaptive.profile import CostProfile
    from lab.comparison import candidates

    config = load_config(ROOT / "experiments" / "quickstart.yaml")
    policies, fitted, rows = candidates(config, CostProfile.load(ROOT / "profiles" / "smollm2-135m.json"), [])
    grid, iid = f"grid search (static:{fitted['grid_best']})", f"cost model iid (static:{fitted['costmodel']['iid']})"
    assert rows == {} and set(fitted["measured_as"]) <= set(policies) and set(fitted["measured_as"].values()) <= set(policies)
    assert (fitted["measured_as"].get(iid) == grid) == (fitted["grid_best"] == fitted["costmodel"]["iid"])
    assert all(name not in fitted["measured_as"] for name in ("heuristic", "confidence:0.4", grid))


def test_an_evaluation_sets_each_live_row_beside_its_replayed_records_of_the_same_prompts():
    """Every live configuration is compared with its own replayed records of the live prompts, in the live order, and
    plain decoding with the traces' outputs priced by the profile, the prefill of each prompt's length added."""
    from dataclasses import replace

    from adaptive.profile import CostProfile
    from adaptive.traces import TraceSet
    from lab.calibration import live_against_replay, plain_model, records_model
    from lab.evaluation import PromptRecord

    traces = TraceSet.load(ROOT / "data" / "traces" / "smollm2-135m-test.npz")
    prefill = {"plain": {"fixed_ms": 1.0, "token_ms": 0.5}, "speculative": {"fixed_ms": 2.0, "token_ms": 0.5}}
    profile = replace(CostProfile.load(ROOT / "profiles" / "smollm2-135m.json"), prefill_ms=prefill)
    live_order = [5, 2, 9]
    rows = {name: [{"id": traces.prompt_ids[i], "tokens": 100, "seconds": 1.0 + i, "prefill": 0.1} for i in live_order] for name in ("plain", "tree")}
    records = [PromptRecord(i, traces.langs[i], 100, 0.5 + 0.1 * i, 40, 60) for i in range(12)]
    compared = live_against_replay(rows, {"tree": records[::-1]}, traces, profile)
    tree = records_model([records[i] for i in live_order], traces.prompt_lengths, profile)
    assert tree["seconds"] == pytest.approx(0.5 * 3 + 0.1 * sum(live_order))
    measured = sum(1.0 + i for i in live_order) / 300
    assert compared["tree"]["error"] == pytest.approx((tree["seconds"] + tree["prefill"]) / 300 / measured - 1)
    plain = plain_model(traces, profile, live_order)
    assert plain["prefill"] == pytest.approx(sum(1.0 + 0.5 * traces.prompt_lengths[i] for i in live_order) / 1e3)
    assert compared["plain"]["modelled_ms_per_token"] == pytest.approx((plain["seconds"] + plain["prefill"]) / plain["tokens"] * 1e3)
