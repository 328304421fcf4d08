"""Decoder overhead per round outside model forwards, and our loop vs transformers' assisted generation.

Both on the same tiny random Llama pair (fp32, CPU, greedy), static depth γ, same prompts, interleaved
repetitions; medians reported with the ratio. Run: .venv/bin/python benchmarks/decoder_overhead.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import perturbed_copy, tiny_llama  # noqa: E402

from adaptive import SpeculativeDecoder  # noqa: E402
from policies import StaticDepth  # noqa: E402


def hf_assisted(target, draft, prompt: list[int], new_tokens: int, gamma: int) -> tuple[list[int], float]:
    """transformers generate(assistant_model=...) with a constant γ and no confidence stop."""
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    ids = torch.tensor([prompt])
    start = time.perf_counter()
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    return out[0, len(prompt) :].tolist(), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = tiny_llama(0, vocab=256, layers=2, hidden=64, dtype=torch.float32)
    draft = perturbed_copy(target, 0.3, seed=1)
    prompts = [[1, 2, 3, 4], [9, 8, 7], [100, 50, 25, 12, 6]]
    decoder = SpeculativeDecoder(target, draft, StaticDepth(args.gamma))
    ours, theirs, overhead_per_round = [], [], []
    same = True
    for _ in range(args.repetitions):
        for prompt in prompts:
            result = decoder.generate(prompt, args.new_tokens)
            ours.append(result.total_time)
            overhead_per_round.extend(r.overhead_time for r in result.rounds)
            tokens, seconds = hf_assisted(target, draft, prompt, args.new_tokens, args.gamma)
            theirs.append(seconds)
            same &= tokens == result.token_ids
    print(f"tiny pair: Llama 2 layers, d=64, vocab 256, fp32, CPU 1 thread, greedy, static gamma={args.gamma}")
    print(f"{len(prompts)} prompts x {args.repetitions} repetitions x {args.new_tokens} new tokens, interleaved")
    median_ms = statistics.median(overhead_per_round) * 1e3
    print(f"decoder overhead outside forwards: median {median_ms:.3f} ms/round over {len(overhead_per_round)} rounds (goal <= 0.3 ms)")
    print(f"ours:         median {statistics.median(ours) * 1e3:.1f} ms per generation")
    print(f"transformers: median {statistics.median(theirs) * 1e3:.1f} ms per generation (assistant_model, constant schedule)")
    print(f"ratio transformers / ours: {statistics.median(theirs) / statistics.median(ours):.2f}x  (same tokens: {same})")


if __name__ == "__main__":
    main()
