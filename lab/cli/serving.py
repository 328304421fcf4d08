"""Commands about serving several requests at once: ``loadtest``, ``train-batch``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from adaptive.batch_profile import BatchCostProfile
from adaptive.sampling import SamplingConfig
from adaptive.traces import TraceSet
from envs.factory import default_traces
from lab import live_protocol
from lab.batch_training import CAPPED, DEFAULT_DECISION_MS, ORACLE, ORACLE_CAPPED, best_static_schedule, train_best_of_seeds, worst_load_ratio
from lab.cli.commands import add_command
from lab.cli.common import add_engine_argument, add_pair_arguments, pair_from_arguments
from lab.config import PPOConfig
from lab.loadtest import Load, LoadTestSettings, load_test, mixed_prompts, warm_up, write_result
from lab.plots import plot_load_test
from lab.report import format_table
from lab.runs import check_output_folder
from policies.batch import BATCH_POLICY_HELP, make_batch_policy

BASELINE = "plain"


def _integers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from error


def _numbers(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from error


def _diverged(entry: dict) -> str:
    """Requests whose greedy output left plain's, and (when checked) how many of those at a near-tie."""
    checked = entry.get("divergences")
    return f"{entry['divergent_requests']} ({checked['near_ties']} near-ties)" if checked else str(entry["divergent_requests"])


def _depths(depths: dict[str, dict[str, int]]) -> str:
    """Per batch size the depth chosen most often, with its share of the rounds when not all: ``1:2 2:1 (80 %)``."""
    cells = []
    for batch, counts in sorted(depths.items(), key=lambda item: int(item[0])):
        depth, rounds = max(counts.items(), key=lambda item: item[1])
        share = rounds / sum(counts.values())
        cells.append(f"{batch}:{depth}" + (f" ({share:.0%})" if share < 1 else ""))
    return " ".join(cells) or "-"


def _policy_cost(entry: dict) -> str:
    """The policy's decisions per round (µs) and their share of the run's wall time; n/a in older results."""
    if entry.get("policy_us_per_round") is None:
        return "n/a"
    return f"{entry['policy_us_per_round']:.0f} ({entry['policy_share']:.2%})"


def report_lines(result: dict) -> list[str]:
    """A Markdown table per load: per policy throughput, goodput, latency percentiles and the gain over plain."""
    lines = []
    for label, data in result["loads"].items():
        rows = []
        for name, entry in data["summary"].items():
            a, gain = entry["all"], entry["versus_baseline"]
            rows.append(
                [
                    name,
                    f"{a['throughput']:.1f}",
                    f"{a['goodput']:.1f}",
                    f"{a['ttft_ms']['p50']:.0f} / {a['ttft_ms']['p95']:.0f}",
                    f"{a['tpot_ms']['p50']:.1f} / {a['tpot_ms']['p95']:.1f} / {a['tpot_ms']['p99']:.1f}",
                    f"{a['itl_ms']['p50']:.1f} / {a['itl_ms']['p95']:.1f} / {a['itl_ms']['p99']:.1f}",
                    f"{a['e2e_ms']['p50'] / 1e3:.2f} / {a['e2e_ms']['p95'] / 1e3:.2f}",
                    f"{a['accepted_per_round']:.2f}",
                    _depths(entry.get("depths", {})),
                    _policy_cost(entry),
                    f"{gain['throughput_ratio']:.3f}",
                    f"{gain['request_speed_ratio']:.3f} [{gain['low']:.3f}, {gain['high']:.3f}]",
                    _diverged(entry),
                    f"{entry['peak_mib']:.0f}" if entry["peak_mib"] else "n/a",
                ]
            )
        header = [
            "policy",
            "tok/s",
            "goodput",
            "TTFT ms p50/p95",
            "TPOT ms p50/p95/p99",
            "ITL ms p50/p95/p99",
            "e2e s p50/p95",
            "accepted/round",
            "depth by batch size",
            "policy µs/round (share)",
            "throughput vs plain",
            "request speed vs plain [95 %]",
            "diverged",
            "peak MiB",
        ]
        lines += [f"### {label} ({data['load']['requests']} requests)", "", format_table(header, rows), ""]
    return lines


def cmd_loadtest(args: argparse.Namespace) -> int:
    if (args.concurrency is None) == (args.rate is None):
        raise ValueError("give --concurrency N[,N...] (closed-loop clients) or --rate R[,R...] (Poisson arrivals per second)")
    out = check_output_folder(args.out or f"loadtests/{time.strftime('%Y%m%d-%H%M%S')}", "--out")
    policies = [BASELINE] + [spec for spec in args.policy if spec != BASELINE]
    profile = BatchCostProfile.load(args.batch_profile) if args.batch_profile else None
    factories = {spec: (lambda s=spec: make_batch_policy(s, profile)) for spec in policies}
    for factory in factories.values():
        factory()  # a bad spec fails before the models load
    closed = tuple(Load(args.requests, concurrency=c, duration=args.duration) for c in args.concurrency or ())
    loads = closed + tuple(Load(args.requests, rate=r, duration=args.duration, max_batch=args.max_batch) for r in args.rate or ())
    near_ties = args.temperature == 0 and args.near_ties
    settings = LoadTestSettings(loads, args.max_new_tokens, args.max_depth, args.repeats, args.slo_tpot_ms, args.seed, near_ties, args.interleave)
    pair = pair_from_arguments(args)
    prompts = mixed_prompts(pair, args.requests, args.split)
    sampling = SamplingConfig(args.temperature)
    warm_up(pair, factories, sampling, [ids for _, ids in prompts[:2]], args.max_depth)
    checkpoint, identity = live_protocol.checkpoint_path(out, "load"), live_protocol.identity(pair, {"draft": pair.draft}, policies)
    result = load_test(pair, factories, settings, sampling, prompts, checkpoint, identity)
    result["setup"] = {
        "pair": args.pair or f"{args.target} + {args.draft}",
        "dtype": args.dtype,
        "engine": args.engine,
        "temperature": args.temperature,
        "split": args.split,
        "policies": policies,
        "batch_profile": args.batch_profile,
    }
    write_result(result, out)
    lines = report_lines(result)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    plot_load_test(result, out / "load.png")
    live_protocol.discard_checkpoints(out)
    print("\n".join(lines))
    print(f"results, report and plot in {out}/")
    return 0


def cmd_train_batch(args: argparse.Namespace) -> int:
    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    out = check_output_folder(args.out or f"runs/batch-{time.strftime('%Y%m%d-%H%M%S')}", "--out")
    loads = _integers(args.loads)
    profile = BatchCostProfile.load(args.batch_profile)
    path = Path(args.traces)
    traces = TraceSet.load(path if path.suffix == ".npz" else default_traces(args.traces))
    # per step, an episode is one round and its return the round's reward (nothing to discount inside it), and longer
    # rollouts steady its noisier per-step updates (measured in replay: 2,048 steps per update and 2M steps gave
    # +1.7 to +8.2 % over the schedule at loads 1-8; 1,024 and 1M, -2.4 to +4.4 %)
    per_step = {"n_steps": 2048, "gamma": 1.0} if args.per_step else {"n_steps": 1024, "gamma": 0.9}
    ppo = PPOConfig(timesteps=args.timesteps, batch_size=256, ent_coef=0.01, **per_step)
    extra = {"traces": str(path), "batch_profile": args.batch_profile}
    seeds = list(range(args.seed, args.seed + args.seeds))
    policy, chosen, judged = train_best_of_seeds(
        traces,
        profile,
        out,
        ppo,
        seeds,
        loads,
        args.max_depth,
        args.switch_prob,
        extra,
        args.slo_tpot_ms,
        args.cap_at_schedule,
        args.per_step,
        args.decision_ms,
    )
    measure = "throughput" if args.slo_tpot_ms is None else f"goodput at {args.slo_tpot_ms:g} ms per token"
    print(f"replay on {path}: each policy's {measure} over plain batched decoding's throughput, per load")
    evaluation = judged[chosen]
    names = [f"static:{d}" for d in range(args.max_depth + 1)] + ["best static", "costmodel", "goodput", "learned", CAPPED, ORACLE, ORACLE_CAPPED]
    rows = [
        [
            load,
            *(f"{row[name]:.3f}" for name in names),
            row["best static depth"],
            f"{row['learned over best static']:.3f}",
            f"{row['capped over best static']:.3f}",
            f"{row['capped oracle over best static']:.3f}",
        ]
        for load, row in evaluation.items()
    ]
    print(format_table(["load", *names, "best depth", "learned / best static", "capped / best static", "capped oracle / best static"], rows))
    print("inter-token gap p95 in replay (ms; a round's first token per request waits the round, the rest arrive with it), per load")
    print(format_table(["load", *names], [[load, *(f"{row['itl p95 ms'][name]:.1f}" for name in names)] for load, row in evaluation.items()]))
    if len(seeds) > 1:
        ratios = [
            [seed, *(f"{judged[seed][load]['learned over best static']:.3f}" for load in evaluation), f"{worst_load_ratio(judged[seed]):.3f}"] for seed in seeds
        ]
        print(format_table(["seed", *(f"learned / best static at load {load}" for load in evaluation), "worst load"], ratios))
        print(f"kept seed {chosen} (the best worst load); every seed's run in {out}/seed-N")
    schedule = best_static_schedule(evaluation, profile.batch_sizes[-1])
    print(f"per-batch-size schedule of the best static depths: {schedule.name}")
    print(f"policy {policy.name} in {out}/ (use it as --policy {out} in adaptive loadtest)")
    if not args.cap_at_schedule:
        print(f"capped at that schedule (never deeper): --policy capped:{schedule.spec}:{out}")
    return 0


def register(commands) -> None:
    """Add this module's subcommands to the ``adaptive`` parser."""
    load = add_command(commands, "loadtest")
    add_pair_arguments(load)
    add_engine_argument(load)
    load.add_argument(
        "--policy",
        action="append",
        default=[],
        help=f"batch policy (repeat for several): {BATCH_POLICY_HELP}; plain batched decoding always runs too",
    )
    load.add_argument("--batch-profile", help="a batched cost profile (adaptive profile --batches) for the costmodel and goodput policies")
    load.add_argument("--concurrency", type=_integers, help="closed-loop clients, e.g. 1,2,4,8 (one run per value)")
    load.add_argument("--rate", type=_numbers, help="Poisson arrivals per second, e.g. 0.5,1,2 (one run per value)")
    load.add_argument("--requests", type=int, default=16, help="requests per run (test-split prompts, languages taking turns; default 16)")
    load.add_argument("--duration", type=float, help="no new requests after this many seconds of a run")
    load.add_argument("--max-batch", type=int, default=8, help="with --rate: requests decoded at once (default 8)")
    load.add_argument("--max-new-tokens", type=int, default=128)
    load.add_argument("--max-depth", type=int, default=8, help="cap on drafted tokens per round")
    load.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    load.add_argument("--repeats", type=int, default=1, help="runs per policy and load, policy order rotating (default 1)")
    load.add_argument(
        "--interleave",
        action="store_true",
        help="run the policies of a repeat at once, one round each in turn, each timed only in its own turns: a change of host "
        "speed reaches every policy alike (for differences smaller than the host's drift between runs; peak memory is then theirs together)",
    )
    load.add_argument("--slo-tpot-ms", type=float, default=100.0, help="goodput counts requests at or under this time per output token (default 100 ms)")
    load.add_argument("--split", default="test", choices=["train", "val", "test"])
    load.add_argument(
        "--no-near-ties",
        dest="near_ties",
        action="store_false",
        help="skip checking, after the runs, that each greedy divergence from plain is a near-tie of the target",
    )
    load.add_argument("--seed", type=int, default=0)
    load.add_argument(
        "--out",
        help="folder for result.json, report.md and load.png (default loadtests/DATE); each finished load is kept there until "
        "then: run again into the same folder, a killed load test resumes",
    )
    load.set_defaults(func=cmd_loadtest)

    train = add_command(commands, "train-batch")
    train.add_argument("--batch-profile", required=True, help="a batched cost profile (adaptive profile --batches)")
    train.add_argument("--traces", default="train", help="greedy chain traces: a shipped split name or a trace file (default train)")
    train.add_argument("--loads", default="1,2,4,8", help="concurrency levels the load switches between (default 1,2,4,8)")
    train.add_argument("--switch-prob", type=float, default=0.02, help="per-round probability that the load changes (default 0.02)")
    train.add_argument("--max-depth", type=int, default=6)
    train.add_argument("--timesteps", type=int, default=100_000, help="PPO steps (rounds; default 100000)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="PPO runs with seeds SEED, SEED+1, ...; the one closest to the best static depth at its worst load in replay is kept (default 1)",
    )
    train.add_argument(
        "--slo-tpot-ms",
        type=float,
        help="reward goodput instead of throughput: a request's tokens count in a round only when round time / its tokens is at or under "
        "this many ms (the load test's --slo-tpot-ms, per round); the static depths and the schedule are judged the same way",
    )
    train.add_argument(
        "--cap-at-schedule",
        action="store_true",
        help="train inside the per-batch-size schedule of the best static depths (judged first in replay): the policy never drafts deeper "
        "than it, so never makes longer rounds, and learns where to draft less; saved with the cap, which loading applies",
    )
    train.add_argument(
        "--per-step",
        action="store_true",
        help="decide before each draft step whether the whole batch drafts one more token, seeing the draft's top-1 probabilities so far "
        "(observation version 2), instead of one depth as the round starts",
    )
    train.add_argument(
        "--decision-ms",
        type=float,
        default=DEFAULT_DECISION_MS,
        help=f"milliseconds each decision of the learned policy costs a round in replay (per round, or per step asked; default {DEFAULT_DECISION_MS:g}: "
        "measured live, the load test's policy µs/round; 0 charges nothing)",
    )
    train.add_argument("--out", help="policy folder (default runs/batch-DATE)")
    train.set_defaults(func=cmd_train_batch)
