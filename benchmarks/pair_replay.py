"""Replay beside live for a pair benchmark's report: does the replay environment tell the same story?

Reads the rows ``benchmarks/pair_speedup.py`` wrote (its ``.json`` report, greedy part), replays every policy of
it on the same test prompts from the recorded greedy chain traces under a cost profile, and prints per policy and
language group: τ (tokens per round) and milliseconds per round, live and in replay, and their ratio; then the
first learned policy (a configuration naming a folder) against every other policy, paired over prompts [95 %],
live and in replay. A policy that leads in replay and not live shows here whether acceptance (τ) or round
cost makes the difference.

Replay charges a rule's decisions nothing (as :func:`envs.env.replay_decision_seconds` does everywhere) and every
other policy's ``--decision-us`` each (what a learned policy's decision and the draft features it reads cost live).

Run: .venv/bin/python benchmarks/pair_replay.py benchmarks/results/pair_learned.json [--profile FILE] [--groups it+en,zh+es]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from adaptive.workload import LANGUAGES
from envs.env import DEFAULT_DECISION_SECONDS
from envs.replay import ReplayBackend
from lab.evaluation import paired_ratio, play
from lab.live_protocol import PLAIN
from policies import make_policy


def rate(rows: list[dict]) -> tuple[float, float, float]:
    """(tokens, seconds, rounds) summed over ``rows`` (live rows or replay records as dicts)."""
    return sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows), sum(r["rounds"] for r in rows)


def compare(
    report: dict,
    traces: TraceSet,
    profile: CostProfile,
    langs: tuple[str, ...],
    max_depth: int,
    decision_seconds: float = DEFAULT_DECISION_SECONDS,
) -> list[str]:
    """The lines of one language group's comparison; replay charges ``decision_seconds`` per decision of every
    policy that is not a rule (rules: nothing)."""
    index = {prompt_id: i for i, prompt_id in enumerate(traces.prompt_ids)}
    keep = [i for i, row in enumerate(report[PLAIN]) if row["lang"] in langs]
    missing = [report[PLAIN][i]["id"] for i in keep if report[PLAIN][i]["id"] not in index]
    if missing:
        raise ValueError(f"{len(missing)} prompts of the report have no trace, e.g. {missing[0]}: give the traces they were recorded in")
    tokens, seconds, _ = rate([report[PLAIN][i] for i in keep])
    lines = [
        f"== {'+'.join(langs)}: {len(keep)} prompts; plain live {seconds / tokens * 1e3:.1f} ms/token, profile target step {profile.target_step_ms:.1f} ms"
    ]
    live, replay = {}, {}
    for name, rows in report.items():
        if name == PLAIN:
            continue
        records = play(
            ReplayBackend(traces, profile, max_depth),
            lambda spec=name: make_policy(spec),
            [index[report[PLAIN][i]["id"]] for i in keep],
            traces.langs,
            decision_seconds,
        )
        live[name] = [rows[i] for i in keep]
        replay[name] = [{"tokens": r.tokens, "seconds": r.seconds, "rounds": r.rounds} for r in records]
        (lt, ls, lr), (rt, rs, rr) = rate(live[name]), rate(replay[name])
        lines.append(
            f"{name}: tau live {lt / lr:.2f} replay {rt / rr:.2f} | ms/round live {ls / lr * 1e3:.1f} replay {rs / rr * 1e3:.1f}"
            f" (live/replay {ls / lr / (rs / rr):.3f}) | speedup live {(lt / ls) / (tokens / seconds):.3f}x"
            f" replay {(rt / rs) * profile.target_step_seconds:.3f}x"
        )
    learned = next((name for name in live if "/" in name), None)
    for name in live if learned else ():
        if name == learned:
            continue
        pairs = {
            side: paired_ratio([(r["tokens"], r["seconds"]) for r in rows[learned]], [(r["tokens"], r["seconds"]) for r in rows[name]])
            for side, rows in (("live", live), ("replay", replay))
        }
        lines.append(f"  {learned} / {name}: " + "; ".join(f"{side} {r:.3f} [{lo:.3f}, {hi:.3f}]" for side, (r, lo, hi) in pairs.items()))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="a pair benchmark's JSON report (benchmarks/pair_speedup.py --out OUT writes OUT.json)")
    parser.add_argument("--profile", default="profiles/smollm2-135m.json", help="cost profile the replay times rounds with")
    parser.add_argument("--traces", default="data/traces/smollm2-135m-test.npz", help="greedy chain traces holding the report's prompts")
    parser.add_argument("--groups", default="all", help="language groups, e.g. it+en,zh+es (default: all four together)")
    parser.add_argument("--max-depth", type=int, default=8)
    default_us = DEFAULT_DECISION_SECONDS * 1e6
    parser.add_argument(
        "--decision-us", type=float, default=default_us, help=f"replay's charge per decision of a policy that is not a rule (default {default_us:g})"
    )
    args = parser.parse_args()
    document = json.loads(args.report.read_text())
    if "greedy" not in document.get("runs", {}):
        raise SystemExit(f"{args.report} holds no greedy rows (runs: {sorted(document.get('runs', {}))}): replay is exact for greedy traces only")
    groups = [tuple(LANGUAGES) if group == "all" else tuple(group.split("+")) for group in args.groups.split(",")]
    for group in groups:
        unknown = [lang for lang in group if lang not in LANGUAGES]
        if unknown:
            raise SystemExit(f"unknown language {unknown[0]!r} in --groups; languages: {', '.join(LANGUAGES)}")
    if args.decision_us < 0:
        raise SystemExit(f"--decision-us must be >= 0, got {args.decision_us}")
    traces, profile = TraceSet.load(args.traces), CostProfile.load(args.profile)
    print(f"{args.report}: greedy rows replayed from {args.traces} under {args.profile} (measured {profile.document.get('measured_at', '?')})")
    for group in groups:
        lines = compare(document["runs"]["greedy"], traces, profile, group, args.max_depth, args.decision_us / 1e6)
        print("\n".join(lines))


if __name__ == "__main__":
    main()
