"""The batched decoder's target forward on the compiled-int4 engine: compiled against uncompiled, interleaved.

For each repetition, in an order shuffled per repetition, each engine (``lean-int4``: the lean forward uncompiled;
``compiled-int4``: every forward after the rows' prefill on one compiled graph) prefills B rows of the same prompt
(test split, chat-formatted), then times forwards of n tokens per row (n = 1: plain decoding's round; n = 5: the
verification of 4 drafted tokens plus the bonus), each rolled back after it, for every B in ``--rows``. Reported per
(B, n): the median ms per forward of each engine and the ratio uncompiled / compiled, the median of per-repetition
ratios with a 95 % bootstrap interval over repetitions; and the largest difference between the two engines'
logits, relative to the largest logit (bf16 rounding of two attention implementations).

Run: .venv/bin/python benchmarks/batched_forward.py [--repetitions 5] [--rows 1 2 4 8] [--trials 5]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import numpy as np
import torch

from adaptive.batched_model import BatchedCachedModel
from adaptive.engines import use_engine
from adaptive.pair import load_pair
from adaptive.workload import chat_ids, load_prompts

ENGINES = ("lean-int4", "compiled-int4")
TOKENS = (1, 5)


def forward_ms(model: BatchedCachedModel, n: int, trials: int) -> tuple[float, torch.Tensor]:
    """Median ms of a forward of ``n`` tokens in every row (rolled back after each), and the last one's logits."""
    times, logits = [], None
    lengths = list(model.lengths)
    for _ in range(trials):
        start = time.perf_counter()
        logits = model.forward([[7] * n for _ in lengths])
        times.append(1000 * (time.perf_counter() - start))
        for row, length in enumerate(lengths):
            model.rollback(row, length)
    return statistics.median(times), torch.stack([row.float() for row in logits])


def interval(ratios: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    """Median and 95 % bootstrap interval of the median."""
    values = np.array(ratios)
    boots = [np.median(rng.choice(values, len(values))) for _ in range(2000)]
    return float(np.median(values)), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--trials", type=int, default=5, help="timed forwards per (engine, B, n) in a repetition (median)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair("smollm2-135m", dtype="auto", engine="compiled-int4")
    prompt = chat_ids(pair.tokenizer, load_prompts(split="test")[0]["prompt"])
    models = {}
    for engine in ENGINES:  # one target, two engines: the attached engine is swapped per model
        use_engine([pair.target], engine)
        models[engine] = {rows: BatchedCachedModel(pair.target) for rows in args.rows}
    rng, order = random.Random(args.seed), list(ENGINES)
    times = {(engine, rows, n): [] for engine in ENGINES for rows in args.rows for n in TOKENS}
    worst = 0.0
    for repetition in range(args.repetitions):
        rng.shuffle(order)
        for rows in args.rows:
            logits = {}
            for engine in order:
                model = models[engine][rows]
                model.remove_rows(range(model.rows))
                model.add_rows([prompt] * rows)
                for n in TOKENS:
                    ms, logits[engine, n] = forward_ms(model, n, args.trials)
                    times[engine, rows, n].append(ms)
            for n in TOKENS:
                reference = logits["lean-int4", n]
                worst = max(worst, float((logits["compiled-int4", n] - reference).abs().max() / reference.abs().max()))
        print(f"repetition {repetition + 1}/{args.repetitions} done (order {order})", flush=True)
    boot = np.random.default_rng(args.seed)
    print(f"\nmachine: {platform.processor() or platform.machine()}, {args.threads} threads; target SmolLM2-135M-Instruct, int4 weights (bf16 activations)")
    print(f"prompt: {len(prompt)} tokens (first test prompt); {args.repetitions} repetitions x {args.trials} forwards, engines in shuffled order")
    print("| B | n | lean-int4 ms | compiled-int4 ms | uncompiled / compiled [95 % CI] |")
    print("|---|---|---|---|---|")
    for rows in args.rows:
        for n in TOKENS:
            eager, compiled = times["lean-int4", rows, n], times["compiled-int4", rows, n]
            median, low, high = interval([e / c for e, c in zip(eager, compiled)], boot)
            print(f"| {rows} | {n} | {statistics.median(eager):.2f} | {statistics.median(compiled):.2f} | {median:.3f} [{low:.3f}, {high:.3f}] |")
    print(f"largest logit difference between the engines, relative to the largest logit: {worst:.4f}")


if __name__ == "__main__":
    main()
