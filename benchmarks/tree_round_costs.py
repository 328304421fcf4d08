"""Where a draft tree's round spends its time, beside a chain's: live, same prompts, same engine.

Decodes val prompts of the default pair with a chain (``static:D``) and with draft trees of each ``--shapes`` entry
(grown ``D`` levels), in rotating order per prompt and repeat, and splits every round's wall time four ways from the
decoder's own clocks (:class:`adaptive.policy.RoundStats`): the draft's forwards, drafting's own work outside them
(tree growth and selection, features, sampling), the target's verifying forward, and verification's own work
(the tree mask, acceptance, cache compaction, emitting). Printed per configuration: milliseconds per round for each
part, rounds, tokens per round and tokens per second; what a tree costs beyond the chain is where the rows part.

Run: .venv/bin/python benchmarks/tree_round_costs.py [--engine compiled-int4] [--depth 3] [--shapes 4,4,4;2,2,4]
     [--per-language 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from adaptive import SpeculativeDecoder, load_pair
from adaptive.engines import ENGINES, use_engine
from adaptive.policy import RoundStats
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.workload import LANGUAGES, chat_ids, load_prompts
from lab.background import live_measurement
from lab.live_protocol import rotation
from lab.report import format_table
from policies.baselines import StaticDepth

PARTS = ("draft forwards", "drafting work", "target forward", "verifying work")


def parts(rounds: list[RoundStats]) -> dict[str, float]:
    """Seconds of ``rounds`` in each of :data:`PARTS` (:meth:`RoundStats.time_parts`)."""
    return dict(zip(PARTS, map(sum, zip(*(r.time_parts() for r in rounds)))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="compiled-int4", choices=list(ENGINES))
    parser.add_argument("--depth", type=int, default=3, help="drafted tokens per chain round, tree levels per tree round")
    parser.add_argument("--shapes", default="4,4,4;2,2,4", help="tree shapes K,W,V separated by ';'")
    parser.add_argument("--per-language", type=int, default=2, help="val prompts per language")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    pair = load_pair("smollm2-135m", "auto")
    use_engine((pair.target, pair.draft), args.engine)
    decoders = {f"chain static:{args.depth}": SpeculativeDecoder(pair.target, pair.draft, StaticDepth(args.depth), tokenizer=pair.tokenizer)}
    for shape in args.shapes.split(";"):
        tree = TreeDecoder(pair.target, pair.draft, StaticDepth(args.depth), TreeShape.parse(shape), tokenizer=pair.tokenizer)
        decoders[f"tree {shape} static:{args.depth}"] = tree
    prompts = [chat_ids(pair.tokenizer, p["prompt"]) for lang in LANGUAGES for p in load_prompts("val", lang=lang)[: args.per_language]]
    for decoder in decoders.values():  # warm every path (compiles, caches) before any timing
        decoder.generate(prompts[0], 16)
    rounds: dict[str, list[RoundStats]] = defaultdict(list)
    wall: dict[str, float] = defaultdict(float)
    tokens: dict[str, int] = defaultdict(int)
    with live_measurement():
        for turn in range(len(prompts) * args.repeats):
            ids = prompts[turn % len(prompts)]
            for name in rotation(list(decoders), turn):
                start = time.perf_counter()
                result = decoders[name].generate(ids, args.new_tokens)
                wall[name] += time.perf_counter() - start
                rounds[name] += result.rounds
                tokens[name] += len(result.token_ids)
    rows = []
    for name in decoders:
        split, count = parts(rounds[name]), len(rounds[name])
        rows.append([name, *(f"{split[p] / count * 1e3:.2f}" for p in PARTS), count, f"{tokens[name] / count:.2f}", f"{tokens[name] / wall[name]:.1f}"])
    print(
        f"default pair on {args.engine}, greedy, {len(prompts)} val prompts x {args.repeats} repeats x {args.new_tokens} tokens, "
        "rotating order; ms per round from the decoders' clocks, tokens/s from wall time"
    )
    print(format_table(["configuration", *(f"{p} ms" for p in PARTS), "rounds", "tokens/round", "tokens/s"], rows))


if __name__ == "__main__":
    main()
