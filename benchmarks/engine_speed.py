"""Plain decoding speed and verification cost of each engine on the real target (``--engine``: eager, lean,
lean-int8, lean-int4), interleaved and repeated on this machine.

For each repetition and each engine, in an order shuffled per repetition: a prompt is prefilled, then ``--tokens``
single-token greedy steps are timed (plain decoding's step), then one forward of n = 1..8 tokens at that context
(the verification of n − 1 drafted tokens plus the bonus), rolled back after each. Reported: tokens/s per engine
(median over repetitions), each lean engine's step-time ratio to eager with a 95 % bootstrap interval over
repetitions, g(n) = forward(n) / forward(1) per engine, and how far each engine's greedy tokens follow eager's.

With ``--llama-bench PATH`` (built by ``scripts/setup_llamacpp.sh``) llama.cpp joins as one more engine on the
shipped Q4_1 file: in each repetition, in the same shuffled order, ``llama-bench`` times the same number of
generated tokens after a context of the prompt's length (``-d``) and forwards of n = 1..8 tokens at that depth
(``-p n -n 0``); its greedy tokens are not compared.

Run: .venv/bin/python benchmarks/engine_speed.py [--repetitions 5] [--tokens 64] [--threads 2] [--llama-bench PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import time

import numpy as np
import torch

from adaptive.cached_model import CachedModel
from adaptive.engines import ENGINES
from adaptive.lean import LeanCache, LeanLlama, compile_step
from adaptive.models import smollm2_gguf_path
from adaptive.pair import load_pair
from adaptive.workload import chat_ids, load_prompts


def session(target, engine: str):
    """A cached session of ``target`` through ``engine`` (a compiled one compiled before any timing)."""
    if ENGINES[engine] is None:
        return CachedModel(target)
    lean = LeanLlama(target, *ENGINES[engine])
    if lean.compiled:
        compile_step(target, lean)
    return LeanCache(target, lean)


def decode(model, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    """Seconds per greedy step over ``tokens`` steps after ``prompt``, and the tokens."""
    model.reset()
    logits = model.forward(prompt)[-1]
    out = [int(logits.argmax())]
    start = time.perf_counter()
    for _ in range(tokens):
        out.append(int(model.forward(out[-1:])[-1].argmax()))
    return (time.perf_counter() - start) / tokens, out


def forward_costs(model, sizes: range, trials: int = 3) -> dict[int, float]:
    """Least seconds of one forward of n tokens after the current context, per n (rolled back each time)."""
    length, costs = model.length, {}
    for n in sizes:
        times = []
        for _ in range(trials):
            start = time.perf_counter()
            model.forward(list(range(300, 300 + n)))
            times.append(time.perf_counter() - start)
            model.rollback(length)
        costs[n] = min(times)
    return costs


LLAMA_CPP = "llama.cpp Q4_1"


def llama_bench(binary: str, threads: int, depth: int, tokens: int) -> tuple[float, dict[int, float]]:
    """llama.cpp on the shipped Q4_1 file at context ``depth``: seconds per generated token, and seconds of one
    forward of n = 1..8 tokens."""
    command = [binary, "-m", str(smollm2_gguf_path()), "-t", str(threads), "-d", str(depth), "-r", "3", "-o", "json"]
    rows = json.loads(subprocess.run([*command, "-p", "0", "-n", str(tokens)], capture_output=True, text=True, check=True).stdout)
    step = 1 / rows[0]["avg_ts"]
    rows = json.loads(subprocess.run([*command, "-p", ",".join(map(str, range(1, 9))), "-n", "0"], capture_output=True, text=True, check=True).stdout)
    return step, {row["n_prompt"]: row["n_prompt"] / row["avg_ts"] for row in rows}


def bootstrap_ratio(a: list[float], b: list[float], seed: int = 0, draws: int = 2000) -> tuple[float, float, float]:
    """median(a) / median(b) with a 95 % interval, repetitions resampled in pairs."""
    rng, a_, b_ = np.random.default_rng(seed), np.array(a), np.array(b)
    picks = rng.integers(0, len(a_), (draws, len(a_)))
    ratios = np.median(a_[picks], axis=1) / np.median(b_[picks], axis=1)
    return float(np.median(a_) / np.median(b_)), float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--llama-bench", help="llama.cpp's llama-bench binary: llama.cpp on the Q4_1 file joins as one more engine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engines = args.engines.split(",") + ([LLAMA_CPP] if args.llama_bench else [])
    pair = load_pair("smollm2-135m", args.dtype)
    sessions = {engine: session(pair.target, engine) for engine in engines if engine != LLAMA_CPP}
    prompts = [chat_ids(pair.tokenizer, load_prompts("test", lang=lang)[0]["prompt"]) for lang in ("en", "it", "zh", "es")]
    step: dict[str, list[float]] = {e: [] for e in engines}
    costs: dict[str, list[dict[int, float]]] = {e: [] for e in engines}
    outputs: dict[str, list[list[int]]] = {e: [] for e in engines}
    order = random.Random(0)
    for engine in sessions:  # warm-up
        decode(sessions[engine], prompts[0], 4)
    for repetition in range(args.repetitions):
        prompt = prompts[repetition % len(prompts)]
        for engine in order.sample(engines, len(engines)):
            if engine == LLAMA_CPP:
                seconds, forwards = llama_bench(args.llama_bench, args.threads, len(prompt), args.tokens)
                step[engine].append(seconds)
                costs[engine].append(forwards)
                continue
            seconds, tokens = decode(sessions[engine], prompt, args.tokens)
            step[engine].append(seconds)
            outputs[engine].append(tokens)
            costs[engine].append(forward_costs(sessions[engine], range(1, 9)))
    print(f"SmolLM2-135M-Instruct ({args.dtype}), {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"{args.repetitions} repetitions x {args.tokens} greedy steps, first test prompt per language in turn, engines in shuffled order\n")
    print("| engine | ms/step (median) | tokens/s | step time vs eager [95 %] | g(2..8) | greedy tokens equal to eager's |")
    print("|---|---|---|---|---|---|")
    for engine in engines:
        ms = statistics.median(step[engine]) * 1e3
        ratio = bootstrap_ratio(step[engine], step["eager"]) if "eager" in step and engine != "eager" else None
        shown = f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]" if ratio else "1"
        g = [statistics.median(c[n] / c[1] for c in costs[engine]) for n in range(2, 9)]
        pairs = list(zip(outputs[engine], outputs.get("eager", outputs[engine])))
        same = statistics.mean(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) / len(a) for a, b in pairs) if pairs else None
        agreement = f"{same:.0%} of the way to the first difference" if same is not None else "not compared"
        print(f"| {engine} | {ms:.2f} | {1e3 / ms:.1f} | {shown} | {', '.join(f'{x:.2f}' for x in g)} | {agreement} |")
    print("\n| engine | forward of n = 1..8 tokens, ms (median) |\n|---|---|")
    for engine in engines:
        print(f"| {engine} | {', '.join(f'{statistics.median(c[n] for c in costs[engine]) * 1e3:.1f}' for n in range(1, 9))} |")
    if args.llama_bench:
        print()
        for engine in (e for e in engines if "int4" in e):
            ratio, low, high = bootstrap_ratio(step[LLAMA_CPP], step[engine])
            print(f"{engine} plain decoding speed / llama.cpp Q4_1's: {ratio:.3f} [{low:.3f}, {high:.3f}] (step-time ratio llama.cpp / {engine})")


if __name__ == "__main__":
    main()
