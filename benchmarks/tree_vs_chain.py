"""Tree drafting against chain drafting on the test split, greedy, wall clock, side by side in one run.

Compared on the same prompts (chat format) and the same number of new tokens, all back to back per prompt:
plain target decoding; chain decoding with static depths and with the given policies (e.g. a learned run);
tree decoding for every (k, W) shape × depth × verified nodes V in the grid, and with the given policies
deciding the depth. Reported: tokens/s, speedup over plain, τ (tokens per round), identical to plain.

Run: .venv/bin/python benchmarks/tree_vs_chain.py [--per-language 1] [--new-tokens 64]
     [--policy runs/quickstart-latest] [--shapes 2,2 4,4] [--depths 1,2,3] [--sizes 2,4,8]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from adaptive import SpeculativeDecoder, generate_plain, load_pair
from adaptive.profiling import hardware_description
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.workload import LANGUAGES, chat_ids, load_prompts
from lab.report import format_table
from policies import make_policy


def decoders(pair, args: argparse.Namespace) -> dict:
    """Name -> object with ``generate(ids, new_tokens)``."""
    chosen = {f"chain static:{d}": SpeculativeDecoder(pair.target, pair.draft, make_policy(f"static:{d}"), max_depth=8) for d in args.depths}
    for spec in args.policy:
        chosen[f"chain {spec}"] = SpeculativeDecoder(pair.target, pair.draft, make_policy(spec), max_depth=8)
    for k, w in args.shapes:
        for size in args.sizes:
            for depth in args.depths:
                if size <= k + (depth - 1) * w * k:  # a larger V than the tree's nodes repeats a smaller one
                    policy = make_policy(f"static:{depth}")
                    chosen[f"tree k={k} W={w} V={size} static:{depth}"] = TreeDecoder(pair.target, pair.draft, policy, TreeShape(k, w, size), max_depth=8)
            for spec in args.policy:
                chosen[f"tree k={k} W={w} V={size} {spec}"] = TreeDecoder(pair.target, pair.draft, make_policy(spec), TreeShape(k, w, size), max_depth=8)
    return chosen


def run(args: argparse.Namespace) -> dict:
    pair = load_pair(args.pair)
    configs = decoders(pair, args)
    warm = chat_ids(pair.tokenizer, "Hello")
    for decoder in configs.values():
        decoder.generate(warm, 4)
    rows = []
    for lang in LANGUAGES:
        for prompt in load_prompts("test", lang=lang)[: args.per_language]:
            ids = chat_ids(pair.tokenizer, prompt["prompt"])
            plain = generate_plain(pair.target, ids, args.new_tokens)
            rows.append(
                {
                    "lang": lang,
                    "id": prompt["id"],
                    "config": "plain",
                    "tokens": len(plain.token_ids),
                    "seconds": plain.total_time,
                    "rounds": len(plain.rounds),
                    "identical": True,
                }
            )
            for name, decoder in configs.items():
                result = decoder.generate(ids, args.new_tokens)
                rows.append(
                    {
                        "lang": lang,
                        "id": prompt["id"],
                        "config": name,
                        "tokens": len(result.token_ids),
                        "seconds": result.total_time,
                        "rounds": len(result.rounds),
                        "identical": result.token_ids == plain.token_ids,
                    }
                )
            print(f"done {prompt['id']}", flush=True)
    return {
        "pair": pair.name,
        "hardware": hardware_description(pair.target.device),
        "dtype": str(pair.target.dtype),
        "new_tokens": args.new_tokens,
        "per_language": args.per_language,
        "rows": rows,
    }


def summarise(report: dict) -> str:
    groups: dict[tuple, dict] = defaultdict(lambda: {"tokens": 0, "seconds": 0.0, "rounds": 0, "identical": True})
    for row in report["rows"]:
        for lang in (row["lang"], "all"):
            g = groups[(row["config"], lang)]
            g["tokens"] += row["tokens"]
            g["seconds"] += row["seconds"]
            g["rounds"] += row["rounds"]
            g["identical"] &= row["identical"]
    configs = list(dict.fromkeys(row["config"] for row in report["rows"]))
    plain = {lang: groups[("plain", lang)]["tokens"] / groups[("plain", lang)]["seconds"] for lang in (*LANGUAGES, "all")}
    table = []
    for config in sorted(configs, key=lambda c: -groups[(c, "all")]["tokens"] / groups[(c, "all")]["seconds"]):
        cells = [config]
        for lang in (*LANGUAGES, "all"):
            g = groups[(config, lang)]
            cells.append(f"{g['tokens'] / g['seconds'] / plain[lang]:.2f}x")
        g = groups[(config, "all")]
        cells += [f"{g['tokens'] / g['seconds']:.1f}", f"{g['tokens'] / g['rounds']:.2f}", "yes" if g["identical"] else "NO"]
        table.append(cells)
    return format_table(["config (fastest first)", *LANGUAGES, "all", "tok/s", "tau", "= plain"], table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="smollm2-135m")
    parser.add_argument("--per-language", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--policy", action="append", default=[], help="extra depth policy spec or learned run folder (repeatable)")
    parser.add_argument("--shapes", nargs="+", default=["2,2", "4,4"], help="k,W pairs")
    parser.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8])
    parser.add_argument("--out", default="benchmarks/results/tree_vs_chain")
    args = parser.parse_args()
    args.shapes = [tuple(int(x) for x in shape.split(",")) for shape in args.shapes]
    torch.set_grad_enabled(False)
    report = run(args)
    table = summarise(report)
    header = (
        f"tree vs chain, greedy, {report['pair']} {report['dtype']}, {args.per_language} test prompt(s) per language, "
        f"{args.new_tokens} new tokens, one repetition, all configs back to back per prompt; "
        f"{report['hardware']['processor']}, {report['hardware']['torch_threads']} threads"
    )
    print(header)
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(report, indent=1))
    Path(f"{args.out}.md").write_text(f"{header}\n\n{table}\n")


if __name__ == "__main__":
    main()
