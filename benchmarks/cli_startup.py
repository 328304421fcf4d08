"""How long ``adaptive --help`` and ``adaptive --version`` take (wall clock, a fresh process each), against a command
that loads its module (``adaptive costmodel``): the listing must not import torch.

    .venv/bin/python benchmarks/cli_startup.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {"--help": ["--help"], "--version": ["--version"], "costmodel (imports its module)": ["costmodel", "--alpha", "0.7", "--c", "0.1"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):  # interleaved, so drift hits every case alike
        for name, argv in CASES.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "lab.cli", *argv], capture_output=True, check=True)
            times[name].append(time.perf_counter() - start)
    print(f"adaptive command start-up, {args.repeats} fresh processes each, interleaved, median [min, max] seconds:")
    for name, values in times.items():
        print(f"  {name:32s} {statistics.median(values):6.3f} [{min(values):.3f}, {max(values):.3f}]")


if __name__ == "__main__":
    main()
