"""``adaptive sweep``: a grid of experiment configs — values of some keys × seeds — one training run each, as
Ray tasks or in this process (:mod:`lab.scale`), then one table comparing the runs.

Each run is an ordinary training run (its own folder under the sweep's, its own W&B run); the sweep's name
is every run's W&B group, and a summary run of job type ``sweep`` in that group holds the comparison table
and its plot. The comparison: per run, the learned policy's replay speedup over plain decoding and the best
static depth's, each with its 95 % bootstrap interval over evaluation episodes; per grid point, the mean
over seeds and the lowest and highest seed.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from lab.config import ConfigError, config_from_dict
from lab.plots import plot_sweep
from lab.report import format_table
from lab.scale import parallel_map
from lab.tracking import Tracker
from lab.training import train


@dataclass(frozen=True)
class SweepRun:
    """One training run of the grid."""

    name: str
    point: str
    """The grid point, e.g. ``env.max_depth=4 depth_policy.learning_rate=0.001`` (the base config: ``base``)."""
    seed: int
    config: dict


def parse_assignment(text: str) -> tuple[str, list]:
    """``key.path=v1,v2`` → (``key.path``, [v1, v2]), each value read as YAML (numbers, booleans, strings)."""
    key, sep, values = text.partition("=")
    if not sep or not key or not values:
        raise ValueError(f"--set expects KEY=V1,V2,... (e.g. env.max_depth=4,8), got {text!r}")
    return key, [yaml.safe_load(value) for value in values.split(",")]


def _with(config: dict, key: str, value) -> dict:
    """A copy of ``config`` with the dotted ``key`` set (sections created as needed)."""
    head, _, rest = key.partition(".")
    updated = dict(config)
    if rest:
        section = config.get(head, {})
        if not isinstance(section, dict):
            raise ConfigError(f"--set {key}: {head} is not a section of the config")
        updated[head] = _with(section, rest, value)
    else:
        updated[head] = value
    return updated


def grid(base: dict, assignments: list[tuple[str, list]], seeds: list[int], sweep: str) -> list[SweepRun]:
    """Every combination of the assigned values × seeds, validated before anything runs."""
    runs = []
    keys = [key for key, _ in assignments]
    for values in itertools.product(*(values for _, values in assignments)):
        point = " ".join(f"{k}={v}" for k, v in zip(keys, values)) or "base"
        for seed in seeds:
            config = base
            for key, value in zip(keys, values):
                config = _with(config, key, value)
            label = "-".join(f"{k.rsplit('.', 1)[-1]}{v}" for k, v in zip(keys, values))
            name = f"{base.get('name', 'experiment')}{'-' + label if label else ''}-s{seed}".replace("/", "_")
            config = _with(_with(_with(config, "seed", seed), "name", name), "tracking.group", sweep)
            config_from_dict(config)
            runs.append(SweepRun(name, point, seed, config))
    if len({run.name for run in runs}) != len(runs):
        raise ValueError("two runs of the sweep would share a name; give distinct values")
    return runs


def _train(task: tuple[dict, str]) -> dict:
    """One run (a Ray task or a call here): train, return its evaluation."""
    config, folder = task
    train(config_from_dict(config), folder)
    return json.loads((Path(folder) / "evaluation.json").read_text())


def compare(runs: list[SweepRun], evaluations: list[dict]) -> dict:
    """Per run and per grid point: the learned policy's and the best static depth's replay speedups."""
    rows = []
    for run, evaluation in zip(runs, evaluations):
        statics = {k: v for k, v in evaluation.items() if k.startswith("static:")}
        best = max(statics, key=lambda k: statics[k]["speedup"])
        rows.append({"run": run.name, "point": run.point, "seed": run.seed, "learned": evaluation["learned"], "best_static": {"policy": best, **statics[best]}})
    points = []
    for point in dict.fromkeys(run.point for run in runs):
        values = np.array([row["learned"]["speedup"] for row in rows if row["point"] == point])
        points.append({"point": point, "seeds": len(values), "mean": float(values.mean()), "min": float(values.min()), "max": float(values.max())})
    return {"runs": rows, "points": points}


def report(comparison: dict) -> str:
    """The comparison as markdown tables."""
    per_run = [
        [
            row["run"],
            row["point"],
            row["seed"],
            f"{row['learned']['speedup']:.3f}x [{row['learned']['low']:.3f}, {row['learned']['high']:.3f}]",
            f"{row['best_static']['policy']} {row['best_static']['speedup']:.3f}x [{row['best_static']['low']:.3f}, {row['best_static']['high']:.3f}]",
        ]
        for row in comparison["runs"]
    ]
    per_point = [[p["point"], p["seeds"], f"{p['mean']:.3f}x [{p['min']:.3f}, {p['max']:.3f}]"] for p in comparison["points"]]
    return "\n".join(
        [
            "## Runs: replay speedup over plain decoding [95 % bootstrap over evaluation episodes]",
            "",
            format_table(["run", "grid point", "seed", "learned", "best static"], per_run),
            "",
            "## Grid points: learned policy, mean over seeds [lowest, highest seed]",
            "",
            format_table(["grid point", "seeds", "learned"], per_point),
        ]
    )


def run_sweep(
    base_path: str | Path, assignments: list[tuple[str, list]], seeds: list[int], out: str | Path, workers: int = 1, address: str | None = None
) -> dict:
    """Train every run of the grid into ``out/RUN`` and write ``sweep.json``, ``report.md`` and ``sweep.png`` there."""
    out = Path(out)
    base = yaml.safe_load(Path(base_path).read_text()) or {}
    runs = grid(base, assignments, seeds, out.name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.json").write_text(json.dumps([run.__dict__ for run in runs], indent=1))
    evaluations = parallel_map(_train, [(run.config, str(out / run.name)) for run in runs], workers, address, desc=f"sweep {out.name}")
    comparison = compare(runs, evaluations)
    (out / "sweep.json").write_text(json.dumps(comparison, indent=1))
    (out / "report.md").write_text(report(comparison) + "\n")
    plot_sweep(comparison, out / "sweep.png")
    tracking = config_from_dict(runs[0].config).tracking
    tracker = Tracker(tracking.wandb, tracking.project, out.name, f"{out.name}-summary", {"base": str(base_path), "seeds": seeds}, out, job_type="sweep")
    tracker.log_table(
        "sweep",
        ["run", "grid point", "seed", "learned", "learned low", "learned high", "best static", "best static speedup"],
        [
            [
                r["run"],
                r["point"],
                r["seed"],
                r["learned"]["speedup"],
                r["learned"]["low"],
                r["learned"]["high"],
                r["best_static"]["policy"],
                r["best_static"]["speedup"],
            ]
            for r in comparison["runs"]
        ],
    )
    tracker.log_images({"plot/sweep": out / "sweep.png"})
    tracker.finish()
    return comparison
