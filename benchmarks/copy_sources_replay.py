"""Replay: a learned source + depth policy against grid search over static (source, depth) and SuffixDecoding's rule.

Compared on trace files holding the copy drafter's chains (``adaptive record --copy``), every policy on
every prompt of each file, exact greedy acceptances, time from one cost profile (by default the one the
run measured at start): the learned policy of a run (``experiments/copy.yaml``), every static depth
1..max_depth with each source (model, copy, copy then model), the ``suffix`` rule, and the model-only
static depths without a copy drafter. Reported per file and per task type: speedup over plain decoding
(emitted tokens / modelled seconds × one target step), the best static (source, depth) and the learned
policy's ratio to it, with a 95 % bootstrap interval over prompts.

Run: .venv/bin/python benchmarks/copy_sources_replay.py RUN_DIR [TRACES.npz ...] [--profile FILE]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from adaptive.learned_policy import load_policy
from adaptive.policy import SOURCES, DraftPolicy
from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from adaptive.workload import SPLITS, load_prompts
from envs.replay import ReplayBackend
from envs.rollout import Episode, run_policy
from lab.report import format_table
from policies import make_policy

DEFAULT_TRACES = ["data/traces/smollm2-135m-test-copy-heavy-copy.npz"]


def play(traces: TraceSet, profile: CostProfile, policy: DraftPolicy, max_depth: int, copy: bool = True) -> list[Episode]:
    backend = ReplayBackend(traces, profile, max_depth=max_depth, copy=copy)
    return run_policy(backend, policy, list(range(len(traces))), decision_seconds=1e-4)


def speedup(episodes: list[Episode], step_seconds: float, keep: np.ndarray | None = None) -> float:
    chosen = episodes if keep is None else [e for e, k in zip(episodes, keep) if k]
    return sum(e.tokens for e in chosen) / sum(e.seconds for e in chosen) * step_seconds


def ratio_interval(a: list[Episode], b: list[Episode], seed: int = 0, draws: int = 2000) -> tuple[float, float]:
    """95 % bootstrap interval over prompts of throughput(a) / throughput(b)."""
    rng = np.random.default_rng(seed)
    tokens_a, seconds_a = np.array([e.tokens for e in a]), np.array([e.seconds for e in a])
    tokens_b, seconds_b = np.array([e.tokens for e in b]), np.array([e.seconds for e in b])
    picks = rng.integers(0, len(a), (draws, len(a)))
    ratios = (tokens_a[picks].sum(1) / seconds_a[picks].sum(1)) / (tokens_b[picks].sum(1) / seconds_b[picks].sum(1))
    return float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a training run folder of experiments/copy.yaml (its final policy and profile.json)")
    parser.add_argument("traces", nargs="*", default=DEFAULT_TRACES, help="trace files recorded with --copy")
    parser.add_argument("--profile", type=Path, help="cost profile (default: the run's profile.json)")
    args = parser.parse_args()
    profile = CostProfile.load(args.profile or args.run / "profile.json")
    learned = load_policy(args.run)
    max_depth = learned.schema.max_depth
    tasks = {p["id"]: p["task"] for split in SPLITS for p in load_prompts(split)}
    step = profile.target_step_seconds
    for path in args.traces:
        traces = TraceSet.load(path)
        runs = {f"static:{g}:{s}": play(traces, profile, make_policy(f"static:{g}:{s}"), max_depth) for s in SOURCES for g in range(1, max_depth + 1)}
        model_only = {
            f"static:{g} (no copy drafter)": play(traces, profile, make_policy(f"static:{g}"), max_depth, copy=False) for g in range(1, max_depth + 1)
        }
        best = max(runs, key=lambda name: speedup(runs[name], step))
        best_model = max(model_only, key=lambda name: speedup(model_only[name], step))
        rows = {"learned (source + depth)": play(traces, profile, learned, max_depth), f"grid best: {best}": runs[best],
                "suffix": play(traces, profile, make_policy("suffix"), max_depth), f"model-only grid best: {best_model}": model_only[best_model]}  # fmt: skip
        prompt_tasks = np.array([tasks.get(pid, "?") for pid in traces.prompt_ids])
        names = sorted(set(prompt_tasks))
        table = [[name, f"{speedup(eps, step):.2f}x", *(f"{speedup(eps, step, prompt_tasks == t):.2f}x" for t in names)] for name, eps in rows.items()]
        low, high = ratio_interval(rows["learned (source + depth)"], runs[best])
        ratio = speedup(rows["learned (source + depth)"], step) / speedup(runs[best], step)
        print(f"\n{path}: {len(traces)} prompts, {int(traces.offsets[-1])} positions; profile {args.profile or args.run / 'profile.json'}")
        print(f"grid: static depth 1..{max_depth} x sources {', '.join(SOURCES)} ({max_depth * len(SOURCES)} policies); speedup over plain decoding")
        print(format_table(["policy", "all", *names], table))
        print(f"learned / grid best: {ratio:.3f} [95 % bootstrap over prompts: {low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    main()
