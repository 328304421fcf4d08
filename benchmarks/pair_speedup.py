"""Wall-clock speedup of a pair on the test split, per language, side by side in one run.

Compared, on the same prompts (chat format), the same number of new tokens and the same dtype: plain target
decoding; our decoder with static γ = 1..8, each baseline policy and any learned policy given by path;
transformers `generate(assistant_model=…)` with its heuristic schedule and with its default confidence
threshold (0.4), where the draft is a transformers model (an EAGLE-3 head is not). For every prompt all
configurations run back to back (interleaved), so machine noise spreads over all of them. Reported per
language: tokens/s (total emitted tokens / total time), speedup over plain, mean tokens per round τ (ours),
the per-token acceptance α = accepted / (accepted + rejections) (ours), and whether greedy outputs equal
plain greedy; at bfloat16 every greedy divergence is checked to be a near-tie (:mod:`adaptive.divergence`).

Run: .venv/bin/python benchmarks/pair_speedup.py [--per-language 3] [--temperatures 0,0.7] [--dtype auto]
     [--draft DIR] [--policies static:1,...,runs/NAME/policy.json]
(--draft: a draft folder for the pair's target, e.g. an EAGLE-3 head, instead of the pair's draft.)
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import PreTrainedModel

from adaptive import SamplingConfig, SpeculativeDecoder, generate_plain, load_pair
from adaptive.divergence import first_divergence
from adaptive.models import smollm2_folder
from adaptive.pair import load_pair_from_paths
from adaptive.profiling import hardware_description
from adaptive.workload import LANGUAGES, chat_ids, load_prompts
from lab.report import format_table
from policies import make_policy

POLICIES = [f"static:{g}" for g in range(1, 9)] + ["heuristic", "confidence", "entropy", "costmodel"]
HF_MODES = {
    "transformers heuristic": {"num_assistant_tokens": 5, "num_assistant_tokens_schedule": "heuristic", "assistant_confidence_threshold": 0.0},
    "transformers confidence 0.4": {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.4},
}


def hf_assisted(pair, ids: list[int], new_tokens: int, sampling: SamplingConfig, mode: dict, seed: int) -> tuple[list[int], float]:
    for key, value in mode.items():
        setattr(pair.draft.generation_config, key, value)
    torch.manual_seed(seed)
    kwargs = {"do_sample": False} if sampling.is_greedy else {"do_sample": True, "temperature": sampling.temperature, "top_k": None}
    start = time.perf_counter()
    out = pair.target.generate(
        torch.tensor([ids]), assistant_model=pair.draft, max_new_tokens=new_tokens,
        pad_token_id=pair.tokenizer.eos_token_id, **kwargs,
    )
    return out[0, len(ids) :].tolist(), time.perf_counter() - start


def run(args: argparse.Namespace) -> dict:
    pair = load_pair_from_paths(smollm2_folder(), args.draft, args.dtype) if args.draft else load_pair(args.pair, args.dtype)
    hf_draft = isinstance(pair.draft, PreTrainedModel)
    if args.transformers and not hf_draft:
        print(f"transformers' assisted generation needs a transformers draft; {type(pair.draft).__name__} is not: skipped")
    rows = []
    for temperature in args.temperatures:
        sampling = SamplingConfig(temperature)
        decoders = {spec: SpeculativeDecoder(pair.target, pair.draft, make_policy(spec), sampling, tokenizer=pair.tokenizer) for spec in args.policies}
        for lang in LANGUAGES:
            for prompt in load_prompts(args.split, lang=lang)[: args.per_language]:
                ids = chat_ids(pair.tokenizer, prompt["prompt"])
                plain = generate_plain(pair.target, ids, args.new_tokens, sampling, tokenizer=pair.tokenizer, seed=args.seed)
                base = {"sampling": sampling.describe(), "lang": lang, "id": prompt["id"]}
                rows.append({**base, "config": "plain", "tokens": len(plain.token_ids), "seconds": plain.total_time, "rounds": len(plain.rounds),
                             "identical": True})
                for spec, decoder in decoders.items():
                    result = decoder.generate(ids, args.new_tokens, seed=args.seed)
                    divergence = first_divergence(pair.target, ids, plain.token_ids, result.token_ids) if sampling.is_greedy else None
                    rows.append({**base, "config": spec, "tokens": len(result.token_ids), "seconds": result.total_time, "rounds": len(result.rounds),
                                 "identical": result.token_ids == plain.token_ids, "accepted": sum(r.accepted for r in result.rounds),
                                 "rejections": sum(r.accepted < r.verified for r in result.rounds),
                                 "near_tie": None if divergence is None else divergence.near_tie})
                if args.transformers and hf_draft:
                    for name, mode in HF_MODES.items():
                        tokens, seconds = hf_assisted(pair, ids, args.new_tokens, sampling, mode, args.seed)
                        rows.append({**base, "config": name, "tokens": len(tokens), "seconds": seconds, "rounds": None,
                                     "identical": tokens == plain.token_ids})
                print(f"done {sampling.describe()} {prompt['id']}", flush=True)
    return {"pair": pair.name, "hardware": hardware_description(pair.target.device), "dtype": str(pair.target.dtype), "new_tokens": args.new_tokens,
            "split": args.split, "per_language": args.per_language, "draft": type(pair.draft).__name__, "rows": rows}


def summarise(report: dict) -> str:
    groups: dict[tuple, dict] = defaultdict(lambda: {"tokens": 0, "seconds": 0.0, "rounds": 0, "identical": True, "n": 0, "accepted": 0, "rejections": 0})
    for row in report["rows"]:
        for lang in (row["lang"], "all"):
            g = groups[(row["sampling"], row["config"], lang)]
            g["tokens"] += row["tokens"]
            g["seconds"] += row["seconds"]
            g["rounds"] += row["rounds"] or 0
            g["identical"] &= row["identical"]
            g["accepted"] += row.get("accepted", 0)
            g["rejections"] += row.get("rejections", 0)
            g["n"] += 1
    lines = []
    for sampling in dict.fromkeys(r["sampling"] for r in report["rows"]):
        configs = list(dict.fromkeys(r["config"] for r in report["rows"] if r["sampling"] == sampling))
        header = ["config", *(f"{lang} tok/s (x)" for lang in (*LANGUAGES, "all")), "tau (all)", *(f"alpha {lang}" for lang in LANGUAGES)]
        if sampling == "greedy":
            header.append("= plain")
        table = []
        for config in configs:
            cells = [config]
            for lang in (*LANGUAGES, "all"):
                g, base = groups[(sampling, config, lang)], groups[(sampling, "plain", lang)]
                rate, base_rate = g["tokens"] / g["seconds"], base["tokens"] / base["seconds"]
                cells.append(f"{rate:.1f} ({rate / base_rate:.2f}x)")
            g = groups[(sampling, config, "all")]
            cells.append(f"{g['tokens'] / g['rounds']:.2f}" if g["rounds"] and config != "plain" else "-")
            for lang in LANGUAGES:
                g_lang = groups[(sampling, config, lang)]
                seen = g_lang["accepted"] + g_lang["rejections"]
                cells.append(f"{g_lang['accepted'] / seen:.2f}" if seen else "-")
            if sampling == "greedy":
                cells.append("yes" if g["identical"] else "NO")
            table.append(cells)
        lines.append(f"**{sampling}**, {report['per_language']} test prompts per language, {report['new_tokens']} new tokens, "
                     "speedup over plain in parentheses\n")
        lines.append(format_table(header, table))
        lines.append("")
    diverged = [r for r in report["rows"] if r.get("near_tie") is not None]
    if diverged:
        greedy_runs = [r for r in report["rows"] if r["sampling"] == "greedy" and "near_tie" in r]
        lines.append(f"Greedy outputs diverging from plain greedy: {len(diverged)} of {len(greedy_runs)} runs; at a near-tie: "
                     f"{sum(r['near_tie'] for r in diverged)} (adaptive.divergence: the target's gap between the two tokens within 4 ulps "
                     "under both a 1-token and a k-token forward).\n")
    hw = report["hardware"]
    lines.append(f"Hardware: {hw['processor']}, {hw['torch_threads']} torch threads, torch {hw['torch']}; pair {report['pair']}, "
                 f"draft {report.get('draft', '')}, {report['dtype']}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="smollm2-135m")
    parser.add_argument("--split", default="test")
    parser.add_argument("--dtype", default="auto", help="auto (default: bfloat16 where the CPU multiplies it natively), float32 or bfloat16")
    parser.add_argument("--draft", help="a draft folder for the pair's target (e.g. an EAGLE-3 head) instead of the pair's draft")
    parser.add_argument("--per-language", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.7])
    parser.add_argument("--policies", type=lambda s: s.split(","), default=POLICIES)
    parser.add_argument("--no-transformers", dest="transformers", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pair_speedup"))
    args = parser.parse_args()
    report = run(args)
    table = summarise(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    args.out.with_suffix(".md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
