"""Evaluation plots (PNG): speedup per policy and language; throughput against static depth with the cost
model's curve over it; accepted-length histograms; what the learned policy chose against what it saw; the
acceptance predictor's reliability diagram."""

from __future__ import annotations

import csv
from pathlib import Path

from adaptive.workload import LANGUAGES

COLUMNS = (*LANGUAGES, "all")
"""Bars per language and over all prompts."""


def plot_evaluation(result: dict, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for mode in ("replay", "live"):
        if result.get(mode):
            plot_speedups(result[mode], folder / f"speedup_{mode}.png", f"{mode}: speedup per policy and language (test split)")
    fitted = result["fitted"]
    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    for split in ("train", "val"):
        speeds = fitted[f"grid_{split}"]["speedups"]
        axis.plot([int(g) for g in speeds], list(speeds.values()), marker="o", label=f"replay, {split} traces")
    model = fitted["model_speedups"]
    axis.plot([int(g) for g in model], list(model.values()), linestyle="--", label=f"cost model, alpha={fitted['alpha_train']:.2f} (train)")
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set(xlabel="static depth", ylabel="speedup over plain decoding", title="throughput vs static depth")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(folder / "static_depth.png", dpi=110)
    plt.close(figure)
    _plot_accepted_lengths(plt, result["replay"], folder / "accepted_lengths.png")
    if result.get("choices"):
        _plot_choices(plt, result["choices"], folder / "learned_choices.png")


def plot_speedups(data: dict, path: Path, title: str, columns: tuple[str, ...] = COLUMNS) -> None:
    """Grouped bars: speedup over plain decoding per policy (``data[name][column]["speedup"]``) and column
    (languages and all, or e.g. task types)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(data)
    figure, axis = plt.subplots(figsize=(14, 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        axis.bar([x + i * width for x in range(len(columns))], [data[name][column]["speedup"] for column in columns], width, label=name)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks([x + 0.4 - width / 2 for x in range(len(columns))], columns)
    axis.set(ylabel="speedup over plain decoding", title=title)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


HISTOGRAM_POLICIES = ("grid search", "default static", "cost model iid", "entropy", "learned", "oracle")


def _plot_accepted_lengths(plt, replay: dict, path: Path) -> None:
    """Share of rounds by accepted length (all languages) for the main policies."""
    names = [n for n in replay if n.startswith(HISTOGRAM_POLICIES)]
    figure, axis = plt.subplots(figsize=(9, 4.2))
    width = 0.8 / max(1, len(names))
    lengths = max(len(replay[name]["all"]["accepted_hist"]) for name in names)
    for i, name in enumerate(names):
        counts = replay[name]["all"]["accepted_hist"]
        counts = counts + [0] * (lengths - len(counts))
        total = max(1, sum(counts))
        axis.bar([x + i * width for x in range(lengths)], [c / total for c in counts], width, label=f"{name} (tau {replay[name]['all']['tau']:.2f})")
    axis.set_xticks([x + 0.4 - width / 2 for x in range(lengths)], [str(x) for x in range(lengths)])
    axis.set(xlabel="draft tokens accepted in the round", ylabel="share of rounds", title="accepted length per round (replay, test split)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_choices(plt, choices: dict, path: Path) -> None:
    """Mean depth drafted (solid) and tokens accepted (dashed) per round, against the draft's first-step
    confidence and the position in the generation."""
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, data in choices.items():
        for axis, key in zip(axes, ("confidence", "position")):
            rows = data[key]
            x = [(r["low"] + r["high"]) / 2 for r in rows]
            (line,) = axis.plot(x, [r["depth"] for r in rows], marker="o", label=f"{name}: depth")
            axis.plot(x, [r["accepted"] for r in rows], linestyle="--", color=line.get_color(), label=f"{name}: accepted")
    axes[0].set(xlabel="draft top-1 probability at the round's first step", ylabel="tokens per round", title="choice vs draft confidence")
    axes[1].set(xlabel="tokens generated before the round", ylabel="tokens per round", title="choice vs position in the generation")
    for axis in axes:
        axis.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_training(folder: Path) -> None:
    """Reward and throughput over training, per phase, into ``plots/training.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with (folder / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for phase in sorted({int(r["phase"]) for r in rows}):
        mine = [r for r in rows if int(r["phase"]) == phase]
        label = f"phase {phase + 1} ({mine[0]['decision']})"
        steps = [int(r["timesteps"]) for r in mine]
        axes[0].plot(steps, [float(r["reward_per_cycle"]) for r in mine], label=label)
        axes[1].plot(steps, [float(r["throughput_speedup"]) for r in mine], label=label)
    axes[0].set(title="reward per cycle", xlabel="environment steps in phase")
    axes[1].set(title="throughput (speedup over plain decoding)", xlabel="environment steps in phase")
    for axis in axes:
        axis.grid(alpha=0.3)
        axis.legend()
    figure.tight_layout()
    (folder / "plots").mkdir(exist_ok=True)
    figure.savefig(folder / "plots" / "training.png", dpi=110)
    plt.close(figure)


def plot_load_test(result: dict, path: Path) -> None:
    """Against load (one point per load of the run): throughput, goodput and p50 / p95 TPOT per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    labels = list(result["loads"])
    policies = list(result["loads"][labels[0]]["summary"])
    figure, (speed, latency) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in policies:
        overall = [result["loads"][label]["summary"][name]["all"] for label in labels]
        line = speed.plot(labels, [s["throughput"] for s in overall], marker="o", label=f"{name} throughput")[0]
        speed.plot(labels, [s["goodput"] for s in overall], marker="x", linestyle="--", color=line.get_color(), label=f"{name} goodput")
        latency.plot(labels, [s["tpot_ms"]["p50"] for s in overall], marker="o", color=line.get_color(), label=f"{name} p50")
        latency.plot(labels, [s["tpot_ms"]["p95"] for s in overall], marker="^", linestyle=":", color=line.get_color(), label=f"{name} p95")
    speed.set(xlabel="load", ylabel="tokens / s", title="throughput and goodput")
    latency.set(xlabel="load", ylabel="ms per output token (TPOT)", title="latency per output token")
    for axis in (speed, latency):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
        axis.tick_params(axis="x", labelrotation=20)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_sweep(comparison: dict, path: Path) -> None:
    """Per run of a sweep: the learned policy's and the best static depth's replay speedup, with their 95 %
    intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = comparison["runs"]
    figure, axis = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 4.5))
    for offset, key, label in ((-0.2, "learned", "learned"), (0.2, "best_static", "best static depth")):
        values = [row[key]["speedup"] for row in rows]
        errors = [[v - row[key]["low"] for v, row in zip(values, rows)], [row[key]["high"] - v for v, row in zip(values, rows)]]
        axis.bar([x + offset for x in range(len(rows))], values, 0.4, yerr=errors, capsize=3, label=label)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_xticks(range(len(rows)), [row["run"] for row in rows], rotation=30, ha="right", fontsize=7)
    axis.set(ylabel="replay speedup over plain decoding", title="sweep: learned vs best static depth per run [95 % interval]")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_calibration(result: dict, path: Path) -> None:
    """Reliability diagram of the acceptance predictor and of the draft's top-1 probability read as P(accepted)
    (:func:`lab.acceptance.calibration`): mean predicted against observed acceptance per bin, sized by count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axis = plt.subplots(figsize=(5.2, 5.0))
    axis.plot([0, 1], [0, 1], color="black", linewidth=0.8, label="perfect calibration")
    total = result["examples"]
    for key, label in (("predictor", "acceptance predictor"), ("top1", "draft top-1 probability")):
        bins = result[key]["bins"]
        sizes = [max(8.0, 400.0 * b["count"] / total) for b in bins]
        axis.plot([b["predicted"] for b in bins], [b["observed"] for b in bins], marker="o", label=f"{label} (ECE {result[key]['ece']:.3f})")
        axis.scatter([b["predicted"] for b in bins], [b["observed"] for b in bins], s=sizes, alpha=0.3)
    axis.set(xlabel="predicted P(accepted)", ylabel="observed acceptance", title="acceptance of a drafted token (held-out traces)", xlim=(0, 1), ylim=(0, 1))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
