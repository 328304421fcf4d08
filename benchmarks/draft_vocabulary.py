"""How large the draft vocabulary should be: coverage of the tokens the target writes, per language, against
the cost of the draft's output layer.

A token outside the draft vocabulary can never be drafted. For each size, the vocabulary is chosen as draft
training chooses it (:func:`lab.draft_training.draft_vocabulary`: special tokens, then the most frequent
response tokens of the response shards), and measured on text it was not chosen from: the target's greedy
outputs of the test split (the traces, all 368 prompts) and its greedy answers to the held-out
general-chat requests (``data/workload/chat-test-prompts.jsonl``, made here: bf16, 128 new tokens). The cost is
the draft's output layer for one token (hidden size of the target, ``[size, hidden]`` weights), timed for bf16
weights and for the int8 copy the low-bit engines use, medians of ``--repetitions`` interleaved runs. The run
marks itself as a live measurement, so background data work waits meanwhile.

Run: .venv/bin/python benchmarks/draft_vocabulary.py [--shards data/distill/smollm2-135m] [--sizes 8192,16384,24576]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from adaptive.lean import LeanLlama, Product
from adaptive.pair import load_target
from adaptive.traces import TraceSet
from adaptive.workload import LANGUAGES, chat_ids
from lab.background import live_measurement
from lab.batched_sampling import continue_many
from lab.distill_data import CHAT_TEST, SHARDS
from lab.draft_training import draft_vocabulary, read_shards
from lab.recording import TRACES
from lab.report import format_table


def split_outputs() -> dict[str, list[list[int]]]:
    """Per language, the target's greedy outputs of the test split's 368 prompts, copy-heavy ones included (the traces)."""
    traces = TraceSet.load(TRACES / "smollm2-135m-test.npz")
    out: dict[str, list[list[int]]] = defaultdict(list)
    for i, lang in enumerate(traces.langs):
        out[lang].append(traces.outputs[traces.offsets[i] : traces.offsets[i + 1]].tolist())
    return out


def chat_answers(target, tokenizer, new_tokens: int = 128) -> dict[str, list[list[int]]]:
    """Per language, the target's greedy answers to the held-out chat requests."""
    rows = [json.loads(line) for line in CHAT_TEST.read_text().splitlines()]
    prompts = [chat_ids(tokenizer, row["prompt"]) for row in rows]
    out: dict[str, list[list[int]]] = defaultdict(list)
    for i, answer, _ in continue_many(LeanLlama(target, "model"), prompts, max_new_tokens=new_tokens, eos=tokenizer.eos_token_id):
        out[rows[i]["lang"]].append(answer)
    return out


def output_layer_ms(sizes: list[int], hidden: int, repetitions: int, calls: int = 200) -> dict[int, dict[str, float]]:
    """Median ms of one token through a ``[size, hidden]`` output layer, bf16 and int8 weights, interleaved."""
    layers = {(size, kind): Product(torch.randn(size, hidden) * 0.02, kind, torch.bfloat16) for size in sizes for kind in ("model", "int8")}
    x = torch.randn(1, hidden, dtype=torch.bfloat16)
    times: dict[tuple[int, str], list[float]] = defaultdict(list)
    order = list(layers)
    with torch.inference_mode():
        for layer in layers.values():
            layer(x)
        for _ in range(repetitions):
            random.shuffle(order)
            for key in order:
                start = time.perf_counter()
                for _ in range(calls):
                    layers[key](x)
                times[key].append((time.perf_counter() - start) / calls * 1000)
    return {size: {"bf16": statistics.median(times[(size, "model")]), "int8": statistics.median(times[(size, "int8")])} for size in sizes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=Path, default=SHARDS, help="response shards the vocabulary is chosen from")
    parser.add_argument("--sizes", default="4096,8192,12288,16384,20480,24576")
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/draft_vocabulary.json"))
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    target, tokenizer = load_target("smollm2-135m", "bfloat16")
    sequences = read_shards(args.shards)
    with live_measurement():
        sets = {"test": split_outputs(), "chat": chat_answers(target, tokenizer)}
        costs = output_layer_ms(sizes, target.config.hidden_size, args.repetitions)
    coverage: dict[int, dict[str, dict[str, float]]] = {}
    for size in sizes:
        vocab = set(draft_vocabulary(sequences, size, list(tokenizer.all_special_ids)).tolist())
        coverage[size] = {
            name: {lang: sum(t in vocab for o in outputs[lang] for t in o) / max(1, sum(len(o) for o in outputs[lang])) for lang in LANGUAGES}
            for name, outputs in sets.items()
        }
    print(f"Draft vocabulary chosen from {len(sequences):,} responses in {args.shards} (most frequent response tokens)")
    print(f"coverage = share of the target's greedy output tokens inside the vocabulary; output layer: 1 token, hidden {target.config.hidden_size},")
    print(f"medians of {args.repetitions} interleaved repetitions of 200 calls, {torch.get_num_threads()} threads\n")
    headers = ["size", "bf16 ms", "int8 ms", *(f"{name} {lang}" for name in sets for lang in LANGUAGES)]
    rows = [
        [f"{size:,}", f"{costs[size]['bf16']:.3f}", f"{costs[size]['int8']:.3f}", *(f"{coverage[size][name][lang]:.3f}" for name in sets for lang in LANGUAGES)]
        for size in sizes
    ]
    print(format_table(headers, rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {"shards": str(args.shards), "responses": len(sequences), "sizes": sizes, "output_layer_ms": costs, "coverage": coverage}
    args.out.write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
