"""The model card a draft training keeps beside the draft (``out/README.md``): what the draft is, the data
it saw, how it was trained and its held-out accuracy at every checkpoint, rewritten at each checkpoint from
the run's own log, so a committed draft always carries its provenance."""

from __future__ import annotations


def model_card(title: str, description: str, command: str, config: dict, state: dict, log: list[dict], data: dict) -> str:
    """Markdown: the draft, its data (:func:`lab.draft_training.data_summary`), its training (``config``: the
    training settings) and the held-out accuracy logged at each checkpoint."""
    lines = [
        f"# Model card: {title}",
        "",
        description,
        "",
        "## Data",
        "",
        "The target's own responses to the draft-training prompt pool (`data/workload/draft-prompts.jsonl`, disjoint from",
        "every policy workload prompt), from `data/distill/` (`adaptive distill-data`). Trained on:",
        "",
        "| shards | language | sequences | response tokens |",
        "|---|---|---|---|",
        *(f"| {r['shards']} | {r['lang']} | {r['sequences']:,} | {r['response_tokens']:,} |" for r in data["rows"]),
        "",
        f"Held out (never trained on, by a hash of the prompt id): {data['heldout_sequences']} sequences measured at each checkpoint.",
        "",
        "## Training",
        "",
        f"`{command}`; settings: {', '.join(f'{k} {v}' for k, v in config.items())}.",
        f"Steps done: {state['step']:,} of {config['steps']:,} (started {state.get('started', '?')}).",
    ]
    if state.get("fresh_optimiser_at"):
        lines.append(
            f"Continued on another machine from the committed draft at step(s) {', '.join(map(str, state['fresh_optimiser_at']))}: "
            f"the optimiser's moments started afresh there, under a new warm-up of {config['warmup_steps']} steps."
        )
    lines += [
        "",
        "## Held-out accuracy",
        "",
        "Per draft position k: how often the draft's arg-max equals the target's greedy token, the earlier steps",
        "given right (teacher-forced, as in greedy verification); τ@4: 1 + tokens a depth-4 chain would have",
        "accepted per round; per language: position 1. On the held-out draft-training prompts:",
        "",
        *_accuracy_table([(entry, entry) for entry in log], train_loss=True),
    ]
    for name in dict.fromkeys(key for entry in log for key, value in entry.items() if isinstance(value, dict) and "accuracy" in value):
        lines += ["", f"On the workload's {name} split (the target's fp32 greedy outputs of its traces; never trained on):", ""]
        lines += _accuracy_table([(entry, entry[name]) for entry in log if name in entry], train_loss=False)
    lines += ["", 'Measured in speculative decoding: the repository README ("Measurements").']
    return "\n".join(lines) + "\n"


def _accuracy_table(rows: list[tuple[dict, dict]], train_loss: bool) -> list[str]:
    """Markdown rows: per checkpoint (log entry, measurement) the losses, accuracy per position, τ@4 and
    position-1 accuracy per language."""
    languages = sorted({lang for _, measured in rows for lang in measured.get("per_language", {})})
    positions = max((len(measured["accuracy"]) for _, measured in rows), default=0)
    header = ["step", *(["train loss"] if train_loss else []), "loss", *(f"pos {k + 1}" for k in range(positions)), "τ@4", *languages]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for entry, measured in rows:
        cells = [str(entry["step"])]
        if train_loss:
            cells.append(f"{entry['loss']:.3f}" if "loss" in entry else "–")
        cells.append(f"{measured['heldout_loss']:.3f}")
        cells += [f"{a:.3f}" for a in measured["accuracy"]]
        cells.append(f"{measured['tau_depth4']:.2f}" if measured.get("tau_depth4") else "–")
        cells += [f"{measured['per_language'][lang][0]:.3f}" if lang in measured.get("per_language", {}) else "–" for lang in languages]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
