"""Per-language acceptance of static draft depths, replayed on greedy chain traces (no model runs, seconds).

For each static depth γ, every prompt's recorded output is replayed as the chain decoder would decode it greedily:
a round at position t accepts min(m(t), γ) draft tokens (fewer where the output ends) and emits one more; it counts
a rejection when it accepted fewer than γ and the output goes on. Reported per language and for all: the per-token
acceptance α = accepted / (accepted + rejections) — the pair benchmark's α, there measured live — and τ, tokens per
round. ``--per-language N`` keeps the first N prompts per language with the eight task types taking turns (the pair
benchmark's ``--task every`` prompts), to set the live numbers beside the whole split's.

Run: .venv/bin/python benchmarks/trace_acceptance.py [--traces data/traces/smollm2-135m-test.npz] [--depths 1,2,3,4,6,8]
     [--per-language N]
"""

from __future__ import annotations

import argparse

from adaptive.traces import TraceSet
from adaptive.workload import LANGUAGES, TASKS, interleave_tasks, load_prompts
from lab.report import format_table


def replay_static(traces: TraceSet, prompt: int, depth: int) -> tuple[int, int, int, int]:
    """(accepted, rejections, rounds, tokens) of static ``depth`` on one prompt's recorded output."""
    accepted = rejections = rounds = 0
    position, end = int(traces.offsets[prompt]), int(traces.offsets[prompt + 1])
    start = position
    while position < end:
        run = min(int(traces.match[position]), depth, end - position - 1)
        accepted += run
        rejections += run < depth and position + run + 1 < end
        rounds += 1
        position += run + 1
    return accepted, rejections, rounds, end - start


def benchmark_prompts(split: str, per_language: int) -> set[str]:
    """The ids of the pair benchmark's prompts: the first ``per_language`` per language, task types taking turns."""
    return {p["id"] for lang in LANGUAGES for p in interleave_tasks(load_prompts(split, lang=lang), TASKS)[:per_language]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default="data/traces/smollm2-135m-test.npz", help="a greedy chain trace file")
    parser.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 4, 6, 8])
    parser.add_argument("--per-language", type=int, help="only the pair benchmark's first N prompts per language (task types taking turns)")
    args = parser.parse_args()
    traces = TraceSet.load(args.traces)
    if traces.sampled:
        parser.error(f"{args.traces} holds sampled traces; this replay counts greedy acceptances only")
    if max(args.depths) > traces.depth or min(args.depths) < 1:
        parser.error(f"--depths must lie in 1..{traces.depth} (the traces' K), got {args.depths}")
    chosen = range(len(traces))
    if args.per_language:
        wanted = benchmark_prompts(traces.metadata.get("split", "test"), args.per_language)
        chosen = [i for i, pid in enumerate(traces.prompt_ids) if pid in wanted]
    groups = [*LANGUAGES, "all"]
    rows = []
    for depth in args.depths:
        sums = {group: [0, 0, 0, 0] for group in groups}
        for prompt in chosen:
            counts = replay_static(traces, prompt, depth)
            for group in (traces.langs[prompt], "all"):
                sums[group] = [a + b for a, b in zip(sums[group], counts)]
        alpha = [f"{s[0] / (s[0] + s[1]):.3f}" if s[0] + s[1] else "-" for s in sums.values()]
        tau = [f"{s[3] / s[2]:.2f}" if s[2] else "-" for s in sums.values()]
        rows.append([f"static:{depth}", *alpha, *tau])
    print(f"{args.traces}: {len(chosen)} prompts, greedy replay of static depths (exact acceptances), K = {traces.depth}")
    print(format_table(["depth", *(f"alpha {g}" for g in groups), *(f"tau {g}" for g in groups)], rows))


if __name__ == "__main__":
    main()
