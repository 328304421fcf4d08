"""How the cost structure changes the problem: the best static depth, the oracle's headroom over grid search and the
learned policy's edge, per engine, in replay.

Each ``--case LABEL PROFILE ENGINE POLICY`` prices the greedy traces recorded on ``ENGINE`` (``data/traces/``) with
``PROFILE`` (that engine's measured costs) and judges ``POLICY`` (a learned policy trained on that profile and those
traces) on the test split, beside: grid search (the static depth of the highest mean replayed speedup over the train
and val traces), transformers' default rule ``confidence:0.4``, and the oracle (the depth that maximises each round's
throughput, knowing the acceptances). Reported per case: the profile's target step, g(2), g(5), g(8) and c; the
grid's depth; every policy's speedup over plain decoding (Σ tokens / Σ seconds) with a 95 % bootstrap interval over
prompts; the oracle's headroom over grid search, the learned policy and ``confidence:0.4`` against grid search (paired
bootstrap over prompts), and the share of the oracle's gain over grid search that the learned policy captures.
A learned decision is charged ``--decision-seconds`` per round step, as in training.

Run (each policy with the profile it was trained on; benchmarks/results/cost-structures.md):
    .venv/bin/python benchmarks/cost_structures.py \\
        --case eager profiles/smollm2-135m.json eager benchmarks/kept-policies/quickstart \\
        --case compiled-int4 benchmarks/kept-policies/quickstart-kernel-traces/training-profile.json compiled-int4 \\
            benchmarks/kept-policies/quickstart-kernel-traces
"""

from __future__ import annotations

import argparse

from adaptive.learned_policy import load_policy
from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from envs.factory import default_traces
from envs.replay import ReplayBackend
from lab.evaluation import grid_search_splits, play, records_gain, summarise
from policies import StaticDepth, make_policy
from policies.oracle import OraclePolicy

PAIR = "smollm2-135m"


def judge(label: str, profile_path: str, engine: str, policy_path: str, max_depth: int, decision_seconds: float) -> dict:
    """Every number of one case (see the module's docstring)."""
    profile = CostProfile.load(profile_path)
    splits = {split: TraceSet.load(default_traces(split, PAIR, engine=engine)) for split in ("train", "val", "test")}
    ranked, _ = grid_search_splits({s: splits[s] for s in ("train", "val")}, profile, max_depth, decision_seconds)
    test = splits["test"]
    backend = ReplayBackend(test, profile, max_depth)
    learned = load_policy(policy_path, pair=PAIR)
    factories = {
        "grid": lambda: StaticDepth(ranked[0]),
        "confidence:0.4": lambda: make_policy("confidence:0.4"),
        "learned": lambda: learned,
        "oracle": lambda: OraclePolicy(backend),
    }
    records = {name: play(backend, factory, range(len(test)), test.langs, decision_seconds) for name, factory in factories.items()}
    speed = {name: summarise(rows, profile.target_step_seconds) for name, rows in records.items()}
    g = profile.g_curve()
    gain = {name: records_gain(records[name], records["grid"]) for name in ("learned", "confidence:0.4", "oracle")}
    captured = (speed["learned"].speedup - speed["grid"].speedup) / (speed["oracle"].speedup - speed["grid"].speedup)
    return {
        "label": label,
        "step_ms": profile.target_step_seconds * 1e3,
        "g": (g[2], g[5], g[8]),
        "c": profile.c,
        "depth": ranked[0],
        "speed": speed,
        "gain": gain,
        "captured": captured,
        "prompts": len(test),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", nargs=4, action="append", required=True, metavar=("LABEL", "PROFILE", "ENGINE", "POLICY"))
    parser.add_argument("--max-depth", type=int, default=8)
    parser.add_argument("--decision-seconds", type=float, default=5e-5, help="charged per learned decision (the quickstart's)")
    args = parser.parse_args()
    cases = [judge(*case, args.max_depth, args.decision_seconds) for case in args.case]
    print(f"replay, greedy, the {PAIR} pair's test traces of each engine ({', '.join(str(c['prompts']) for c in cases)} prompts), max depth {args.max_depth}")
    print("| cost structure | target step ms | g(2) g(5) g(8) | c | grid depth | grid | confidence:0.4 | learned | oracle |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        cells = [f"{s.speedup:.3f}x [{s.low:.3f}, {s.high:.3f}]" for s in (case["speed"][n] for n in ("grid", "confidence:0.4", "learned", "oracle"))]
        g = " ".join(f"{x:.2f}" for x in case["g"])
        print(f"| {case['label']} | {case['step_ms']:.2f} | {g} | {case['c']:.3f} | {case['depth']} | {' | '.join(cells)} |")
    print("\n| cost structure | oracle / grid | learned / grid | confidence:0.4 / grid | learned's share of the oracle's gain |")
    print("|---|---|---|---|---|")
    for case in cases:
        cells = [f"{x['ratio']:.3f} [{x['low']:.3f}, {x['high']:.3f}]" for x in (case["gain"][n] for n in ("oracle", "learned", "confidence:0.4"))]
        print(f"| {case['label']} | {' | '.join(cells)} | {case['captured']:.1%} |")


if __name__ == "__main__":
    main()
