"""Write a what-if cost profile derived from a measured one (see adaptive.profile.CostProfile.scaled).

    .venv/bin/python scripts/what_if_profile.py --source profiles/smollm2-135m.json \
        --verify-slope 0.1 --out profiles/what-if-flat-verify.json

Use it to ask how policies fare on a machine whose verification cost grows more slowly with the tokens
verified (e.g. more parallel compute), then ``adaptive retarget RUN --profile FILE``.
"""

from __future__ import annotations

import argparse

from adaptive.profile import CostProfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, help="a measured profile (adaptive profile)")
    parser.add_argument("--verify-slope", type=float, default=0.1, help="factor on the cost of each extra verified token")
    parser.add_argument("--draft-scale", type=float, default=1.0, help="factor on the draft step time")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    profile = CostProfile.load(args.source).scaled(args.verify_slope, args.draft_scale)
    profile.save(args.out)
    g = ", ".join(f"g({gamma})={value:.3f}" for gamma, value in list(profile.g_curve().items())[1:5])
    print(f"{args.out}: c = {profile.c:.4f}, {g}; {profile.hardware['what_if']}")


if __name__ == "__main__":
    main()
