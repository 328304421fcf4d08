"""What asking a stepped batch policy costs per round, beyond the time its own decisions report.

Decodes a full batch of test prompts (default pair, greedy) at one fixed depth with three policies that all draft
exactly that depth every round, so that only the asking differs:

* ``static:D``: asked once per round (nothing per step);
* ``asked``: a stepped policy asked before every draft step, answering "go on" at once — the decoder computes
  each step's top-1 draft probabilities for it (the per-step protocol alone);
* ``asked, learned``: as ``asked``, but each answer is first computed by a learned stepped batch policy (and
  then ignored) — the protocol and the decisions, without their effect on the depth.

Policies take turns in rotating order, ``--repeats`` times. Per policy it prints the median wall time of a round
(measured around ``step()``, every round after the first while the whole batch decodes), the decoder's own draft,
verify and policy times, and the rest (wall minus those); then each policy's round wall over static's, the median
of per-repeat ratios with a bootstrap 95 % interval over repeats.

Run: .venv/bin/python benchmarks/batch_round_costs.py --policy benchmarks/kept-policies/batch-step --batch 4 --depth 3
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import numpy as np

from adaptive import load_pair
from adaptive.batch_decoder import BatchedSpeculativeDecoder
from adaptive.policy import BatchDraftStep, BatchPolicy, BatchState
from lab import live_protocol
from lab.loadtest import mixed_prompts
from policies.batch import FixedBatchDepth, make_batch_policy


class AskedEachStep:
    """``depth`` tokens every round, as a stepped policy: asked before each draft step, it asks ``inner`` (when
    given) and then goes on whatever the answer."""

    def __init__(self, depth: int, inner: BatchPolicy | None = None) -> None:
        self.fixed, self.inner = depth, inner
        self.name = "asked" if inner is None else "asked, learned"

    def depth(self, state: BatchState) -> int:
        if self.inner is not None:
            self.inner.depth(state)
        return min(self.fixed, state.max_depth)

    def should_continue(self, state: BatchState, step: BatchDraftStep) -> bool:
        if self.inner is not None:
            self.inner.should_continue(state, step)
        return True


def measure(pair, policy: BatchPolicy, prompts: list[list[int]], batch: int, new_tokens: int) -> dict[str, list[float]]:
    """Per round after the first (which admits every prompt) while the whole batch decodes: wall, draft,
    verify and policy seconds."""
    decoder = BatchedSpeculativeDecoder(pair.target, pair.draft, policy, tokenizer=pair.tokenizer, max_depth=8, max_batch=batch)
    for ids in prompts:
        decoder.submit(ids, new_tokens)
    times: dict[str, list[float]] = defaultdict(list)
    decoder.step()
    while not decoder.idle:
        start = decoder.clock()
        round_ = decoder.step()
        wall = decoder.clock() - start
        if round_ is None or len(round_.requests) < batch:
            continue
        for name, seconds in (("wall", wall), ("draft", round_.draft_time), ("verify", round_.verify_time), ("policy", round_.policy_time)):
            times[name].append(seconds)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, help="a learned stepped batch policy (its folder)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    pair = load_pair("smollm2-135m", args.dtype)
    prompts = [ids for _, ids in mixed_prompts(pair, args.batch)]
    learned = make_batch_policy(args.policy)
    policies = {
        f"static:{args.depth}": lambda: FixedBatchDepth(args.depth),
        "asked": lambda: AskedEachStep(args.depth),
        "asked, learned": lambda: AskedEachStep(args.depth, learned),
    }
    print(
        f"default pair ({pair.target.dtype}), greedy, batch {args.batch} of test prompts x {args.new_tokens} tokens, depth {args.depth} every round; "
        f"{args.repeats} repeats, policies in rotating order"
    )
    walls: dict[str, list[list[float]]] = defaultdict(list)
    phases: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    measure(pair, FixedBatchDepth(args.depth), prompts, args.batch, 8)  # warm-up
    for repeat in range(args.repeats):
        for name in live_protocol.rotation(list(policies), repeat):
            times = measure(pair, policies[name](), prompts, args.batch, args.new_tokens)
            walls[name].append(times["wall"])
            for phase, seconds in times.items():
                phases[name][phase] += seconds
    for name, times in phases.items():
        median = {phase: statistics.median(seconds) * 1e3 for phase, seconds in times.items()}
        rest = statistics.median(w - d - v - p for w, d, v, p in zip(times["wall"], times["draft"], times["verify"], times["policy"])) * 1e3
        print(
            f"{name}: {len(times['wall'])} rounds, median ms: wall {median['wall']:.2f}, draft {median['draft']:.2f}, verify {median['verify']:.2f}, "
            f"policy {median['policy']:.3f}, rest {rest:.3f}"
        )
    base = f"static:{args.depth}"
    rng = np.random.default_rng(0)
    for name in list(policies)[1:]:
        ratios = np.array([statistics.median(mine) / statistics.median(theirs) for mine, theirs in zip(walls[name], walls[base])])
        boot = [np.median(rng.choice(ratios, len(ratios))) for _ in range(2000)]
        low, high = np.percentile(boot, [2.5, 97.5])
        print(f"{name} / {base}: round wall {np.median(ratios):.3f} [{low:.3f}, {high:.3f}] (median of {len(ratios)} per-repeat ratios of medians)")


if __name__ == "__main__":
    main()
