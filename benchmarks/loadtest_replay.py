"""A load test's requests replayed: what batched replay predicts for the very prompts a live load test sent.

``adaptive loadtest`` sends the first ``--requests`` prompts of the test split, the languages taking turns (16 by
default: four per language), to closed-loop clients. Policies are trained and judged in replay on random requests of
a whole split; this replays exactly the load test's stream instead (their recorded greedy traces, in the same
order, at each concurrency until the last request finishes; :class:`envs.batch_replay.BatchReplayEnv` with a fixed
stream) and prints, per load and policy, the replayed throughput over plain batched decoding's, the inter-token gap
p95 and both over ``--versus``'s. Given live load tests of the same policies (``--live``, their ``result.json``),
it sets their run-by-run goodput and ITL p95 over ``--versus`` (``benchmarks/pool_loadtests.py``) beside: where
replay and live disagree on the same prompts, the cost model (or the host) is off; where they agree, a live
result is about those prompts, not about the model of cost.

Run: .venv/bin/python benchmarks/loadtest_replay.py --batch-profile PROFILE.json --policy benchmarks/kept-policies/batch-step \\
    --policy "schedule:1-1=4,2-3=3,4-7=3,8-16=2" --versus "schedule:1-1=4,2-3=3,4-7=3,8-16=2" --live RESULT.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pool_loadtests import pool, run_ratios

from adaptive.batch_profile import BatchCostProfile
from adaptive.traces import TraceSet
from envs.batch_replay import BatchReplayEnv
from lab.batch_training import DEFAULT_DECISION_MS, replay_load
from lab.loadtest import mixed_prompt_rows, read_result
from policies.batch import make_batch_policy

TEST_TRACES = Path("data/traces/smollm2-135m-test.npz")


def stream(traces: TraceSet, requests: int, split: str) -> list[int]:
    """Trace indices of a load test's ``requests`` prompts of ``split``, in the order it sends them."""
    rows = mixed_prompt_rows(requests, split)
    missing = [row["id"] for row in rows if row["id"] not in traces.prompt_ids]
    if missing:
        raise ValueError(f"the traces lack {len(missing)} of the load test's prompts (e.g. {missing[0]}); record the {split} split")
    return [traces.prompt_ids.index(row["id"]) for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-profile", required=True, type=Path, help="a batched cost profile (adaptive profile --batches)")
    parser.add_argument("--traces", type=Path, default=TEST_TRACES, help=f"greedy chain traces holding the load test's prompts (default {TEST_TRACES})")
    parser.add_argument("--policy", action="append", required=True, help="a batch policy spec or a learned batch policy's folder (repeat)")
    parser.add_argument("--versus", required=True, help="the policy every other one is set against (one of --policy)")
    parser.add_argument("--concurrency", default="1,2,4,8", help="closed-loop clients, comma-separated (default 1,2,4,8)")
    parser.add_argument("--requests", type=int, default=16, help="requests per load, as the load test's --requests (default 16)")
    parser.add_argument("--split", default="test", help="the load test's --split (default test)")
    parser.add_argument("--max-depth", type=int, default=8, help="deepest draft (default 8, as the load test's)")
    parser.add_argument(
        "--decision-ms",
        type=float,
        default=DEFAULT_DECISION_MS,
        help=f"ms charged per decision of a learned policy (default {DEFAULT_DECISION_MS:g}, as train-batch; rules are charged nothing)",
    )
    parser.add_argument("--live", type=Path, action="append", default=[], help="result.json of live load tests of these policies (repeat: pooled)")
    args = parser.parse_args()
    if args.versus not in args.policy:
        raise ValueError(f"--versus {args.versus!r} must be one of the --policy specs: {', '.join(args.policy)}")
    profile = BatchCostProfile.load(args.batch_profile)
    traces = TraceSet.load(args.traces)
    loads = tuple(int(c) for c in args.concurrency.split(","))
    env = BatchReplayEnv(traces, profile, loads, 0.0, min(args.max_depth, traces.depth, profile.max_depth), decision_ms=args.decision_ms)
    indices = stream(traces, args.requests, args.split)
    policies = {spec: make_batch_policy(spec, profile) for spec in args.policy}
    results = [read_result(path) for path in args.live]
    live = pool(results) if results else {}
    print(
        f"replayed: {args.requests} {args.split} requests as the load test sends them ({args.traces}), costs of {args.batch_profile},"
        f" {args.decision_ms:g} ms per learned decision"
    )
    print(f"against {args.versus}" + (f"; live: {', '.join(map(str, args.live))}, run by run [95 %]" if results else ""))
    header = "| load | policy | replayed × plain | ITL p95 ms | replayed / versus | ITL p95 / versus |"
    if results:
        header += " live goodput / versus | live ITL p95 / versus |"
    print(header)
    print("|" + "---|" * header.count(" | ") + ("---|" if header.endswith("|") else ""))
    for load in loads:
        replays = {spec: replay_load(env, policy, load, 0, seed=0, requests=indices) for spec, policy in policies.items()}
        base = replays[args.versus]
        runs = live.get(f"concurrency {load}", {})
        for spec, replay in replays.items():
            line = (
                f"| {load} | {spec} | {replay.rate:.3f} | {replay.itl_p95_ms:.1f} | {replay.rate / base.rate:.3f} | {replay.itl_p95_ms / base.itl_p95_ms:.3f} |"
            )
            if results:
                if spec != args.versus and spec in runs and args.versus in runs:
                    mine = [run for file_runs in runs[spec].values() for run in file_runs]
                    theirs = [run for file_runs in runs[args.versus].values() for run in file_runs]
                    ratios = run_ratios(mine, theirs, results[0]["settings"]["slo_tpot_ms"])
                    line += " {:.3f} [{:.3f}, {:.3f}] | {:.3f} [{:.3f}, {:.3f}] |".format(*ratios["goodput"], *ratios["itl_p95"])
                else:
                    line += " – | – |"
            print(line)


if __name__ == "__main__":
    main()
