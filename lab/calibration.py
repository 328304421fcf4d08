"""Does replay agree with this machine right now? Modelled against measured seconds per token.

Before policies are compared, a few val prompts are decoded live (plain decoding and one speculative
policy, with the live protocol) and replayed on their recorded traces with the same policy under the cost
profile in use. The relative error of the modelled seconds per token against the measured ones tells a
reader whether the replay numbers describe this machine now; a large one is flagged with its likely cause.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from adaptive.policy import DraftPolicy
from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from envs.replay import ReplayBackend
from lab import live_protocol
from lab.evaluation import PromptRecord, play

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
    ids = [prompt["id"] for prompt in prompts]
    rows = {
        live_protocol.PLAIN: compare_rows(modelled(traces, profile, ids, None, max_depth, decision_seconds), live[live_protocol.PLAIN]),
        name: compare_rows(modelled(traces, profile, ids, policy, max_depth, decision_seconds), live[name]),
    }
    return {"policy": name, "prompts": len(prompts), "repeats": repeats, "profile_measured_at": profile.document.get("measured_at"), "rows": rows}


def modelled(traces: TraceSet, profile: CostProfile, ids: list[str], policy: Callable[[], DraftPolicy] | None, max_depth: int, decision_seconds: float) -> dict:
    """What replay models for ``policy`` (None: plain decoding) on the traced prompts ``ids``: :func:`plain_model`, or
    :func:`records_model` of the policy's replayed generations."""
    index = {prompt_id: i for i, prompt_id in enumerate(traces.prompt_ids)}
    missing = [i for i in ids if i not in index]
    if missing:
        raise ValueError(f"prompts {missing} have no recorded trace")
    prompts = [index[i] for i in ids]
    if policy is None:
        return plain_model(traces, profile, prompts)
    return records_model(play(ReplayBackend(traces, profile, max_depth), policy, prompts, traces.langs, decision_seconds), traces.prompt_lengths, profile)


def plain_model(traces: TraceSet, profile: CostProfile, prompts: list[int]) -> dict:
    """Plain decoding of the traced ``prompts`` (indices) as replay models it: the profile's one-token step at the
    context of each token the trace emits, and the profile's plain prefill per prompt (None where it predates it)."""
    lengths = [int(traces.prompt_lengths[i]) for i in prompts]
    emitted = [int(traces.offsets[i + 1] - traces.offsets[i]) for i in prompts]
    seconds = sum(profile.verify_seconds(length + t, 0) for length, n in zip(lengths, emitted) for t in range(n))
    prefill = sum(profile.prefill_seconds(length, speculative=False) for length in lengths) if profile.prefill_ms else None
    return {"tokens": sum(emitted), "seconds": seconds, "prefill": prefill}


def records_model(records: Sequence[PromptRecord], prompt_lengths: Sequence[int], profile: CostProfile) -> dict:
    """Replayed generations of a speculative decoder: emitted tokens, the rounds' seconds, and the profile's speculative
    prefill for each prompt (``prompt_lengths`` by the records' prompt index; None where the profile predates it)."""
    prefill = sum(profile.prefill_seconds(int(prompt_lengths[r.prompt]), speculative=True) for r in records) if profile.prefill_ms else None
    return {"tokens": sum(r.tokens for r in records), "seconds": sum(r.seconds for r in records), "prefill": prefill}


def compare_rows(model: dict, rows: list[dict]) -> dict:
    """:func:`modelled` seconds per token against live ``rows``: the whole call (with the prefill, where the profile
    models it), and without the prefill on both sides where the rows hold it."""
    tokens = sum(r["tokens"] for r in rows)
    measured = sum(r["seconds"] for r in rows) / tokens
    decoding = model["seconds"] / model["tokens"]
    whole = decoding if model["prefill"] is None else (model["seconds"] + model["prefill"]) / model["tokens"]
    compared = {
        "modelled_ms_per_token": whole * 1e3,
        "measured_ms_per_token": measured * 1e3,
        "error": whole / measured - 1,
        "prefill_modelled": model["prefill"] is not None,
    }
    if all("prefill" in r for r in rows):  # rows of checkpoints older than the field lack it
        measured_decoding = measured - sum(r["prefill"] for r in rows) / tokens
        compared |= {
            "decoding_modelled_ms_per_token": decoding * 1e3,
            "decoding_ms_per_token": measured_decoding * 1e3,
            "decoding_error": decoding / measured_decoding - 1,
        }
    return compared


def sampled_counts(lives: Sequence, replays: Sequence) -> dict[str, float]:
    """Rounds, accepted tokens, tokens and draft + verify seconds of live generations (:class:`GenerationResult`) and of
    replayed episodes (:class:`~envs.rollout.Episode`) of one prompt: what sampled replay is held against live by."""
    return {
        "live_rounds": sum(len(g.rounds) for g in lives),
        "live_accepted": sum(r.accepted for g in lives for r in g.rounds),
        "live_tokens": sum(len(g.token_ids) for g in lives),
        "live_seconds": sum(r.draft_time + r.verify_time for g in lives for r in g.rounds),
        "replay_rounds": sum(len(e.cycles) for e in replays),
        "replay_accepted": sum(c.accepted for e in replays for c in e.cycles),
        "replay_tokens": sum(e.tokens for e in replays),
        "replay_seconds": sum(c.draft_seconds + c.verify_seconds for e in replays for c in e.cycles),
    }


def live_against_replay(rows: dict[str, list[dict]], replay: dict[str, list[PromptRecord]], traces: TraceSet, profile: CostProfile) -> dict:
    """Modelled against measured seconds per token for every row of a live table (``rows``: plain and each
    configuration), on the live prompts: plain from ``traces``, each configuration from its replayed records
    (``replay``, whose prompt indices follow ``traces``) of those prompts."""
    index = {prompt_id: i for i, prompt_id in enumerate(traces.prompt_ids)}
    prompts = [index[row["id"]] for row in rows[live_protocol.PLAIN]]
    compared = {live_protocol.PLAIN: compare_rows(plain_model(traces, profile, prompts), rows[live_protocol.PLAIN])}
    for name in [name for name in rows if name != live_protocol.PLAIN]:
        mine = {r.prompt: r for r in replay[name]}
        compared[name] = compare_rows(records_model([mine[p] for p in prompts], traces.prompt_lengths, profile), rows[name])
    return compared


def modelled_table(rows: dict[str, dict]) -> list[str]:
    """Markdown table of :func:`compare_rows` results by decoder: the whole call, and decoding alone."""
    lines = [
        "| decoder | modelled ms/token | measured ms/token | error | modelled without the prefill | measured without it | error without it |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, row in rows.items():
        whole = f"{row['modelled_ms_per_token']:.1f}{'' if row.get('prefill_modelled') else ' (no prefill)'}"
        decoding = (
            f"{row['decoding_modelled_ms_per_token']:.1f} | {row['decoding_ms_per_token']:.1f} | {row['decoding_error']:+.1%}"
            if "decoding_modelled_ms_per_token" in row
            else "– | – | –"
        )
        lines.append(f"| {key} | {whole} | {row['measured_ms_per_token']:.1f} | {row['error']:+.1%} | {decoding} |")
    return lines


def calibration_lines(result: dict) -> list[str]:
    """Markdown lines: the table of modelled vs measured, and a warning where they disagree."""
    lines = [
        "",
        f"## Calibration: replay against this machine now ({result['prompts']} val prompts, {result['repeats']}x each, live protocol)",
        "",
        *modelled_table(result["rows"]),
    ]
    worst = max(abs(row["error"]) for row in result["rows"].values())
    if worst > WARN_ABOVE:
        lines += [
            "",
            f"**Warning**: replay's modelled time is off by up to {worst:.0%} from this machine now (beyond ±{WARN_ABOVE:.0%}). "
            f"Likely causes: the machine is busy (other processes, thermal limits), or the profile is stale (measured "
            f"{result['profile_measured_at']}; re-run with --profile auto). Replay numbers below are relative to that profile; "
            "the live table is the final word.",
        ]
        if not all(row.get("prefill_modelled") for row in result["rows"].values()):
            lines[-1] += " This profile predates the prefill's measurement: replay leaves the prompt's prefill out."
    return lines
