"""Overhead of a learned policy inside the decoder: time per decision and its share of each cycle.

Decodes val prompts of the default pair with the learned policy (greedy) and reports, from the decoder's
own RoundStats, the policy's time per decision (median) and its share of the total round time (goal < 1%;
Learning to Draft reports 1.39%), next to the same numbers for the static:1 baseline (which costs almost
nothing) as a floor.

Run: .venv/bin/python benchmarks/policy_overhead.py --policy runs/quickstart-DATE [--per-language 1]
"""

from __future__ import annotations

import argparse
import statistics

from adaptive import SpeculativeDecoder, load_pair
from adaptive.workload import LANGUAGES, chat_ids, load_prompts
from policies import make_policy


def measure(pair, spec: str, prompts: list[list[int]], new_tokens: int) -> dict:
    decoder = SpeculativeDecoder(pair.target, pair.draft, make_policy(spec), tokenizer=pair.tokenizer, max_depth=8)
    decoder.generate(prompts[0], 8)  # warm-up
    rounds = [r for ids in prompts for r in decoder.generate(ids, new_tokens).rounds]
    decisions = sum(r.drafted + 1 for r in rounds)  # a continue/stop per draft step, a size decision per round
    policy = sum(r.policy_time for r in rounds)
    total = sum(r.total_time for r in rounds)
    return {
        "rounds": len(rounds),
        "decisions": decisions,
        "per_decision_us": policy / decisions * 1e6,
        "median_round_policy_ms": statistics.median(r.policy_time for r in rounds) * 1e3,
        "share": policy / total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, help="learned policy: run folder or policy.json")
    parser.add_argument("--per-language", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    pair = load_pair("smollm2-135m")
    prompts = [chat_ids(pair.tokenizer, p["prompt"]) for lang in LANGUAGES for p in load_prompts("val", lang=lang)[: args.per_language]]
    print(f"default pair, greedy, {len(prompts)} val prompts x {args.new_tokens} tokens, max depth 8")
    for spec in ("static:1", args.policy):
        m = measure(pair, spec, prompts, args.new_tokens)
        print(
            f"{spec}: {m['rounds']} rounds, {m['decisions']} decisions, {m['per_decision_us']:.1f} us per decision, policy share of round time {m['share']:.3%}"
        )


if __name__ == "__main__":
    main()
