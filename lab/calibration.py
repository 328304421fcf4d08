"""Does replay agree with this machine right now? Modelled against measured seconds per token.

Before policies are compared, a few val prompts are decoded live (plain decoding and one speculative
policy, with the live protocol) and replayed on their recorded traces with the same policy under the cost
profile in use. The relative error of the modelled seconds per token against the measured ones tells a
reader whether the replay numbers describe this machine now; a large one is flagged with its likely cause.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from adaptive.policy import DraftPolicy
from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from envs.replay import ReplayBackend
from lab import live_protocol
from lab.evaluation import play

WARN_ABOVE = 0.15
"""Relative error beyond which the report warns that replay and this machine disagree."""


def calibrate(
    target,
    decoder: Callable[[], object],
    prompts: list[dict],
    prompt_ids: list[list[int]],
    traces: TraceSet,
    profile: CostProfile,
    name: str,
    policy: Callable[[], DraftPolicy],
    max_depth: int,
    decision_seconds: float,
    repeats: int = 2,
    checkpoint: Path | None = None,
    identity: dict | None = None,
    measured: dict[str, list[dict]] | None = None,
) -> dict:
    """Modelled (replay of ``traces`` under ``profile``) against measured (live: plain decoding of ``target``
    and ``decoder``, a factory of the decoder running ``policy``; resumable from ``checkpoint``) seconds per
    token, on the ``prompts`` the traces hold, with the traces' token budget; plain decoding modelled as the
    profile's one-token step at the context of each token it emits. ``measured``: live rows of plain
    and ``name`` on these prompts with that budget, taken already (grid search's live check), used as they are."""
    index = {prompt_id: i for i, prompt_id in enumerate(traces.prompt_ids)}
    kept = [(prompt, ids) for prompt, ids in zip(prompts, prompt_ids, strict=True) if prompt["id"] in index]
    if not kept:
        raise ValueError("none of the calibration prompts has a recorded trace")
    prompts, prompt_ids = [p for p, _ in kept], [i for _, i in kept]
    if measured is None:
        live = live_protocol.measure(
            target, prompts, prompt_ids, {name: decoder}, traces.max_new_tokens, repeats, desc="calibration", checkpoint=checkpoint, identity=identity
        )
    else:
        wanted = [prompt["id"] for prompt in prompts]
        live = {key: [row for row in measured[key] if row["id"] in wanted] for key in (live_protocol.PLAIN, name)}
        if [row["id"] for row in live[name]] != wanted:
            raise ValueError(f"the rows given hold prompts {[row['id'] for row in live[name]]}, calibration needs {wanted}")
    records = play(ReplayBackend(traces, profile, max_depth), policy, [index[p["id"]] for p in prompts], traces.langs, decision_seconds)
    tokens = sum(r.tokens for r in records)
    plain = sum(profile.verify_seconds(int(traces.prompt_lengths[r.prompt]) + t, 0) for r in records for t in range(r.tokens))
    modelled = {live_protocol.PLAIN: plain / tokens, name: sum(r.seconds for r in records) / tokens}
    rows = {key: compare_rows(modelled[key], live[key]) for key in (live_protocol.PLAIN, name)}
    return {"policy": name, "prompts": len(prompts), "repeats": repeats, "profile_measured_at": profile.document.get("measured_at"), "rows": rows}


def compare_rows(modelled: float, rows: list[dict]) -> dict:
    """Modelled seconds per token against live ``rows``: the whole call, and without the prefill (which replay does
    not model) where the rows hold it."""
    tokens = sum(r["tokens"] for r in rows)
    measured = sum(r["seconds"] for r in rows) / tokens
    compared = {"modelled_ms_per_token": modelled * 1e3, "measured_ms_per_token": measured * 1e3, "error": modelled / measured - 1}
    if all("prefill" in r for r in rows):  # rows of checkpoints older than the field lack it
        decoding = measured - sum(r["prefill"] for r in rows) / tokens
        compared |= {"decoding_ms_per_token": decoding * 1e3, "decoding_error": modelled / decoding - 1}
    return compared


def calibration_lines(result: dict) -> list[str]:
    """Markdown lines: the table of modelled vs measured, and a warning where they disagree."""
    lines = [
        "",
        f"## Calibration: replay against this machine now ({result['prompts']} val prompts, {result['repeats']}x each, live protocol)",
        "",
        "| decoder | modelled ms/token | measured ms/token | error | measured without the prefill | error without it |",
        "|---|---|---|---|---|---|",
    ]
    for key, row in result["rows"].items():
        decoding = f"{row['decoding_ms_per_token']:.1f} | {row['decoding_error']:+.1%}" if "decoding_error" in row else "– | –"
        lines.append(f"| {key} | {row['modelled_ms_per_token']:.1f} | {row['measured_ms_per_token']:.1f} | {row['error']:+.1%} | {decoding} |")
    worst = max(abs(row["error"]) for row in result["rows"].values())
    if worst > WARN_ABOVE:
        lines += [
            "",
            f"**Warning**: replay's modelled time is off by up to {worst:.0%} from this machine now (beyond ±{WARN_ABOVE:.0%}). "
            f"Likely causes: the machine is busy (other processes, thermal limits), or the profile is stale (measured "
            f"{result['profile_measured_at']}; re-run with --profile auto). Replay numbers below are relative to that profile; "
            "the live table is the final word.",
        ]
        decoding = [abs(row["decoding_error"]) for row in result["rows"].values() if "decoding_error" in row]
        if len(decoding) == len(result["rows"]):
            lines[-1] += f" Replay leaves the prompt's prefill out: without it the error is up to {max(decoding):.0%}."
    return lines
