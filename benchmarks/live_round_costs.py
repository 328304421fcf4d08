"""Live round costs from a load test set beside a batched cost profile's.

For each batch size and depth a load test's policies played, the median live round time (``round_ms`` in its
``result.json``: policy, draft and verification, admissions apart; rounds of every policy pooled, weighted by
rounds), the profile's round time there, their ratio, and — what a policy deciding whether to draft one token more
weighs — the cost of the round one token deeper over this one's, live and in the profile.

Run: .venv/bin/python benchmarks/live_round_costs.py RESULT.json PROFILE.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from adaptive.batch_profile import BatchCostProfile


def live_round_ms(result: dict) -> dict[tuple[int, int], tuple[float, int]]:
    """Per (batch size, depth): the round-weighted mean of the policies' median round times, and the rounds."""
    sums: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0])
    for load in result["loads"].values():
        for entry in load["summary"].values():
            for batch, per_depth in entry.get("round_ms", {}).items():
                for depth, ms in per_depth.items():
                    rounds = entry["depths"][batch][depth]
                    sums[int(batch), int(depth)][0] += ms * rounds
                    sums[int(batch), int(depth)][1] += rounds
    return {key: (total / rounds, rounds) for key, (total, rounds) in sorted(sums.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", help="a load test's result.json (one that kept round times)")
    parser.add_argument("profile", help="a batched cost profile (adaptive profile --batches)")
    parser.add_argument("--min-rounds", type=int, default=20, help="leave out (batch, depth) cells with fewer rounds (default 20)")
    args = parser.parse_args()
    live = {key: value for key, value in live_round_ms(json.load(open(args.result))).items() if value[1] >= args.min_rounds}
    if not live:
        raise SystemExit(f"{args.result} holds no round times with at least {args.min_rounds} rounds per batch size and depth")
    profile = BatchCostProfile.load(args.profile)
    print(f"live rounds of {args.result} against {args.profile} (measured {profile.document.get('measured_at', '?')})")
    print("| batch | depth | rounds | live ms | profile ms | live / profile | one deeper, live | one deeper, profile |")
    print("|---|---|---|---|---|---|---|---|")
    for (batch, depth), (ms, rounds) in live.items():
        modelled = profile.round_ms(batch, depth)
        deeper = live.get((batch, depth + 1))
        step_live = f"{deeper[0] / ms:.3f}" if deeper else "-"
        step_profile = f"{profile.round_ms(batch, depth + 1) / modelled:.3f}" if depth + 1 <= profile.max_depth else "-"
        print(f"| {batch} | {depth} | {rounds} | {ms:.1f} | {modelled:.1f} | {ms / modelled:.3f} | {step_live} | {step_profile} |")


if __name__ == "__main__":
    main()
