"""Two runs of the same evaluation (e.g. the README's main job twice in a row on one machine): do they agree?

Compared from their ``evaluation.json`` files: grid search's choice; every replay speedup (all prompts) and
its relative difference, against a tolerance (default 5 %); each live speedup over plain of one run
against the other run's 95 % interval, both ways; plain decoding's live tokens per second; and the
calibration error of each. Exits 1 when the choices differ, a replay number moves by more than the
tolerance, or a live speedup falls outside the other run's interval.

Run: .venv/bin/python benchmarks/compare_evaluations.py EVAL_DIR_A EVAL_DIR_B [--tolerance 0.05]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.report import format_table


def load(folder: Path) -> dict:
    return json.loads((folder / "evaluation.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.05, help="largest relative difference of a replay number (default 0.05)")
    args = parser.parse_args()
    a, b = load(args.first), load(args.second)
    agree = True

    choices = (a["fitted"]["grid_best"], b["fitted"]["grid_best"])
    print(f"grid search: static:{choices[0]} vs static:{choices[1]} -> {'same' if choices[0] == choices[1] else 'DIFFERENT'}")
    agree &= choices[0] == choices[1]

    rows = []
    for name in a["replay"]:
        twin = _same_policy(name, b["replay"])
        if twin is None:
            continue
        x, y = a["replay"][name]["all"]["speedup"], b["replay"][twin]["all"]["speedup"]
        moved = abs(y / x - 1)
        agree &= moved <= args.tolerance
        rows.append([name, f"{x:.3f}x", f"{y:.3f}x", f"{moved:.1%}", "ok" if moved <= args.tolerance else "MOVED"])
    print(f"\nreplay, all test prompts (tolerance {args.tolerance:.0%}; profiles: {a['profile']} / {b['profile']})")
    print(format_table(["policy", "first", "second", "difference", "verdict"], rows))

    if a["live"] and b["live"]:
        rows = []
        for name in a["live"]:
            twin = _same_policy(name, b["live"])
            if twin is None:
                continue
            x, y = a["live"][name]["all"], b["live"][twin]["all"]
            inside = x["low"] <= y["speedup"] <= x["high"] and y["low"] <= x["speedup"] <= y["high"]
            agree &= inside or name == "plain"
            rows.append(
                [
                    name,
                    f"{x['speedup']:.2f}x [{x['low']:.2f}, {x['high']:.2f}]",
                    f"{y['speedup']:.2f}x [{y['low']:.2f}, {y['high']:.2f}]",
                    f"{x['tokens_per_second']:.1f} / {y['tokens_per_second']:.1f}",
                    "-" if name == "plain" else ("ok" if inside else "OUTSIDE"),
                ]
            )
        print("\nlive speedup over plain decoding [95 % paired bootstrap]: each inside the other run's interval?")
        print(format_table(["policy", "first", "second", "tok/s first / second", "verdict"], rows))
    for label, result in (("first", a), ("second", b)):
        calibration = result.get("calibration")
        if calibration:
            errors = ", ".join(f"{name} {row['error']:+.1%}" for name, row in calibration["rows"].items())
            print(f"calibration ({label}): {errors}")
    print("\nthe two runs agree" if agree else "\nthe two runs DISAGREE")
    return 0 if agree else 1


def _same_policy(name: str, other: dict) -> str | None:
    """The other run's entry for the same policy (grid search and the fitted statics may name another depth)."""
    if name in other:
        return name
    prefix = name.split(" (")[0]
    return next((n for n in other if n.split(" (")[0] == prefix), None)


if __name__ == "__main__":
    sys.exit(main())
