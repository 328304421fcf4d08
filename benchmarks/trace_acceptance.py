"""Per-language acceptance of static draft depths, replayed on greedy chain traces (no model runs, seconds).

For each static depth γ, every prompt's recorded output is replayed as the chain decoder would decode it greedily:
a round at position t accepts min(m(t), γ) draft tokens (fewer where the output ends) and emits one more; it counts
a rejection when it accepted fewer than γ and the output goes on. Reported per language and for all: the per-token
acceptance α = accepted / (accepted + rejections) — the pair benchmark's α, there measured live — and τ, tokens per
round. ``--per-language N`` keeps the first N prompts per language with the eight task types taking turns (the pair
benchmark's ``--task every`` prompts), to set the live numbers beside the whole split's; ``--by-task`` adds α per
task type and language at each depth.

Run: .venv/bin/python benchmarks/trace_acceptance.py [--traces data/traces/smollm2-135m-test.npz] [--depths 1,2,3,4,6,8]
     [--per-language N] [--by-task]
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


def alpha(counts: list[int]) -> str:
    accepted, rejections = counts[0], counts[1]
    return f"{accepted / (accepted + rejections):.3f}" if accepted + rejections else "-"


def add(total: list[int], counts: tuple[int, ...]) -> list[int]:
    return [a + b for a, b in zip(total, counts)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default="data/traces/smollm2-135m-test.npz", help="a greedy chain trace file")
    parser.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3, 4, 6, 8])
    parser.add_argument("--per-language", type=int, help="only the pair benchmark's first N prompts per language (task types taking turns)")
    parser.add_argument("--by-task", action="store_true", help="also alpha per task type and language at each depth")
    args = parser.parse_args()
    traces = TraceSet.load(args.traces)
    if traces.sampled:
        parser.error(f"{args.traces} holds sampled traces; this replay counts greedy acceptances only")
    if max(args.depths) > traces.depth or min(args.depths) < 1:
        parser.error(f"--depths must lie in 1..{traces.depth} (the traces' K), got {args.depths}")
    split = traces.metadata.get("split", "test")
    chosen = range(len(traces))
    if args.per_language:
        wanted = benchmark_prompts(split, args.per_language)
        chosen = [i for i, pid in enumerate(traces.prompt_ids) if pid in wanted]
    tasks = {p["id"]: p["task"] for p in load_prompts(split)}
    groups = [*LANGUAGES, "all"]
    rows, by_task = [], []
    for depth in args.depths:
        sums = {group: [0, 0, 0, 0] for group in groups}
        per_task = {(task, lang): [0, 0, 0, 0] for task in TASKS for lang in LANGUAGES}
        for prompt in chosen:
            counts = replay_static(traces, prompt, depth)
            for group in (traces.langs[prompt], "all"):
                sums[group] = add(sums[group], counts)
            key = (tasks[traces.prompt_ids[prompt]], traces.langs[prompt])
            per_task[key] = add(per_task[key], counts)
        tau = [f"{s[3] / s[2]:.2f}" if s[2] else "-" for s in sums.values()]
        rows.append([f"static:{depth}", *(alpha(s) for s in sums.values()), *tau])
        by_task += [[f"static:{depth}", task, *(alpha(per_task[task, lang]) for lang in LANGUAGES)] for task in TASKS]
    print(f"{args.traces}: {len(chosen)} prompts, greedy replay of static depths (exact acceptances), K = {traces.depth}")
    print(format_table(["depth", *(f"alpha {g}" for g in groups), *(f"tau {g}" for g in groups)], rows))
    if args.by_task:
        print(format_table(["depth", "task", *(f"alpha {lang}" for lang in LANGUAGES)], by_task))


if __name__ == "__main__":
    main()
