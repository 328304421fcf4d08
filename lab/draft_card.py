"""The model card a draft training keeps beside the draft (``out/README.md``): what the draft is, the data
it saw, how it was trained and its held-out accuracy at every checkpoint, rewritten at each checkpoint from
the run's own log, so a committed draft always carries its provenance."""

from __future__ import annotations


def model_card(title: str, description: str, command: str, config: dict, state: dict, log: list[dict], data: dict) -> str:
    """Markdown: the draft, its data (:func:`lab.draft_training.data_summary`), its training (``config``: the
    training settings) and the held-out accuracy logged at each checkpoint."""
    languages = sorted({lang for entry in log for lang in entry.get("per_language", {})})
    positions = max((len(entry["accuracy"]) for entry in log), default=0)
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
        "accepted per round; per language: position 1.",
        "",
        "| step | train loss | held-out loss | " + " | ".join(f"pos {k + 1}" for k in range(positions)) + " | τ@4 | " + " | ".join(languages) + " |",
        "|---" * (3 + positions + 1 + len(languages)) + "|",
    ]
    for entry in log:
        accuracy = " | ".join(f"{a:.3f}" for a in entry["accuracy"])
        tau = f"{entry['tau_depth4']:.2f}" if entry.get("tau_depth4") else "–"
        per_lang = " | ".join(f"{entry['per_language'][lang][0]:.3f}" if lang in entry.get("per_language", {}) else "–" for lang in languages)
        loss = f"{entry['loss']:.3f}" if "loss" in entry else "–"
        lines.append(f"| {entry['step']} | {loss} | {entry['heldout_loss']:.3f} | {accuracy} | {tau} | {per_lang} |")
    lines += ["", 'Measured in speculative decoding: the repository README ("Measurements").']
    return "\n".join(lines) + "\n"
