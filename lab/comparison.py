"""``adaptive evaluate``: learned policies against grid search, the cost-model optimum, heuristics, plain
decoding and the oracle, on the test split, in replay (exact acceptances, modelled time) and live (wall
clock, the final word), per language.

Grid search and the cost model are fitted on the train and val traces only; the test split is used for
nothing but this comparison.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from adaptive.costmodel import expected_tokens, round_cost
from adaptive.learned_policy import load_policy
from adaptive.policy import DraftPolicy
from adaptive.profile import CostProfile
from adaptive.profiling import hardware_description, hardware_differences
from adaptive.traces import TraceSet
from adaptive.workload import LANGUAGES
from envs.factory import default_traces
from envs.replay import ReplayBackend
from lab import live_protocol
from lab.calibration import calibrate, calibration_lines, live_against_replay, modelled_table
from lab.config import ExperimentConfig
from lab.environments import decoding_engine, resolve_profile
from lab.evaluation import (
    PromptRecord,
    Summary,
    acceptance_rate,
    accepted_histogram,
    choices,
    costmodel_depths,
    gain_line,
    grid_search_splits,
    oracle_share,
    play,
    records_gain,
    summarise,
)
from lab.plots import plot_evaluation
from lab.report import format_table
from lab.tracking import Tracker
from policies import make_policy
from policies.oracle import OraclePolicy

logger = logging.getLogger(__name__)

DEFAULT_STATIC = 4
"""The untuned static depth the parameter gain is measured against."""
GRID_LIVE_FINALISTS = 3
"""Static depths (best in replay) that grid search decodes live before choosing."""


def candidates(
    config: ExperimentConfig,
    profile: CostProfile,
    learned: list[str],
    pair=None,
    grid_live_per_language: int = 0,
    new_tokens: int = 128,
    repeats: int = 2,
    checkpoint: Path | None = None,
    identity: dict | None = None,
) -> tuple[dict[str, Callable[[], DraftPolicy]], dict, dict[str, list[dict]]]:
    """Policies to compare (factories, so each generation starts fresh), how the fitted ones were chosen (with
    ``measured_as``: each policy that is another's rule under a second name, and that name) and grid search's live rows.

    Grid search ranks static depths in replay on the train and val traces; with ``grid_live_per_language``
    the best few are then decoded live on val prompts (resumable from ``checkpoint``), and one replaces the
    replay choice only where the live protocol says it is faster with a 95 % interval above 1."""
    depth = config.env.max_depth
    train, val = (TraceSet.load(default_traces(split, config.pair, engine=profile.engine)) for split in ("train", "val"))
    ranked, speeds = grid_search_splits({"train": train, "val": val}, profile, depth, config.env.decision_seconds)
    fitted: dict = {f"grid_{name}": {"best": max(s, key=lambda g: (s[g], -g)), "speedups": s} for name, s in speeds.items()}
    fitted["grid_replay_best"] = ranked[0]
    grid_rows: dict[str, list[dict]] = {}
    if grid_live_per_language:
        finalists = sorted(ranked[:GRID_LIVE_FINALISTS])
        check, grid_rows = grid_live(config, pair, ranked[0], finalists, grid_live_per_language, new_tokens, repeats, checkpoint, identity)
        fitted["grid_live"] = check
        fitted["grid_best"] = check["best"]
    else:
        fitted["grid_best"] = ranked[0]
    fitted["costmodel"] = costmodel_depths(train, profile, depth)
    fitted["alpha_train"] = acceptance_rate(train)
    fitted["model_speedups"] = {g: expected_tokens(fitted["alpha_train"], g) / round_cost(profile.c, profile.g_curve(), g) for g in range(1, depth + 1)}
    rules = {
        f"grid search (static:{fitted['grid_best']})": f"static:{fitted['grid_best']}",
        f"default static:{DEFAULT_STATIC}": f"static:{DEFAULT_STATIC}",
        f"cost model iid (static:{fitted['costmodel']['iid']})": f"static:{fitted['costmodel']['iid']}",
        f"cost model lengths (static:{fitted['costmodel']['lengths']})": f"static:{fitted['costmodel']['lengths']}",
        "heuristic": "heuristic",
        "confidence:0.4": "confidence:0.4",
        "entropy:2": "entropy:2.0",
        "specdec:0.7": "specdec:0.7",
    }
    chosen: dict[str, Callable[[], DraftPolicy]] = {name: (lambda spec=spec: make_policy(spec)) for name, spec in rules.items()}
    first_name = {spec: name for name, spec in reversed(rules.items())}
    fitted["measured_as"] = {name: first_name[spec] for name, spec in rules.items() if first_name[spec] != name}
    for path in learned:
        policy = load_policy(path, pair=config.pair)  # stateless between generations: one instance serves all
        chosen[f"learned ({Path(path).name})"] = lambda p=policy: p
        fitted.setdefault("learned", {})[path] = policy.metadata.get("config_digest")
    return chosen, fitted, grid_rows


def replay_comparison(
    config: ExperimentConfig, profile: CostProfile, policies: dict[str, Callable[[], DraftPolicy]], test: TraceSet
) -> dict[str, list[PromptRecord]]:
    """Every policy (and the oracle) on every test trace."""
    backend = ReplayBackend(test, profile, config.env.max_depth)
    everyone = {**policies, "oracle (replay only)": lambda: OraclePolicy(backend)}
    return {name: play(backend, factory, range(len(test)), test.langs, config.env.decision_seconds) for name, factory in everyone.items()}


def grid_live(
    config: ExperimentConfig,
    pair,
    replay_choice: int,
    finalists: list[int],
    per_language: int,
    new_tokens: int,
    repeats: int = 2,
    checkpoint: Path | None = None,
    identity: dict | None = None,
) -> tuple[dict, dict[str, list[dict]]]:
    """Grid search's live check on val prompts: the finalists decoded with the live protocol; the replay
    choice stands unless a finalist is faster than it with a 95 % interval above 1. Returns the check and the
    live rows (plain and ``static:G`` per finalist)."""
    policies = {f"static:{g}": (lambda g=g: make_policy(f"static:{g}")) for g in finalists}
    live = live_protocol.measure_policies(
        pair, "val", per_language, policies, config.env.max_depth, new_tokens, repeats, "grid search live check", checkpoint, identity
    )
    speedups = {g: live_protocol.compare(live, f"static:{g}", live_protocol.PLAIN) for g in finalists}
    against = {g: live_protocol.compare(live, f"static:{g}", f"static:{replay_choice}") for g in finalists if g != replay_choice}
    faster = [g for g, c in against.items() if c["verdict"] == "faster"]
    best = max(faster, key=lambda g: against[g]["ratio"]) if faster else replay_choice
    check = {"speedups": speedups, "against_replay_choice": against, "best": best, "repeats": repeats, "prompts": len(live[live_protocol.PLAIN])}
    return check, live


def live_comparison(
    config: ExperimentConfig,
    pair,
    policies: dict[str, Callable[[], DraftPolicy]],
    per_language: int,
    new_tokens: int,
    repeats: int = 2,
    checkpoint: Path | None = None,
    identity: dict | None = None,
    measured_as: dict[str, str] | None = None,
) -> dict[str, list[dict]]:
    """Plain decoding and every policy on the first test prompts per language, with the live protocol; a policy
    that ``measured_as`` names as another's rule under a second name is decoded once, its rows shown under both."""
    measured_as = measured_as or {}
    distinct = {name: factory for name, factory in policies.items() if name not in measured_as}
    live = live_protocol.measure_policies(pair, "test", per_language, distinct, config.env.max_depth, new_tokens, repeats, "live test", checkpoint, identity)
    return {name: live[measured_as.get(name, name)] for name in (live_protocol.PLAIN, *policies)}


def replay_table(records: dict[str, list[PromptRecord]], step_seconds: float, max_depth: int) -> tuple[list[list], dict]:
    rows, data = [], {}
    for name, mine in records.items():
        cells, data[name] = [name], {}
        for lang in (*LANGUAGES, "all"):
            subset = [r for r in mine if lang in (r.lang, "all")]
            s: Summary = summarise(subset, step_seconds)
            data[name][lang] = {**s.__dict__, "accepted_hist": accepted_histogram(subset, max_depth)}
            cells.append(f"{s.speedup:.3f}x [{s.low:.3f}, {s.high:.3f}]")
        cells.append(f"{data[name]['all']['tau']:.2f}")
        rows.append(cells)
    return rows, data


def evaluate(
    config: ExperimentConfig,
    learned: list[str],
    out: Path,
    live_per_language: int = 2,
    new_tokens: int = 128,
    grid_live_per_language: int = 1,
    repeats: int = 2,
    calibration_per_language: int = 1,
) -> dict:
    """Run the whole comparison; writes ``report.md``, ``evaluation.json`` and plots into ``out`` (and the
    profile, when ``auto`` measures one on this machine first). With ``calibration_per_language``, replay is
    first checked against live decoding of that many val prompts per language (:mod:`lab.calibration`).
    Each live part keeps its finished prompts in ``out`` until the report is written: run again into the same
    ``out``, a killed evaluation resumes there (:func:`lab.live_protocol.checkpoint_path`)."""
    out.mkdir(parents=True, exist_ok=True)
    needs_pair = live_per_language or grid_live_per_language or calibration_per_language
    pair = live_protocol.warm_pair(config.pair, config.dtype, decoding_engine(config)) if needs_pair else None  # loaded (and compiled) once
    profile = resolve_profile(config, out, pair=pair)
    elsewhere = hardware_differences(profile.hardware, hardware_description(pair.target.device)) if pair else []
    if elsewhere:
        logger.warning("%s was measured on other hardware (%s): live runs judge policies fitted to it off their machine", config.env.profile, elsewhere)
    identity = live_protocol.identity(pair, {"draft": pair.draft}, learned) if pair else None
    policies, fitted, grid_rows = candidates(
        config, profile, learned, pair, grid_live_per_language, new_tokens, repeats, live_protocol.checkpoint_path(out, "grid"), identity
    )
    calibration = None
    if calibration_per_language:
        grid = next(name for name in policies if name.startswith("grid search"))
        prompts, ids = live_protocol.first_prompts(pair, "val", calibration_per_language)
        decoder = live_protocol.chain_decoders(pair, {grid: policies[grid]}, config.env.max_depth)[grid]
        val = TraceSet.load(default_traces("val", config.pair, engine=profile.engine))
        same_runs = grid_rows and calibration_per_language == grid_live_per_language and val.max_new_tokens == new_tokens
        measured = {live_protocol.PLAIN: grid_rows[live_protocol.PLAIN], grid: grid_rows[f"static:{fitted['grid_best']}"]} if same_runs else None
        calibration = calibrate(
            pair.target,
            decoder,
            prompts,
            ids,
            val,
            profile,
            grid,
            policies[grid],
            config.env.max_depth,
            config.env.decision_seconds,
            repeats,
            live_protocol.checkpoint_path(out, "calibration"),
            identity,
            measured,
        )
    test = TraceSet.load(default_traces("test", config.pair, engine=profile.engine))
    replay = replay_comparison(config, profile, policies, test)
    replay_rows, replay_data = replay_table(replay, profile.target_step_seconds, config.env.max_depth)
    choice_bins = {name: choices(records) for name, records in replay.items() if name.startswith(("learned", "oracle", "grid"))}
    live = {}
    if live_per_language:
        checkpoint = live_protocol.checkpoint_path(out, "test")
        live = live_comparison(config, pair, policies, live_per_language, new_tokens, repeats, checkpoint, identity, fitted["measured_as"])
    live_data = live_protocol.summarise(live) if live else {}
    gains = live_gains(live, policies) if live else {}
    modelled = {}
    if live and new_tokens == test.max_new_tokens:  # replay emits the traces' budget
        modelled = live_against_replay(live, replay, test, profile)  # the replay records of these prompts
    result = {
        "fitted": fitted,
        "replay": replay_data,
        "choices": choice_bins,
        "live": live_data,
        "live_gains": gains,
        "live_modelled": modelled,
        "test_prompts": len(test),
        "calibration": calibration,
        "profile_elsewhere": elsewhere,
        **provenance(config, profile, out, live_per_language, repeats, new_tokens),
    }
    (out / "evaluation.json").write_text(json.dumps(result, indent=1))
    report = _report(result, replay_rows, test, replay)
    (out / "report.md").write_text(report)

    plot_evaluation(result, out / "plots")
    track_comparison(config, out, replay_rows, replay_data, live_data)
    live_protocol.discard_checkpoints(out)
    return result


def track_comparison(
    config: ExperimentConfig, out: Path, rows: list[list], replay: dict, live: dict, tables: dict[str, tuple[list[str], list[list]]] | None = None
) -> None:
    """The comparison tables (and ``tables``: more, by key: columns and rows), native bar charts and the PNG
    plots, logged in the training runs' W&B group."""
    tracker = Tracker(
        config.tracking.wandb, config.tracking.project, config.tracking.group or config.name, f"evaluate-{out.name}", config.to_dict(), out, job_type="evaluate"
    )
    tracker.log_table("replay_speedup", ["policy", *LANGUAGES, "all", "tau"], rows)
    for key, (columns, more) in (tables or {}).items():
        tracker.log_table(key, columns, more)
    speedups = [d["all"]["speedup"] for d in replay.values()]
    tracker.log_bar_chart("replay_speedup_chart", list(replay), speedups, "speedup", "replay speedup over plain (test split)")
    if live:
        columns = (*LANGUAGES, "all")
        tracker.log_table("live_speedup", ["policy", *columns], [[n, *(round(d[lang]["speedup"], 4) for lang in columns)] for n, d in live.items()])
        tracker.log_bar_chart("live_speedup_chart", list(live), [d["all"]["speedup"] for d in live.values()], "speedup", "live speedup over plain (test split)")
    tracker.log_images({f"plot/{path.stem}": path for path in sorted((out / "plots").glob("*.png"))})
    tracker.finish()


def live_gains(live: dict[str, list[dict]], policies: dict) -> dict:
    """Live ratios with intervals: every learned policy against grid search's choice."""
    grid = next(name for name in policies if name.startswith("grid search"))
    return {f"{name} vs {grid}": live_protocol.compare(live, name, grid) for name in policies if name.startswith("learned")}


def provenance(config: ExperimentConfig, profile: CostProfile, out: Path, live_per_language: int, repeats: int, new_tokens: int) -> dict:
    """How an evaluation was made: live settings, dtype, the profile and its provenance, when, and where it is written."""
    return {
        "live_per_language": live_per_language,
        "repeats": repeats,
        "dtype": config.dtype,
        "new_tokens": new_tokens,
        "profile": config.env.profile,
        "profile_info": profile_info(profile),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "out": str(out),
    }


def profile_info(profile: CostProfile) -> dict:
    """What a reader needs to judge a profile: when and where it was measured, at which dtype, its step times."""
    hardware = profile.hardware or {}
    return {
        "measured_at": profile.document.get("measured_at"),
        "processor": hardware.get("processor"),
        "threads": hardware.get("torch_threads"),
        "dtype": profile.document.get("dtype"),
        "target_step_ms": profile.target_step_seconds * 1e3,
        "c": profile.c,
    }


def _profile_line(path: str, info: dict, elsewhere: list[str]) -> str:
    line = (
        f"Cost profile {path}: measured {info['measured_at']} on {info['processor']} ({info['threads']} threads), {info['dtype']}; "
        f"target step {info['target_step_ms']:.1f} ms, c = {info['c']:.3f}."
    )
    if elsewhere:
        line += (
            f" **Not this machine's** ({'; '.join(elsewhere)}): the live rows judge policies fitted to another machine's costs; "
            "`adaptive profile` here and retrain to judge them where they run."
        )
    return line


def _grid_line(fitted: dict) -> str:
    line = f"Grid search: best in replay (train and val traces, mean of both) static:{fitted['grid_replay_best']}"
    check = fitted.get("grid_live")
    if check:
        speeds = ", ".join(f"static:{g} {c['ratio']:.2f}x [{c['low']:.2f}, {c['high']:.2f}]" for g, c in check["speedups"].items())
        line += f"; live check on {check['prompts']} val prompts ({check['repeats']}x each, speedup over plain: {speeds}) " + (
            f"overturned it: static:{fitted['grid_best']} is faster with an interval above 1; "
            if fitted["grid_best"] != fitted["grid_replay_best"]
            else "left it standing (no finalist faster with an interval above 1); "
        )
    else:
        line += "; "
    return line + f"cost model on train traces: i.i.d. static:{fitted['costmodel']['iid']}, lengths static:{fitted['costmodel']['lengths']}."


def _report(result: dict, replay_rows: list[list], test: TraceSet, replay_records: dict[str, list[PromptRecord]]) -> str:
    fitted = result["fitted"]
    lines = [
        "# Evaluation",
        "",
        f"Test split: {result['test_prompts']} prompts (replay, greedy, exact acceptances, time from {result['profile']}); "
        f"live: first {result['live_per_language']} test prompts per language, {result['new_tokens']} new tokens, wall clock, {result['dtype']}.",
        _profile_line(result["profile"], result["profile_info"], result["profile_elsewhere"]),
        _grid_line(fitted),
        "",
        "## Replay: speedup over plain decoding [95 % bootstrap over prompts]",
        "",
        format_table(["policy", *LANGUAGES, "all", "tau"], replay_rows),
    ]
    if result["calibration"]:
        lines += calibration_lines(result["calibration"])
    if result["live"]:
        lines += live_protocol.report(result["live"], result["repeats"])
        lines += [f"- {name}: {same}'s rule, decoded once and shown under both names." for name, same in fitted["measured_as"].items()]
    if result.get("live_modelled"):
        lines += ["", "## Modelled against live: every row of the live table, replayed on the same prompts' test traces", ""]
        lines += modelled_table(result["live_modelled"])
    lines += ["", "## Gains (all languages, [95 % paired bootstrap over prompts])", ""]
    replay = result["replay"]
    grid = next(n for n in replay if n.startswith("grid search"))
    default = next(n for n in replay if n.startswith("default static"))
    lines.append(gain_line(f"parameter gain, grid search vs {default}", records_gain(replay_records[grid], replay_records[default]), "replay"))
    for name in replay:
        if name.startswith("learned"):
            lines.append(gain_line(f"adaptivity gain, {name} vs grid search", records_gain(replay_records[name], replay_records[grid]), "replay"))
            live_gain = result["live_gains"].get(f"{name} vs {grid}")
            if live_gain:
                lines.append(gain_line(f"adaptivity gain, {name} vs grid search", live_gain, "live"))
            oracle = replay["oracle (replay only)"]["all"]["speedup"]
            mine, grid_speed = replay[name]["all"]["speedup"], replay[grid]["all"]["speedup"]
            share = oracle_share(mine, grid_speed, oracle)
            lines.append(f"- {name} reaches {mine / oracle:.1%} of the oracle and captures {share:.0%} of its gain over grid search (replay)")
    shorter = [n for n in replay if replay[n]["all"]["speedup"] > replay[grid]["all"]["speedup"] and replay[n]["all"]["tau"] < replay[grid]["all"]["tau"]]
    lines.append(f"- faster than grid search with a shorter τ (replay): {', '.join(shorter) or 'none'}")
    return "\n".join(lines + _verdict(result)) + "\n"


def _verdict(result: dict) -> list[str]:
    """The one screen a newcomer reads: plain speed, the fitted and learned speedups (replay and live, with
    intervals), the calibration error, and where the rest is."""
    replay, live = result["replay"], result["live"]

    def both(name: str) -> str:
        r = replay[name]["all"]
        text = f"replay {r['speedup']:.2f}x [{r['low']:.2f}, {r['high']:.2f}]"
        if name in live:
            d = live[name]["all"]
            text += f", live {d['speedup']:.2f}x [{d['low']:.2f}, {d['high']:.2f}]" + (" (not significant)" if d["verdict"] == "not significant" else "")
        return text

    lines = ["", "## Verdict", ""]
    if live:
        lines.append(f"- plain decoding here: {live['plain']['all']['tokens_per_second']:.1f} tok/s ({result['dtype']}, live)")
    for prefix in ("grid search", "cost model iid", "learned"):
        lines += [f"- {name}: {both(name)}" for name in replay if name.startswith(prefix)]
    for name, gain in result["live_gains"].items():
        lines.append(f"- {name} (live): {gain['ratio']:.3f}x [{gain['low']:.3f}, {gain['high']:.3f}], {gain['verdict']}")
    if result["calibration"]:
        worst = max(result["calibration"]["rows"].items(), key=lambda item: abs(item[1]["error"]))
        lines.append(f"- calibration: replay vs this machine, worst error {worst[1]['error']:+.1%} ({worst[0]})")
    if result.get("live_modelled"):
        worst = max(result["live_modelled"].items(), key=lambda item: abs(item[1]["error"]))
        lines.append(f"- modelled vs live, every row of the live table: worst error {worst[1]['error']:+.1%} ({worst[0]})")
    lines.append(
        f"- plots: {result['out']}/plots; evaluation.json and this report in {result['out']}; W&B (offline by default): "
        f"{result['out']}/wandb (`wandb sync` uploads it)"
    )
    return lines
