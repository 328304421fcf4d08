"""Where one decoding call's time goes: the target's verification forward and a draft step, by operator.

For each call (the target fed 1 and 4 tokens after a 128-token context; one draft step of the pair's
standalone draft and, with --head, of an EAGLE-3 head, each after the same context): median milliseconds
over --repetitions timed calls (after warm-up), and the torch profiler's share of self CPU time in matrix
multiplies (``aten::mm``/``bmm``: reading the weights) against everything else (small element-wise ops,
concatenations, copies: framework overhead). With --compile it also times the target under
``torch.compile(dynamic=True)`` (compile time included in its own line).

Run: .venv/bin/python benchmarks/call_profile.py [--dtype bfloat16] [--head DIR] [--repetitions 50] [--compile]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from adaptive import load_pair
from adaptive.cached_model import CachedModel
from adaptive.drafts import draft_session, target_taps
from adaptive.eagle3 import load_head
from adaptive.profiling import hardware_description
from lab.report import format_table

CONTEXT = list(range(100, 228))


def timed(step: Callable[[], None], repetitions: int) -> tuple[float, float]:
    """Median ms of ``step`` and the share of its profiled self CPU time spent in matrix multiplies."""
    for _ in range(5):
        step()
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::bmm", "aten::addmm"))
    return statistics.median(times) * 1e3, matmul / max(total, 1e-9)


def after_context(session, tokens: list[int]) -> Callable[[], None]:
    """One call feeding ``tokens`` after the cached context, rolled back after."""
    length = session.length

    def step() -> None:
        session.forward(tokens)
        session.rollback(length)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--head", help="an EAGLE-3 head folder to profile beside the pair's draft")
    parser.add_argument("--repetitions", type=int, default=50)
    parser.add_argument("--compile", action="store_true", help="also time the target under torch.compile (minutes)")
    args = parser.parse_args()
    pair = load_pair(args.pair, args.dtype)
    rows = []
    target = CachedModel(pair.target)
    target.forward(CONTEXT)
    for n in (1, 4):
        ms, share = timed(after_context(target, [5] * n), args.repetitions)
        rows.append([f"target forward, {n} token(s)", f"{ms:.2f}", f"{share:.0%}"])
    base = float(rows[0][1])
    drafts = {"standalone draft step": pair.draft}
    if args.head:
        drafts["EAGLE-3 head step"] = load_head(args.head, pair.target)
    for name, draft in drafts.items():
        reading = CachedModel(pair.target, taps=target_taps(draft))
        if reading.taps:
            reading.forward(CONTEXT[:-1])
        session = draft_session(draft, reading)
        session.forward(CONTEXT)
        ms, share = timed(after_context(session, [5]), args.repetitions)
        rows.append([f"{name} (c = {ms / base:.3f})", f"{ms:.2f}", f"{share:.0%}"])
    if args.compile:
        start = time.perf_counter()
        pair.target.model = torch.compile(pair.target.model, dynamic=True)
        compiled = CachedModel(pair.target)
        compiled.forward(CONTEXT)
        for n in (1, 4):
            after_context(compiled, [5] * n)()
        rows.append(["torch.compile warm-up (1 and 4 tokens)", f"{(time.perf_counter() - start) * 1e3:.0f}", "-"])
        for n in (1, 4):
            ms, share = timed(after_context(compiled, [5] * n), args.repetitions)
            rows.append([f"compiled target forward, {n} token(s)", f"{ms:.2f}", f"{share:.0%}"])
    hw = hardware_description(pair.target.device)
    print(
        f"pair {args.pair}, {args.dtype}, {hw['processor']} ({hw['torch_threads']} threads), context {len(CONTEXT)}, "
        f"median of {args.repetitions} calls; matmul share from the torch profiler over 10 more"
    )
    print(format_table(["call", "ms", "time in matmuls"], rows))


if __name__ == "__main__":
    main()
