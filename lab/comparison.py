"""``adaptive evaluate``: learned policies against grid search, the cost-model optimum, heuristics, plain
decoding and the oracle, on the test split, in replay (exact acceptances, modelled time) and live (wall
clock, the final word), per language.

Grid search and the cost model are fitted on the train and val traces only; the test split is used for
nothing but this comparison.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from adaptive.costmodel import expected_tokens, round_cost
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.learned_policy import load_policy
from adaptive.pair import load_pair
from adaptive.policy import DraftPolicy
from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from adaptive.workload import LANGUAGES, chat_ids, load_prompts
from envs.factory import default_traces
from envs.replay import ReplayBackend
from lab.config import ExperimentConfig
from lab.evaluation import (
    PromptRecord,
    Summary,
    acceptance_rate,
    accepted_histogram,
    choices,
    costmodel_depths,
    grid_search_splits,
    play,
    summarise,
)
from lab.memory import PeakMemory
from lab.plots import plot_evaluation
from lab.report import format_table
from lab.tracking import Tracker
from policies import make_policy
from policies.oracle import OraclePolicy

DEFAULT_STATIC = 4
"""The untuned static depth the parameter gain is measured against."""
GRID_LIVE_FINALISTS = 3
"""Static depths (best in replay) that grid search decodes live before choosing."""


def candidates(
    config: ExperimentConfig, profile: CostProfile, learned: list[str], grid_live_per_language: int = 0, new_tokens: int = 128
) -> tuple[dict[str, Callable[[], DraftPolicy]], dict]:
    """Policies to compare (factories, so each generation starts fresh) and how the fitted ones were chosen.

    Grid search ranks static depths in replay on the train and val traces; with ``grid_live_per_language``
    the best few are then decoded live on val prompts and the fastest in wall clock is chosen."""
    depth = config.env.max_depth
    train, val = TraceSet.load(default_traces("train", config.pair)), TraceSet.load(default_traces("val", config.pair))
    ranked, speeds = grid_search_splits({"train": train, "val": val}, profile, depth, config.env.decision_seconds)
    fitted: dict = {f"grid_{name}": {"best": max(s, key=lambda g: (s[g], -g)), "speedups": s} for name, s in speeds.items()}
    fitted["grid_replay_best"] = ranked[0]
    if grid_live_per_language:
        live = grid_live(config, sorted(ranked[:GRID_LIVE_FINALISTS]), grid_live_per_language, new_tokens)
        fitted["grid_live"] = live
        fitted["grid_best"] = max(live, key=lambda g: (live[g], -g))
    else:
        fitted["grid_best"] = ranked[0]
    fitted["costmodel"] = costmodel_depths(train, profile, depth)
    fitted["alpha_train"] = acceptance_rate(train)
    fitted["model_speedups"] = {g: expected_tokens(fitted["alpha_train"], g) / round_cost(profile.c, profile.g_curve(), g) for g in range(1, depth + 1)}
    chosen: dict[str, Callable[[], DraftPolicy]] = {
        f"grid search (static:{fitted['grid_best']})": lambda: make_policy(f"static:{fitted['grid_best']}"),
        f"default static:{DEFAULT_STATIC}": lambda: make_policy(f"static:{DEFAULT_STATIC}"),
        f"cost model iid (static:{fitted['costmodel']['iid']})": lambda: make_policy(f"static:{fitted['costmodel']['iid']}"),
        f"cost model lengths (static:{fitted['costmodel']['lengths']})": lambda: make_policy(f"static:{fitted['costmodel']['lengths']}"),
        "heuristic": lambda: make_policy("heuristic"),
        "confidence:0.4": lambda: make_policy("confidence:0.4"),
        "entropy:2": lambda: make_policy("entropy:2.0"),
    }
    for path in learned:
        policy = load_policy(path, pair=config.pair)  # stateless between generations: one instance serves all
        chosen[f"learned ({Path(path).name})"] = lambda p=policy: p
        fitted.setdefault("learned", {})[path] = policy.metadata.get("config_digest")
    return chosen, fitted


def replay_comparison(
    config: ExperimentConfig, profile: CostProfile, policies: dict[str, Callable[[], DraftPolicy]], test: TraceSet
) -> dict[str, list[PromptRecord]]:
    """Every policy (and the oracle) on every test trace."""
    backend = ReplayBackend(test, profile, config.env.max_depth)
    everyone = {**policies, "oracle (replay only)": lambda: OraclePolicy(backend)}
    return {name: play(backend, factory, range(len(test)), test.langs, config.env.decision_seconds) for name, factory in everyone.items()}


def chain_decoders(pair, policies: dict[str, Callable[[], DraftPolicy]], max_depth: int) -> dict[str, Callable[[], object]]:
    """Factories of chain decoders, one per policy factory."""
    return {name: (lambda f=factory: SpeculativeDecoder(pair.target, pair.draft, f(), tokenizer=pair.tokenizer, max_depth=max_depth))
            for name, factory in policies.items()}


def back_to_back(pair, ids: list[int], decoders: dict[str, Callable[[], object]], new_tokens: int) -> dict[str, tuple]:
    """Plain decoding, then every decoder (factories of objects with ``generate(ids, new_tokens)``), on one
    prompt: (GenerationResult, peak MiB) per name."""
    runs = {}
    with PeakMemory(pair.target.device) as peak:
        result = generate_plain(pair.target, ids, new_tokens)
    runs["plain"] = (result, peak.mib)
    for name, factory in decoders.items():
        decoder = factory()
        with PeakMemory(pair.target.device) as peak:
            result = decoder.generate(ids, new_tokens)
        runs[name] = (result, peak.mib)
    return runs


def warm_pair(name: str):
    pair = load_pair(name)
    generate_plain(pair.target, chat_ids(pair.tokenizer, "Hello"), 4)
    return pair


def grid_live(config: ExperimentConfig, depths: list[int], per_language: int, new_tokens: int) -> dict[int, float]:
    """Live speedup over plain decoding of each static depth on the first val prompts per language: the
    median over prompts of each prompt's back-to-back ratio, so that one disturbed generation on this
    shared machine cannot flip the choice."""
    pair = warm_pair(config.pair)
    policies = {g: (lambda g=g: make_policy(f"static:{g}")) for g in depths}
    ratios: dict[int, list[float]] = {g: [] for g in depths}
    for lang in LANGUAGES:
        for prompt in load_prompts("val", lang=lang)[:per_language]:
            runs = back_to_back(pair, chat_ids(pair.tokenizer, prompt["prompt"]), chain_decoders(pair, policies, config.env.max_depth), new_tokens)
            plain = runs["plain"][0]
            for g in depths:
                result = runs[g][0]
                ratios[g].append(len(result.token_ids) / result.total_time / (len(plain.token_ids) / plain.total_time))
    return {g: statistics.median(values) for g, values in ratios.items()}


def live_comparison(config: ExperimentConfig, policies: dict[str, Callable[[], DraftPolicy]], per_language: int, new_tokens: int) -> dict[str, list[dict]]:
    """Plain decoding and every policy on the first test prompts per language, back to back per prompt."""
    pair = warm_pair(config.pair)
    return live_rows(pair, chain_decoders(pair, policies, config.env.max_depth), per_language, new_tokens)


def live_rows(pair, decoders: dict[str, Callable[[], object]], per_language: int, new_tokens: int) -> dict[str, list[dict]]:
    """Per decoder and test prompt (the first ``per_language`` per language): tokens, time, rounds, TTFT,
    inter-token gaps, identical-to-plain and peak memory."""
    results: dict[str, list[dict]] = {"plain": [], **{name: [] for name in decoders}}
    for lang in LANGUAGES:
        for prompt in load_prompts("test", lang=lang)[:per_language]:
            runs = back_to_back(pair, chat_ids(pair.tokenizer, prompt["prompt"]), decoders, new_tokens)
            plain = runs["plain"][0].token_ids
            for name, (result, peak) in runs.items():
                gaps = [r.total_time / r.emitted for r in result.rounds for _ in range(r.emitted)]
                results[name].append({
                    "lang": lang, "id": prompt["id"], "tokens": len(result.token_ids), "seconds": result.total_time,
                    "rounds": len(result.rounds), "ttft": result.first_token_time, "gaps": gaps,
                    "identical": result.token_ids == plain, "peak_mib": peak,
                })
    return results


def _paired_interval(rows: list[dict], plain: list[dict], resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the speedup over plain, resampling prompts (rows and plain
    rows are the same prompts in the same order)."""
    tokens, seconds = np.array([r["tokens"] for r in rows], dtype=float), np.array([r["seconds"] for r in rows])
    plain_tokens, plain_seconds = np.array([r["tokens"] for r in plain], dtype=float), np.array([r["seconds"] for r in plain])
    picks = np.random.default_rng(seed).integers(0, len(rows), size=(resamples, len(rows)))
    ratios = tokens[picks].sum(1) / seconds[picks].sum(1) / (plain_tokens[picks].sum(1) / plain_seconds[picks].sum(1))
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def _live_summary(rows: list[dict], plain: list[dict]) -> dict:
    tokens, seconds = sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows)
    plain_rate = sum(r["tokens"] for r in plain) / sum(r["seconds"] for r in plain)
    gaps = np.array([g for r in rows for g in r["gaps"]])
    low, high = _paired_interval(rows, plain)
    return {
        "tokens_per_second": tokens / seconds,
        "speedup": tokens / seconds / plain_rate,
        "low": low,
        "high": high,
        "tau": tokens / sum(r["rounds"] for r in rows),
        "ttft_ms": statistics.median(r["ttft"] for r in rows) * 1e3,
        "itl_ms": {f"p{q}": float(np.percentile(gaps, q) * 1e3) for q in (50, 95, 99)},
        "seconds": seconds,
        "identical": all(r["identical"] for r in rows),
        "peak_mib": max((r["peak_mib"] for r in rows if r["peak_mib"] is not None), default=None),
    }


def summarise_live(live: dict[str, list[dict]]) -> dict:
    """Per decoder and language (and all): the live summary, speedups against the plain rows."""
    return {name: {lang: _live_summary([r for r in rows if lang in (r["lang"], "all")], [r for r in live["plain"] if lang in (r["lang"], "all")])
                   for lang in (*LANGUAGES, "all")} for name, rows in live.items()}


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
    config: ExperimentConfig, learned: list[str], out: Path, live_per_language: int = 2, new_tokens: int = 128, grid_live_per_language: int = 1
) -> dict:
    """Run the whole comparison; writes ``report.md``, ``evaluation.json`` and plots into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    profile = CostProfile.load(config.env.profile)
    policies, fitted = candidates(config, profile, learned, grid_live_per_language, new_tokens)
    test = TraceSet.load(default_traces("test", config.pair))
    replay = replay_comparison(config, profile, policies, test)
    replay_rows, replay_data = replay_table(replay, profile.target_step_seconds, config.env.max_depth)
    choice_bins = {name: choices(records) for name, records in replay.items() if name.startswith(("learned", "oracle", "grid"))}
    live = live_comparison(config, policies, live_per_language, new_tokens) if live_per_language else {}
    live_data = summarise_live(live)
    result = {"fitted": fitted, "replay": replay_data, "choices": choice_bins, "live": live_data, "test_prompts": len(test),
              "live_per_language": live_per_language,
              "new_tokens": new_tokens, "profile": config.env.profile, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (out / "evaluation.json").write_text(json.dumps(result, indent=1))
    report = _report(result, replay_rows, test)
    (out / "report.md").write_text(report)

    plot_evaluation(result, out / "plots")
    track_comparison(config, out, replay_rows, replay_data, live_data)
    return result


def track_comparison(config: ExperimentConfig, out: Path, rows: list[list], replay: dict, live: dict) -> None:
    """The comparison tables, native bar charts and the PNG plots, logged in the training runs' W&B group."""
    tracker = Tracker(config.tracking.wandb, config.tracking.project, config.tracking.group or config.name, f"evaluate-{out.name}",
                      config.to_dict(), out, job_type="evaluate")
    tracker.log_table("replay_speedup", ["policy", *LANGUAGES, "all", "tau"], rows)
    speedups = [d["all"]["speedup"] for d in replay.values()]
    tracker.log_bar_chart("replay_speedup_chart", list(replay), speedups, "speedup", "replay speedup over plain (test split)")
    if live:
        columns = (*LANGUAGES, "all")
        tracker.log_table("live_speedup", ["policy", *columns], [[n, *(round(d[lang]["speedup"], 4) for lang in columns)] for n, d in live.items()])
        tracker.log_bar_chart("live_speedup_chart", list(live), [d["all"]["speedup"] for d in live.values()], "speedup", "live speedup over plain (test split)")
    tracker.log_images({f"plot/{path.stem}": path for path in sorted((out / "plots").glob("*.png"))})
    tracker.finish()


def live_report(live: dict) -> list[str]:
    """Markdown lines of the live table."""
    rows = []
    for name, data in live.items():
        d = data["all"]
        interval = f"{d['speedup']:.2f}x [{d['low']:.2f}, {d['high']:.2f}]"
        rows.append([name, *(f"{data[lang]['speedup']:.2f}x" for lang in LANGUAGES), interval, f"{d['tokens_per_second']:.1f}",
                     f"{d['tau']:.2f}", f"{d['ttft_ms']:.0f}", f"{d['itl_ms']['p50']:.1f}/{d['itl_ms']['p95']:.1f}/{d['itl_ms']['p99']:.1f}",
                     f"{d['seconds']:.1f}", "n/a" if d["peak_mib"] is None else f"{d['peak_mib']:.0f}", "yes" if d["identical"] else "NO"])
    return ["", "## Live: wall clock", "",
            format_table(["policy", *LANGUAGES, "all", "tok/s", "tau", "TTFT ms", "ITL p50/p95/p99 ms", "total s", "peak MiB", "= plain"], rows),
            "", "Peak MiB: the process's peak resident memory during the generation (both models included), or peak device memory on CUDA."]


def _report(result: dict, replay_rows: list[list], test: TraceSet) -> str:
    fitted = result["fitted"]
    lines = [
        "# Evaluation",
        "",
        f"Test split: {result['test_prompts']} prompts (replay, greedy, exact acceptances, time from {result['profile']}); "
        f"live: first {result['live_per_language']} test prompts per language, {result['new_tokens']} new tokens, wall clock.",
        f"Grid search: best in replay (train and val traces, mean of both) static:{fitted['grid_replay_best']}"
        + (f"; live on val prompts (median per-prompt speedup: {', '.join(f'static:{g} {v:.2f}x' for g, v in fitted['grid_live'].items())}) "
           f"chose static:{fitted['grid_best']}; "
           if "grid_live" in fitted else "; ")
        + f"cost model on train traces: i.i.d. static:{fitted['costmodel']['iid']}, lengths static:{fitted['costmodel']['lengths']}.",
        "",
        "## Replay: speedup over plain decoding [95 % bootstrap over prompts]",
        "",
        format_table(["policy", *LANGUAGES, "all", "tau"], replay_rows),
    ]
    if result["live"]:
        lines += live_report(result["live"])
    lines += ["", "## Gains (replay, all languages)", ""]
    replay = result["replay"]
    grid = next(n for n in replay if n.startswith("grid search"))
    default = next(n for n in replay if n.startswith("default static"))
    lines.append(f"- parameter gain, grid search vs {default}: {replay[grid]['all']['speedup'] / replay[default]['all']['speedup'] - 1:+.1%}")
    for name in replay:
        if name.startswith("learned"):
            lines.append(f"- adaptivity gain, {name} vs grid search: {replay[name]['all']['speedup'] / replay[grid]['all']['speedup'] - 1:+.1%}")
            oracle = replay["oracle (replay only)"]["all"]["speedup"]
            lines.append(f"- {name} reaches {replay[name]['all']['speedup'] / oracle:.1%} of the oracle")
    shorter = [n for n in replay if replay[n]["all"]["speedup"] > replay[grid]["all"]["speedup"] and replay[n]["all"]["tau"] < replay[grid]["all"]["tau"]]
    lines.append(f"- faster than grid search with a shorter τ: {', '.join(shorter) or 'none'}")
    return "\n".join(lines) + "\n"
