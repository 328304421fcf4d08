"""``adaptive evaluate`` for configs with a copy drafter beside the model (``env.copy: true``).

Compared on the test split, every task type, with one cost profile: grid search over static (depth, source)
— fitted in replay on the train and val copy traces — SuffixDecoding's rule and transformers' prompt lookup
(both model-free), the learned runs given (a run trained with the copy drafter chooses the source each
round; a model-only run decodes without the copy drafter, as it was trained), the model-only baselines (the
untuned static depth, the cost model, the heuristics) without a copy drafter, and two oracles: the model
draft's, and one that picks source and depth per round. Replay (exact greedy acceptances) per language and
per task type, with bootstrap intervals; then live, wall clock, back to back with plain decoding (grid
search, the suffix rule, prompt lookup and the learned runs; each language's first test prompts, a general
task then a copy-heavy one, taking turns).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adaptive.copy_draft import CopyDraft, PromptLookupDraft
from adaptive.decoder import SpeculativeDecoder
from adaptive.learned_policy import load_policy
from adaptive.policy import DraftPolicy
from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from adaptive.workload import LANGUAGES, SPLITS, TASKS, load_prompts
from envs.factory import default_traces
from envs.replay import ReplayBackend
from lab import live_protocol
from lab.comparison import DEFAULT_STATIC, provenance, replay_table, track_comparison
from lab.config import ExperimentConfig
from lab.environments import decoding_engine, resolve_profile
from lab.evaluation import PromptRecord, acceptance_rate, costmodel_depths, play, records_gain, records_speedup, static_sweep, summarise
from lab.plots import plot_speedups
from lab.report import format_table
from policies import make_policy
from policies.baselines import StaticDepth
from policies.oracle import OraclePolicy, SourceOracle

LIVE_TASKS = ("question", "fix", "code", "passage", "continuation", "comment", "translation", "keep-names")
"""Task types in the order live prompts take them in each language: a general one, then a copy-heavy one."""
LIVE = ("grid search", "suffix", "prompt lookup", "learned")
"""Contenders decoded live (by name prefix); the model-only baselines are replayed only."""
DRAFTERS = ("model", "copy", "lookup")
"""What a contender drafts with: the pair's draft alone; a copy drafter beside it; transformers' prompt
lookup in the copy drafter's place."""


@dataclass(frozen=True)
class Contender:
    """A policy (a factory: each generation starts fresh) and the drafters it decodes with."""

    policy: Callable[[], DraftPolicy]
    drafters: str = "model"
    """One of :data:`DRAFTERS`."""
    learned_with_copy: bool = False

    def __post_init__(self) -> None:
        if self.drafters not in DRAFTERS:
            raise ValueError(f"a contender drafts with one of {', '.join(DRAFTERS)}, got {self.drafters!r}")


def source_grid(splits: dict[str, TraceSet], profile: CostProfile, max_depth: int, decision_seconds: float) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Grid search over static depth 1..``max_depth`` × source on traces holding the copy drafter's chains:
    settings ``"G:SOURCE"`` ranked by their mean replayed speedup over the sets (ties: the order model,
    copy, copy+model, then the shallower), and every set's speedups."""
    speeds: dict[str, dict[str, float]] = {}
    for name, traces in splits.items():
        if traces.copy is None:
            raise ValueError(f"the {name} traces hold no copy drafter chains: record them with adaptive record --copy")
        backend = ReplayBackend(traces, profile, max_depth)
        speeds[name] = {
            f"{depth}:{source}": records_speedup(records, backend.target_step_seconds)
            for source in backend.sources
            for depth, records in static_sweep(backend, range(len(traces)), max_depth, decision_seconds, source).items()
        }
    settings = list(next(iter(speeds.values())))
    mean = {key: float(np.mean([s[key] for s in speeds.values()])) for key in settings}
    return sorted(settings, key=lambda key: (-mean[key], settings.index(key))), speeds


def contenders(config: ExperimentConfig, profile: CostProfile, learned: list[str], train: TraceSet, val: TraceSet) -> tuple[dict[str, Contender], dict]:
    """Who is compared, and how the fitted ones were chosen (grid search and the cost model: on the train
    and val copy traces)."""
    depth = config.env.max_depth
    ranked, speeds = source_grid({"train": train, "val": val}, profile, depth, config.env.decision_seconds)
    fitted: dict = {"grid_best": ranked[0], "grid_train": speeds["train"], "grid_val": speeds["val"]}
    fitted["costmodel"] = costmodel_depths(train, profile, depth)
    fitted["alpha_train"] = acceptance_rate(train)
    best = ranked[0]
    chosen = {
        f"grid search (static:{best})": Contender(lambda: make_policy(f"static:{best}"), "copy"),
        "suffix": Contender(lambda: make_policy("suffix"), "copy"),
        f"prompt lookup (up to {depth} tokens)": Contender(lambda: StaticDepth(depth, "copy"), "lookup"),
        f"model only: default static:{DEFAULT_STATIC}": Contender(lambda: make_policy(f"static:{DEFAULT_STATIC}")),
        f"model only: cost model (static:{fitted['costmodel']['iid']})": Contender(lambda: make_policy(f"static:{fitted['costmodel']['iid']}")),
        "model only: confidence:0.4": Contender(lambda: make_policy("confidence:0.4")),
    }
    for path in learned:
        policy = load_policy(path, pair=config.pair)  # stateless between generations: one instance serves all
        with_copy = policy.schema.copy
        name = f"learned{'' if with_copy else ', model only'} ({Path(path).name})"
        chosen[name] = Contender(lambda p=policy: p, "copy" if with_copy else "model", with_copy)
        fitted.setdefault("learned", {})[path] = policy.metadata.get("config_digest")
    return chosen, fitted


def replay_records(config: ExperimentConfig, profile: CostProfile, chosen: dict[str, Contender], test: TraceSet) -> dict[str, list[PromptRecord]]:
    """Every contender (and both oracles) on every test trace, each with its drafters."""
    backends = {
        "model": ReplayBackend(test, profile, config.env.max_depth, copy=False),
        "copy": ReplayBackend(test, profile, config.env.max_depth),
        "lookup": ReplayBackend(test.with_lookup_as_copy(), profile, config.env.max_depth),
    }
    prompts, seconds = range(len(test)), config.env.decision_seconds
    records = {name: play(backends[c.drafters], c.policy, prompts, test.langs, seconds) for name, c in chosen.items()}
    model, copy = backends["model"], backends["copy"]
    records["oracle, model draft (replay only)"] = play(model, lambda: OraclePolicy(model), prompts, test.langs, seconds)
    records["oracle, source and depth per round (replay only)"] = play(copy, lambda: SourceOracle(copy), prompts, test.langs, seconds)
    return records


def task_counts(tasks: list[str]) -> dict[str, int]:
    """How many prompts of each task type ``tasks`` holds, in :data:`TASKS` order (absent types left out)."""
    return {task: tasks.count(task) for task in TASKS if task in tasks}


def per_task(records: list[PromptRecord], tasks: list[str]) -> dict[str, list[PromptRecord]]:
    """A contender's records split by the task type of their prompt (``tasks``: one per record), and all of them."""
    return {task: [r for r, t in zip(records, tasks) if task in (t, "all")] for task in (*task_counts(tasks), "all")}


def task_table(records: dict[str, list[PromptRecord]], tasks: list[str], step_seconds: float) -> tuple[list[list], dict]:
    """Speedup per task type (and over all prompts) with its 95 % bootstrap interval, per contender."""
    rows, data = [], {}
    for name, mine in records.items():
        data[name] = {task: summarise(subset, step_seconds).__dict__ for task, subset in per_task(mine, tasks).items()}
        rows.append([name, *(f"{d['speedup']:.2f}x [{d['low']:.2f}, {d['high']:.2f}]" for d in data[name].values())])
    return rows, data


def gains(records: dict[str, list[PromptRecord]], chosen: dict[str, Contender], tasks: list[str]) -> dict[str, dict]:
    """Replay ratios with paired intervals: every learned run with the copy drafter against grid search,
    SuffixDecoding's rule and prompt lookup over all prompts, and against every model-only learned run per
    task type."""
    grid = next(name for name in chosen if name.startswith("grid search"))
    lookup = next(name for name in chosen if name.startswith("prompt lookup"))
    model_only = [name for name, c in chosen.items() if name.startswith("learned") and not c.learned_with_copy]
    result = {}
    for name, contender in chosen.items():
        if not contender.learned_with_copy:
            continue
        for other in (grid, "suffix", lookup):
            result[f"{name} vs {other}"] = {"all": records_gain(records[name], records[other])}
        mine = per_task(records[name], tasks)
        for other in model_only:
            theirs = per_task(records[other], tasks)
            result[f"{name} vs {other}"] = {task: records_gain(mine[task], theirs[task]) for task in mine}
    return result


def live_decoders(pair, chosen: dict[str, Contender], max_depth: int) -> dict[str, Callable[[], SpeculativeDecoder]]:
    """Factories of live decoders, each with its contender's drafters."""
    beside = {"model": lambda: None, "copy": CopyDraft, "lookup": lambda: PromptLookupDraft(num_tokens=max_depth)}
    return {
        name: (lambda c=c: SpeculativeDecoder(pair.target, pair.draft, c.policy(), tokenizer=pair.tokenizer, max_depth=max_depth, copy=beside[c.drafters]()))
        for name, c in chosen.items()
    }


def evaluate_sources(config: ExperimentConfig, learned: list[str], out: Path, live_per_language: int = 2, new_tokens: int = 128, repeats: int = 2) -> dict:
    """The whole comparison; writes ``report.md``, ``evaluation.json`` and plots into ``out``. The live part keeps
    its finished prompts in ``out`` until then: run again into the same ``out``, it resumes."""
    out.mkdir(parents=True, exist_ok=True)
    pair = live_protocol.warm_pair(config.pair, config.dtype, decoding_engine(config)) if live_per_language else None  # loaded (and compiled) once
    profile = resolve_profile(config, out, pair=pair)
    train, val, test = (TraceSet.load(default_traces(split, config.pair, copy=True, engine=profile.engine)) for split in SPLITS)
    chosen, fitted = contenders(config, profile, learned, train, val)
    task_of = {p["id"]: p["task"] for split in SPLITS for p in load_prompts(split)}
    tasks = [task_of[pid] for pid in test.prompt_ids]
    records = replay_records(config, profile, chosen, test)
    step = profile.target_step_seconds
    language_rows, replay_data = replay_table(records, step, config.env.max_depth)
    task_rows, task_data = task_table(records, tasks, step)
    live: dict = {}
    live_tasks: dict = {}
    live_gains: dict = {}
    if live_per_language:
        prompts, ids = live_protocol.first_prompts(pair, "test", live_per_language, LIVE_TASKS)
        decoders = live_decoders(pair, {name: c for name, c in chosen.items() if name.startswith(LIVE)}, config.env.max_depth)
        checkpoint, identity = live_protocol.checkpoint_path(out, "test"), live_protocol.identity(pair, {"draft": pair.draft}, learned)
        rows = live_protocol.measure(pair.target, prompts, ids, decoders, new_tokens, repeats, desc="live test", checkpoint=checkpoint, identity=identity)
        live = live_protocol.summarise(rows)
        live_tasks = task_counts([task_of[r["id"]] for r in rows[live_protocol.PLAIN]])
        live_gains = {
            f"{name} vs {other}": live_protocol.compare(rows, name, other)
            for name, c in chosen.items()
            if c.learned_with_copy
            for other in decoders
            if other.startswith(("grid search", "suffix", "prompt lookup", "learned, model only"))
        }
    result = {
        "fitted": fitted,
        "replay": replay_data,
        "replay_tasks": task_data,
        "gains": gains(records, chosen, tasks),
        "live": live,
        "live_tasks": live_tasks,
        "live_gains": live_gains,
        "test_prompts": len(test),
        "tasks": task_counts(tasks),
        **provenance(config, profile, out, live_per_language, repeats, new_tokens),
    }
    (out / "evaluation.json").write_text(json.dumps(result, indent=1))
    (out / "report.md").write_text(_report(result, language_rows, task_rows))
    plot_speedups(replay_data, out / "plots" / "speedup_replay.png", "replay: sources, depths and baselines per language (test split)")
    plot_speedups(task_data, out / "plots" / "speedup_replay_tasks.png", "replay: speedup per task type (test split)", columns=(*result["tasks"], "all"))
    if live:
        plot_speedups(live, out / "plots" / "speedup_live.png", "live: speedup per language (test split)")
    track_comparison(config, out, language_rows, replay_data, live, {"replay_speedup_per_task": (["policy", *result["tasks"], "all"], task_rows)})
    live_protocol.discard_checkpoints(out)
    return result


def _gain_text(gain: dict) -> str:
    text = f"{gain['ratio']:.3f}x [{gain['low']:.3f}, {gain['high']:.3f}]"
    return text + (", not significant" if gain["verdict"] == "not significant" else "")


def _report(result: dict, language_rows: list[list], task_rows: list[list]) -> str:
    fitted, info = result["fitted"], result["profile_info"]
    mean = {key: (speed + fitted["grid_val"][key]) / 2 for key, speed in fitted["grid_train"].items()}
    grid = sorted(mean.items(), key=lambda kv: -kv[1])[:5]
    lines = [
        "# Evaluation: a copy drafter beside the model (greedy)",
        "",
        f"Test split: {result['test_prompts']} prompts of every task type ({', '.join(f'{t} {n}' for t, n in result['tasks'].items())}), "
        f"replay (exact greedy acceptances, time from {result['profile']}: measured {info['measured_at']}, {info['dtype']}, "
        f"target step {info['target_step_ms']:.1f} ms, c = {info['c']:.3f}).",
        f"Grid search over static (depth, source) on the train and val copy traces (mean): static:{fitted['grid_best']} "
        f"(best five: {', '.join(f'{k} {v:.3f}x' for k, v in grid)}); "
        f"cost model (model draft, α = {fitted['alpha_train']:.3f} on train): static:{fitted['costmodel']['iid']}.",
        "Prompt lookup: transformers' rule (2-gram, then 1-gram) in the copy drafter's place, drafting to the depth cap; "
        "model only: decoding without a copy drafter.",
        "",
        "## Replay: speedup over plain decoding per language [95 % bootstrap over prompts]",
        "",
        format_table(["policy", *LANGUAGES, "all", "tau"], language_rows),
        "",
        "## Replay: speedup over plain decoding per task type [95 % bootstrap over prompts]",
        "",
        format_table(["policy", *result["tasks"], "all"], task_rows),
        "",
        "## Gains (replay, [95 % paired bootstrap over prompts])",
        "",
    ]
    for label, per_task in result["gains"].items():
        lines.append(f"- {label}: " + "; ".join(f"{task} {_gain_text(g)}" for task, g in per_task.items()))
    if not result["gains"]:
        lines.append("- no learned run with a copy drafter given (--policy RUN)")
    if result["live"]:
        lines += live_protocol.report(result["live"], result["repeats"])
        lines.append(f"Live prompts per task type: {', '.join(f'{t} {n}' for t, n in result['live_tasks'].items())}.")
        lines += ["", "## Gains (live, [95 % paired bootstrap over prompts])", ""]
        lines += [f"- {label}: {_gain_text(g)}" for label, g in result["live_gains"].items()]
    lines.append(f"\nPlots: {result['out']}/plots; W&B (offline by default): {result['out']}/wandb.")
    return "\n".join(lines) + "\n"
