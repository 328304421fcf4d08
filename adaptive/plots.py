"""Evaluation plots (PNG): speedup per policy and language; throughput against static depth with the cost
model's curve over it."""

from __future__ import annotations

from pathlib import Path

LANGS = ("it", "en", "zh", "es", "all")


def plot_evaluation(result: dict, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    for mode in ("replay", "live"):
        data = result.get(mode) or {}
        if not data:
            continue
        names = list(data)
        figure, axis = plt.subplots(figsize=(14, 4.5))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            values = [data[name][lang]["speedup"] for lang in LANGS]
            axis.bar([x + i * width for x in range(len(LANGS))], values, width, label=name)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xticks([x + 0.4 - width / 2 for x in range(len(LANGS))], LANGS)
        axis.set(ylabel="speedup over plain decoding", title=f"{mode}: speedup per policy and language (test split)")
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        figure.tight_layout()
        figure.savefig(folder / f"speedup_{mode}.png", dpi=110)
        plt.close(figure)
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
