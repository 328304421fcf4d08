"""Greedy speculative output vs plain greedy output on every prompt of a split, per language, chain and tree.

For each prompt (chat format): plain greedy decoding of the target, then speculative decoding with a static
depth as a chain and, with --tree, as a draft tree of each shape given; same number of new tokens. Prints per
decoder and language how many outputs are token-identical, the measured per-token acceptance and tokens per
round; where an output diverges (bf16 only, by design), whether the first divergence is a near-tie
(:mod:`adaptive.divergence`); writes JSON.

Run: .venv/bin/python benchmarks/greedy_identity.py [--split test] [--new-tokens 64] [--policy static:4]
     [--tree K,W,V ...] [--head DIR] [--dtype float32|bfloat16|auto] [--per-language N]
(--head: an EAGLE-3 head folder drafts instead of the pair's draft.)
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from adaptive import SpeculativeDecoder, generate_plain, load_pair
from adaptive.divergence import first_divergence
from adaptive.eagle3 import load_head
from adaptive.generation import Decoder
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.workload import LANGUAGES, chat_ids, first_per_language, load_prompts
from lab.cli.common import tree_shape
from lab.report import format_table
from policies import make_policy

TOTALLED = ("identical", "accepted", "rejections", "tokens", "rounds", "plain_seconds", "speculative_seconds")


def _decoders(pair, draft, policy: str, shapes: list[TreeShape]) -> dict[str, Decoder]:
    """The chain decoder and one tree decoder per shape, each with its own instance of the policy."""
    decoders: dict[str, Decoder] = {"chain": SpeculativeDecoder(pair.target, draft, make_policy(policy), tokenizer=pair.tokenizer)}
    for shape in shapes:
        name = f"tree {shape.branching},{shape.width},{shape.size}"
        decoders[name] = TreeDecoder(pair.target, draft, make_policy(policy), shape, tokenizer=pair.tokenizer)
    return decoders


def _row(pair, prompt: dict, ids: list[int], plain, decoder_name: str, result) -> dict:
    divergence = first_divergence(pair.target, ids, plain.token_ids, result.token_ids)
    return {
        "decoder": decoder_name,
        "divergence": None if divergence is None else {**asdict(divergence), "near_tie": divergence.near_tie},
        "id": prompt["id"],
        "lang": prompt["lang"],
        "identical": result.token_ids == plain.token_ids,
        "accepted": sum(r.accepted for r in result.rounds),
        "verified": sum(r.verified for r in result.rounds),
        "rejections": sum(r.rejected for r in result.rounds),
        "tokens": len(result.token_ids),
        "rounds": len(result.rounds),
        "plain_seconds": plain.total_time,
        "speculative_seconds": result.total_time,
    }


def _table(rows: list[dict], decoders: list[str]) -> list[list]:
    totals: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        for lang in (row["lang"], "all"):
            t = totals[row["decoder"], lang]
            for field in TOTALLED:
                t[field] += row[field]
            t["prompts"] += 1
    return [
        [
            name,
            lang,
            int(t["prompts"]),
            f"{int(t['identical'])}/{int(t['prompts'])}",
            f"{t['accepted'] / max(t['accepted'] + t['rejections'], 1):.3f}",
            f"{t['tokens'] / t['rounds']:.2f}",
            f"{t['plain_seconds'] / t['speculative_seconds']:.2f}x",
        ]
        for name in decoders
        for lang, t in ((lang, totals[name, lang]) for lang in (*LANGUAGES, "all"))
        if t["prompts"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="smollm2-135m")
    parser.add_argument("--split", default="test")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--policy", default="static:4", help="the depth policy of every decoder")
    parser.add_argument("--tree", type=tree_shape, action="append", default=[], help="also a draft tree of this shape (k,W,V; repeatable)")
    parser.add_argument("--head", help="an EAGLE-3 head folder to draft with instead of the pair's draft")
    parser.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or auto")
    parser.add_argument("--per-language", type=int, help="only the first N prompts of each language")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/greedy_identity.json"))
    args = parser.parse_args()
    pair = load_pair(args.pair, args.dtype)
    draft = load_head(args.head, pair.target) if args.head else pair.draft
    decoders = _decoders(pair, draft, args.policy, args.tree)
    prompts = load_prompts(args.split)
    if args.per_language:
        prompts = [prompts[k] for k in first_per_language([p["lang"] for p in prompts], args.per_language)]
    rows = []
    for prompt in tqdm(prompts, desc="prompts"):
        ids = chat_ids(pair.tokenizer, prompt["prompt"])
        plain = generate_plain(pair.target, ids, args.new_tokens)
        rows.extend(_row(pair, prompt, ids, plain, name, decoder.generate(ids, args.new_tokens)) for name, decoder in decoders.items())
    drafted_by = f"EAGLE-3 head {args.head}" if args.head else f"the pair's draft ({type(draft).__name__})"
    print(f"pair {args.pair} ({args.dtype}), draft: {drafted_by}, {args.split} split, greedy, {args.new_tokens} new tokens, policy {args.policy}")
    print("alpha = accepted / (accepted + rejections): the per-token acceptance estimate under a geometric model")
    print("(a tree round counts as a rejection when its accepted path stops short of the tree's depth)")
    print(format_table(["decoder", "lang", "prompts", "identical to plain", "alpha", "tokens/round", "speedup"], _table(rows, list(decoders))))
    diverged = [row for row in rows if row["divergence"]]
    if diverged:
        ties = sum(row["divergence"]["near_tie"] for row in diverged)
        print(
            f"\n{len(diverged)} of {len(rows)} outputs diverge from plain greedy; {ties} of them at a near-tie "
            f"(|target logit gap| <= {diverged[0]['divergence']['tolerance']:.3f} under both a 1-token and a k-token forward)"
        )
        for row in diverged:
            d = row["divergence"]
            print(
                f"  {row['decoder']} {row['id']}: token {d['position']}, gap {d['gap_one_token']:+.4f} (1-token) / {d['gap_k_token']:+.4f} (k-token)"
                f"{'' if d['near_tie'] else '  NOT A NEAR-TIE'}"
            )
    else:
        print(f"\nevery output of every decoder is token-identical to plain greedy ({len(rows)} outputs)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    arguments = {k: [f"{s.branching},{s.width},{s.size}" for s in v] if k == "tree" else str(v) for k, v in vars(args).items()}
    args.out.write_text(json.dumps({"args": arguments, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
