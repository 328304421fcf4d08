"""Pool the runs of several load tests and set every policy against one of them.

Reads the ``result.json`` of load tests run with the same requests and settings (e.g. a first run and more repeats
at some loads), pools each policy's runs per load (``lab.loadtest.summary`` over all their requests and wall time:
goodput and throughput, ITL p95 over all inter-token gaps) and prints, per load, each policy's goodput, ITL p95 and
per-request speed over the reference policy with a 95 % paired bootstrap interval over requests, and its goodput
and ITL p95 over the reference's run by run (each repeat beside the reference's run of the same repeat, which
ran next to it: the geometric mean of those ratios with a 95 % bootstrap interval over the pairs of runs), and how
many of its requests decoded the very same tokens as the reference's (at bf16 a near-tie flips with the batch's shapes,
and the two then decode partly different text).
Loads that only some files measured are pooled over those files.

Run: .venv/bin/python benchmarks/pool_loadtests.py benchmarks/results/loadtests/learned/result.json \\
    benchmarks/results/loadtests/learned-c4c8/result.json --versus "schedule:1-1=4,2-3=3,4-7=3,8-16=2"
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from lab.evaluation import paired_ratio
from lab.loadtest import read_result, summary

SAME = ("max_new_tokens", "max_depth", "slo_tpot_ms", "seed")
"""Settings the pooled files must share."""


def pool(results: list[dict]) -> dict[str, dict[str, dict[int, list[dict]]]]:
    """Per load label, per policy, per file (its index): that file's runs."""
    first = results[0]["settings"]
    for result in results[1:]:
        differing = [key for key in SAME if result["settings"].get(key) != first.get(key)]
        if differing:
            key = differing[0]
            raise ValueError(f"load tests with other settings cannot be pooled: {key} is {result['settings'].get(key)!r} in one, {first.get(key)!r} in another")
    pooled: dict[str, dict[str, dict[int, list[dict]]]] = {}
    for index, result in enumerate(results):
        for label, load in result["loads"].items():
            for name, runs in load["runs"].items():
                pooled.setdefault(label, {}).setdefault(name, {})[index] = runs
    return pooled


def run_ratios(mine: list[dict], base: list[dict], slo_tpot_ms: float, resamples: int = 2000, seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """Goodput and ITL p95 of each run of ``mine`` over those of the run of ``base`` at the same position (the
    same repeat): per metric (geometric mean, low, high), the interval a 95 % bootstrap over the pairs."""
    pairs = [(summary(a["rows"], a["wall"], slo_tpot_ms), summary(b["rows"], b["wall"], slo_tpot_ms)) for a, b in zip(mine, base)]
    ratios = {
        "goodput": np.array([a["goodput"] / b["goodput"] if b["goodput"] > 0 else np.nan for a, b in pairs]),
        "itl_p95": np.array([a["itl_ms"]["p95"] / b["itl_ms"]["p95"] for a, b in pairs]),
    }
    picks = np.random.default_rng(seed).integers(0, len(pairs), size=(resamples, len(pairs)))
    out = {}
    for metric, ratio in ratios.items():
        if not np.all(ratio > 0):  # a run whose goodput is 0 (every request over the TPOT target): no ratio of runs
            out[metric] = (float("nan"), float("nan"), float("nan"))
            continue
        values = np.log(ratio)
        low, high = np.exp(np.percentile(values[picks].mean(axis=1), [2.5, 97.5]))
        out[metric] = (float(np.exp(values.mean())), float(low), float(high))
    return out


def same_outputs(mine: list[dict], base: list[dict]) -> tuple[int, tuple[int, int]]:
    """Of requests paired in order, how many decoded the very same tokens, and the tokens each side decoded: at bf16
    a near-tie can flip with the batch's shapes, and two policies then decode different text (of other acceptance)."""
    same = sum(a["output_digest"] == b["output_digest"] for a, b in zip(mine, base))
    return same, (sum(r["tokens"] for r in mine), sum(r["tokens"] for r in base))


def compare(pooled: dict[str, dict[str, dict[int, list[dict]]]], versus: str, slo_tpot_ms: float) -> list[str]:
    """Per load, a line per policy: runs, throughput, goodput (tok/s of requests whose TPOT is within
    ``slo_tpot_ms``), ITL p95, and the per-request speed over ``versus`` [95 %], paired within each file's runs."""
    lines = []
    for label, policies in pooled.items():
        if versus not in policies:
            raise ValueError(f"{label} has no policy {versus!r}; its policies: {', '.join(policies)}")
        lines.append(f"## {label}")
        for name, by_file in policies.items():
            runs = [run for file_runs in by_file.values() for run in file_runs]
            pooled_summary = summary([row for run in runs for row in run["rows"]], sum(run["wall"] for run in runs), slo_tpot_ms)
            line = (
                f"{name}: {len(runs)} runs, {pooled_summary['throughput']:.1f} tok/s, goodput {pooled_summary['goodput']:.1f} tok/s,"
                f" ITL p95 {pooled_summary['itl_ms']['p95']:.1f} ms"
            )
            shared = [index for index in by_file if index in policies[versus]]
            if name != versus and shared:
                mine = [row for index in shared for run in by_file[index] for row in run["rows"]]
                base = [row for index in shared for run in policies[versus][index] for row in run["rows"]]
                ratio, low, high = paired_ratio([(r["tokens"], r["seconds"]) for r in mine], [(r["tokens"], r["seconds"]) for r in base])
                line += f"; per request / {versus} {ratio:.3f} [{low:.3f}, {high:.3f}]"
                ours = [run for index in shared for run in by_file[index]]
                theirs = [run for index in shared for run in policies[versus][index]]
                ratios = run_ratios(ours, theirs, slo_tpot_ms)
                line += "; run by run ({} pairs) goodput {:.3f} [{:.3f}, {:.3f}], ITL p95 {:.3f} [{:.3f}, {:.3f}]".format(
                    min(len(ours), len(theirs)), *ratios["goodput"], *ratios["itl_p95"]
                )
                same, tokens = same_outputs(mine, base)
                line += f"; outputs as {versus}'s: {same}/{min(len(mine), len(base))} requests (tokens {tokens[0]} against {tokens[1]})"
            lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="result.json files of `adaptive loadtest` runs")
    parser.add_argument("--versus", required=True, help="the policy (as named in the results) every other one is set against")
    args = parser.parse_args()
    results = [read_result(path) for path in args.results]
    print("\n".join(compare(pool(results), args.versus, results[0]["settings"]["slo_tpot_ms"])))


if __name__ == "__main__":
    main()
