"""Live round costs by depth: a policy's rounds against the rounds of static depths that draft as deep.

Decodes val prompts of the default pair live with the policy and with ``static:d`` for each d it names, in rotating
order per prompt and repeat, and prints per configuration the wall time per round and per token, drafted tokens
and τ per round; then for each depth d, the policy's rounds of depth d beside ``static:d``'s: medians of draft,
verify and policy time from the decoder's RoundStats, median context, mean tokens accepted. Replay charges a
round of depth d the same whoever drafts it; this shows what a policy's rounds cost live beyond that (its
decisions, its per-step draft features, the draft catching up on a longer accepted run). ``--cycle 2,8`` adds a
rule drafting those depths in turn (does mixing depths cost anything?), ``--with-features`` a copy of each static
depth that reads the draft's features at every step, as a learned policy does (what do they cost?).

With ``--profile PATH|auto`` (``auto``: measured first, on this machine and engine, as ``adaptive train`` does) it
also prices every live round as replay does (the profile's draft run at the round's context and depth, its
verification of the round's size) and splits what live costs beyond that into four parts: the draft's forwards
against the profile's draft steps, the drafting round's own work outside them (features, sampling, the policy's
state), the target's verifying forward against the profile's, and the verification's own work (acceptance,
rollback, emitting). That is where replay's modelled time parts from live. With ``--tree K,W,V`` every configuration
decodes draft trees of that shape (depths are levels), the profile is measured with the tree mask, and rounds are
priced as tree replay prices them (a later level's W-node forward, the tree decoder's own work).

Run: .venv/bin/python benchmarks/round_costs.py --policy benchmarks/kept-policies/quickstart --depths 3,8 [--per-language 2] [--repeats 2]
     .venv/bin/python benchmarks/round_costs.py --policy static:5 --depths 2,5,8 --cycle 2,8 --with-features
     .venv/bin/python benchmarks/round_costs.py --engine compiled-int4 --policy confidence --depths 1,3,5 --profile auto
     .venv/bin/python benchmarks/round_costs.py --engine compiled-int4 --policy static:2 --depths 4,6 --tree 4,4,4 --profile auto
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Callable

from adaptive import SpeculativeDecoder, load_pair
from adaptive.engines import ENGINES
from adaptive.policy import BasePolicy, DraftPolicy, DraftState, RoundStats
from adaptive.precision import CHOICES as DTYPE_CHOICES
from adaptive.precision import DEFAULT_DTYPE
from adaptive.profile import CostProfile
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.workload import LANGUAGES, chat_ids, load_prompts
from lab.background import live_measurement
from lab.environments import quick_profile
from lab.live_protocol import rotation
from policies import make_policy
from policies.baselines import StaticDepth


class CycleDepths(BasePolicy):
    """Drafts the given depths in turn, round after round."""

    reads_step_features = False

    def __init__(self, depths: tuple[int, ...]) -> None:
        self.depths, self.name, self.round = depths, "cycle:" + ",".join(map(str, depths)), 0

    def reset(self) -> None:
        self.round = 0

    def should_continue(self, state: DraftState) -> bool:
        return state.depth < self.depths[self.round % len(self.depths)]

    def observe(self, stats: RoundStats) -> None:
        self.round += 1


class FeaturedStaticDepth(StaticDepth):
    """A static depth that has the decoder compute the draft's features at every step, as a learned policy does."""

    reads_step_features = True


def measure(
    pair, makers: dict[str, Callable[[], DraftPolicy]], prompts: list[list[int]], new_tokens: int, repeats: int, max_depth: int, tree: TreeShape | None = None
) -> dict[str, dict]:
    """Per configuration: wall seconds, tokens, rounds, drafted tokens, and per drafted depth the rounds'
    (draft ms, verify ms, policy ms, context, accepted), and every generation's rounds (``generations``); chains, or
    trees of shape ``tree``."""

    def decoder(policy: DraftPolicy):
        if tree is None:
            return SpeculativeDecoder(pair.target, pair.draft, policy, max_depth=max_depth)
        return TreeDecoder(pair.target, pair.draft, policy, tree, max_depth=max_depth)

    names = list(makers)
    found = {name: {"wall": 0.0, "tokens": 0, "rounds": 0, "drafted": 0, "by_depth": defaultdict(list), "generations": []} for name in names}
    decoder(makers[names[0]]()).generate(prompts[0], 8)  # warm-up
    for repeat in range(repeats):
        for index, ids in enumerate(prompts):
            for spec in rotation(names, index + repeat):
                result = decoder(makers[spec]()).generate(ids, new_tokens)
                entry = found[spec]
                entry["wall"] += result.total_time
                entry["tokens"] += len(result.token_ids)
                entry["rounds"] += len(result.rounds)
                entry["generations"].append(result.rounds)
                for r in result.rounds:
                    entry["drafted"] += r.drafted
                    entry["by_depth"][r.drafted].append((r.draft_time * 1e3, r.verify_time * 1e3, r.policy_time * 1e3, r.context_length, r.accepted))
    return found


def report(found: dict[str, dict], depths: list[int]) -> list[str]:
    """The benchmark's lines: each configuration's totals, then for each depth every configuration's rounds of it."""
    lines = []
    for spec, entry in found.items():
        rounds = max(1, entry["rounds"])
        lines.append(
            f"{spec}: {entry['wall'] / rounds * 1e3:.2f} ms/round, {entry['wall'] / max(1, entry['tokens']) * 1e3:.2f} ms/token,"
            f" drafted {entry['drafted'] / rounds:.2f}, tau {entry['tokens'] / rounds:.2f}"
        )
    lines.append("rounds of one depth (medians of draft, verify, policy ms; median context; mean accepted):")
    for depth in depths:
        for spec, entry in found.items():
            rows = entry["by_depth"].get(depth, [])
            if not rows:
                continue
            med = [statistics.median(row[i] for row in rows) for i in range(4)]
            lines.append(
                f"  depth {depth} {spec}: {len(rows)} rounds; draft {med[0]:.2f}, verify {med[1]:.2f}, policy {med[2]:.3f} ms;"
                f" context {med[3]:.0f}; accepted {statistics.mean(row[4] for row in rows):.2f}"
            )
    return lines


PARTS = ("draft forwards", "draft's own work", "target forward", "verification's own work")


def against_profile(generations: list[list[RoundStats]], profile: CostProfile, tree: bool = False) -> dict[str, float]:
    """Live seconds of the generations' rounds (draft + verify, the policy apart) and replay's price of the same
    rounds, with live's four parts beside the profile's two (draft forwards and own work against the profile's draft
    run; the target's forward and the verification's own work against its verification); tree rounds as tree replay
    prices them."""
    live = {part: 0.0 for part in PARTS}
    modelled_draft = modelled_verify = 0.0
    for r, emitted in ((r, rounds[i - 1].emitted if i else None) for rounds in generations for i, r in enumerate(rounds)):
        for part, seconds in zip(PARTS, r.time_parts()):
            live[part] += seconds
        modelled_draft += profile.round_drafting_seconds(r.context_length, r.drafted, emitted, tree)
        modelled_verify += profile.round_verifying_seconds(r.context_length, r.verified, tree)
    return {**live, "modelled draft": modelled_draft, "modelled verify": modelled_verify}


def profile_lines(found: dict[str, dict], profile: CostProfile, tree: bool = False) -> list[str]:
    """Per configuration: replay's price of its live rounds against their live time, and live's four parts."""
    lines = ["replay's price of the live rounds (ms per round; error = replay / live - 1):"]
    for spec, entry in found.items():
        rounds = max(1, sum(len(g) for g in entry["generations"]))
        cost = {key: value * 1e3 / rounds for key, value in against_profile(entry["generations"], profile, tree).items()}
        live = sum(cost[part] for part in PARTS)
        modelled = cost["modelled draft"] + cost["modelled verify"]
        lines.append(
            f"  {spec}: live {live:.2f}, replay {modelled:.2f} ({modelled / live - 1:+.1%}); draft forwards {cost['draft forwards']:.2f}"
            f" + own work {cost[PARTS[1]]:.2f} vs profile {cost['modelled draft']:.2f}; target forward {cost['target forward']:.2f}"
            f" + own work {cost[PARTS[3]]:.2f} vs profile {cost['modelled verify']:.2f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, help="a policy spec or a learned policy folder")
    parser.add_argument("--depths", default="3,8", help="static depths to set beside the policy's rounds of that depth")
    parser.add_argument("--per-language", type=int, default=2, help="val prompts per language")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--max-depth", type=int, default=8)
    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPE_CHOICES)
    parser.add_argument("--engine", default="eager", choices=list(ENGINES))
    parser.add_argument("--profile", help="a cost profile to price the live rounds with, or auto (measured first, here)")
    parser.add_argument("--cycle", help="also a rule drafting these depths in turn, e.g. 2,8")
    parser.add_argument("--with-features", action="store_true", help="also each static depth reading the draft's features at every step")
    parser.add_argument("--tree", help="decode draft trees of this shape K,W,V instead of chains (depths are levels)")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    if not all(1 <= d <= args.max_depth for d in depths):
        raise SystemExit(f"--depths must lie in 1..{args.max_depth} (--max-depth), got {args.depths}")
    pair = load_pair("smollm2-135m", args.dtype, engine=args.engine)
    prompts = [chat_ids(pair.tokenizer, p["prompt"]) for lang in LANGUAGES for p in load_prompts("val", lang=lang)[: args.per_language]]
    makers: dict[str, Callable[[], DraftPolicy]] = {args.policy: lambda: make_policy(args.policy)}
    for depth in depths:
        makers[f"static:{depth}"] = lambda depth=depth: StaticDepth(depth)
        if args.with_features:
            makers[f"static:{depth}+features"] = lambda depth=depth: FeaturedStaticDepth(depth)
    if args.cycle:
        cycle = tuple(int(d) for d in args.cycle.split(","))
        if not all(1 <= d <= args.max_depth for d in cycle):
            raise SystemExit(f"--cycle depths must lie in 1..{args.max_depth}, got {args.cycle}")
        makers[f"cycle:{args.cycle}"] = lambda: CycleDepths(cycle)
    tree = TreeShape.parse(args.tree) if args.tree else None
    with live_measurement():  # background data work waits meanwhile
        profile = None
        if args.profile:
            verified = max(args.max_depth, tree.size if tree else 0) + 1
            profile = quick_profile(pair, verified, tree_mask=tree is not None) if args.profile == "auto" else CostProfile.load(args.profile)
        found = measure(pair, makers, prompts, args.new_tokens, args.repeats, args.max_depth, tree)
    print(
        f"default pair at {args.dtype} on {args.engine}, greedy, {f'trees {args.tree}' if tree else 'chains'},"
        f" {len(prompts)} val prompts x {args.new_tokens} tokens,"
        f" {args.repeats} repeats in rotating order" + (f"; profile {args.profile} (measured {profile.document.get('measured_at')})" if profile else "")
    )
    print("\n".join(report(found, depths)))
    if profile is not None:
        print("\n".join(profile_lines(found, profile, tree is not None)))


if __name__ == "__main__":
    main()
