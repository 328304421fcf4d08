"""Where plain decoding's live milliseconds per token go, against what a cost profile models for them.

Plain decoding (``generate_plain``, the live protocol's baseline) of the first ``--per-language`` val prompts per
language, ``--repeats`` times each, on the default pair and engine: its ms per generated token split into the
prompt's prefill (which replay does not model), the target's forwards and the loop's own work. Beside it, in the same
process and interleaved with those generations, the profile's way of timing a step: one token fed after the prompt
and rolled back, ``--steps`` times per prompt (medians). With ``--profile`` the profile's one-token step at each
emitted token's context (what calibration models) joins the table.

Run: .venv/bin/python benchmarks/plain_time_breakdown.py [--per-language 1] [--repeats 2] [--steps 30] [--profile PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from adaptive.decoder import generate_plain
from adaptive.engines import engine_of
from adaptive.lean import open_cache
from adaptive.profile import CostProfile
from adaptive.profiling import hardware_description
from lab.live_protocol import first_prompts, warm_pair


def rolled_back_step(target, prompt: list[int], steps: int) -> float:
    """Median seconds of one token fed after ``prompt``, rolled back each time (as the profile times a step)."""
    session = open_cache(target)
    session.forward(prompt[:-1])
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        session.forward(prompt[-1:])
        times.append(time.perf_counter() - start)
        session.rollback(len(prompt) - 1)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-language", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="rolled-back steps timed per prompt and repeat")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--profile", type=Path, help="a cost profile (JSON) to set its modelled step beside the measured ones")
    args = parser.parse_args()
    torch.set_num_threads(2)
    pair = warm_pair("smollm2-135m", "auto", "auto")
    _, prompt_ids = first_prompts(pair, "val", args.per_language)
    profile = CostProfile.load(args.profile) if args.profile else None
    tokens = prefill = forwards = total = rolled = live_steps = modelled = 0.0
    for _ in range(args.repeats):
        for ids in prompt_ids:
            step = rolled_back_step(pair.target, ids, args.steps)
            result = generate_plain(pair.target, ids, args.new_tokens)
            emitted = len(result.token_ids)
            tokens += emitted
            total += result.total_time
            prefill += result.prefill_time
            forwards += sum(r.forward_time for r in result.rounds)
            rolled += step * emitted
            live_steps += statistics.median(r.forward_time for r in result.rounds) * emitted
            if profile:
                modelled += sum(profile.verify_seconds(r.context_length, 0) for r in result.rounds)
    per_token = {
        "measured, whole call": total,
        "  prefill (not modelled by replay)": prefill,
        "  target forwards": forwards,
        "  the loop's own work": total - prefill - forwards,
        "live step, median per generation": live_steps,
        "profile-style step (rolled back), same process": rolled,
    }
    if profile:
        per_token[f"modelled by the profile ({profile.document.get('measured_at')})"] = modelled
    print(f"plain decoding, {pair.name} on {engine_of(pair.target)} ({pair.target.dtype}), {hardware_description(pair.target.device)}")
    print(f"{len(prompt_ids)} val prompts ({[len(i) for i in prompt_ids]} tokens) x {args.repeats} repeats, {args.new_tokens} new tokens, greedy")
    for name, seconds in per_token.items():
        print(f"{name:<60} {seconds / tokens * 1e3:6.2f} ms/token")


if __name__ == "__main__":
    main()
