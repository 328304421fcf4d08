"""The ``adaptive`` command line: exactness audit, cost model, speculative generation."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from adaptive import costmodel, exactness
from adaptive.decoder import GenerationResult, SpeculativeDecoder, generate_plain
from adaptive.report import format_table
from adaptive.sampling import SamplingConfig


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from error


def cmd_exactness(args: argparse.Namespace) -> int:
    """Exact induced distributions of both rules, then the paired Monte Carlo."""
    p, q = args.p, args.q
    rows = []
    for name, rule in exactness.RULES.items():
        induced = exactness.induced_distribution(p, q, rule)
        rows.append([name, *(f"{x:.6f}" for x in induced.tolist()), f"{exactness.total_variation(induced, p):.6f}"])
    symbols = [chr(ord("A") + i) for i in range(len(p))]
    print(f"p = {p}\nq = {q}\n\nExact output distribution induced by each correction rule:")
    print(format_table(["rule", *symbols, "TV to p"], [["target p", *(f"{x:.6f}" for x in p), "0"], *rows]))
    audit = exactness.monte_carlo_audit(p, q, trials=args.trials, seed=args.seed)
    print(f"\nMonte Carlo: {audit.trials} trials, seed {audit.seed}; both rules share proposals and accept decisions.")
    header = ["rule", *(f"freq {s}" for s in symbols), *(f"dev {s}" for s in symbols), "max |dev|/SE"]
    mc_rows = []
    for name, freq in audit.frequencies.items():
        deviation = freq - torch.tensor(p, dtype=freq.dtype)
        z = float((deviation.abs() / audit.standard_error).max())
        mc_rows.append([name, *(f"{x:.5f}" for x in freq.tolist()), *(f"{x:+.5f}" for x in deviation.tolist()), f"{z:.1f}"])
    print(format_table(header, mc_rows))
    print("standard error sqrt(p(1-p)/n): " + ", ".join(f"{s} {se:.5f}" for s, se in zip(symbols, audit.standard_error.tolist())))
    return 0


def cmd_costmodel(args: argparse.Namespace) -> int:
    """Sweep γ = 1..max and print the optimum."""
    g: costmodel.GCurve = costmodel.load_g_profile(args.g_profile) if args.g_profile else args.g
    points = costmodel.sweep(lambda gamma: costmodel.expected_tokens(args.alpha, gamma), args.c, g, args.max_gamma)
    best = costmodel.best(points)
    g_label = f"profile {args.g_profile}" if args.g_profile else f"g={args.g:g}"
    print(f"alpha={args.alpha:g}  c={args.c:g}  {g_label}")
    rows = [
        [p.gamma, f"{p.expected_tokens:.6f}", f"{p.cost:.4f}", f"{p.speedup:.4f}", "<- optimum" if p is best else ""] for p in points
    ]
    print(format_table(["gamma", "E[tokens]", "g+c*gamma", "speedup", ""], rows))
    print(f"optimal gamma* = {best.gamma}: E = {best.expected_tokens:.6f}, S = {best.speedup:.3f}")
    return 0


def _print_rounds(result: GenerationResult) -> None:
    rows = [
        [
            i,
            r.context_length,
            r.drafted,
            r.verified,
            r.accepted,
            r.emitted,
            f"{r.draft_time * 1e3:.2f}",
            f"{r.verify_time * 1e3:.2f}",
            f"{r.policy_time * 1e3:.3f}",
        ]
        for i, r in enumerate(result.rounds, start=1)
    ]
    print(format_table(["round", "context", "drafted", "verified", "accepted", "emitted", "draft ms", "verify ms", "policy ms"], rows))


def _summary(label: str, result: GenerationResult) -> list:
    return [
        label,
        len(result.token_ids),
        len(result.rounds),
        f"{result.mean_emitted:.2f}",
        f"{result.acceptance_rate:.3f}",
        f"{result.total_time:.3f}",
        f"{result.tokens_per_second:.1f}",
    ]


def cmd_generate(args: argparse.Namespace) -> int:
    """Speculative generation of one prompt, with per-round statistics and optional plain comparison."""
    from adaptive.pair import load_pair_from_paths
    from policies import make_policy

    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    policy = make_policy(args.policy)
    pair = load_pair_from_paths(args.target, args.draft, args.dtype, args.device)
    decoder = SpeculativeDecoder(pair.target, pair.draft, policy, sampling, tokenizer=pair.tokenizer, max_depth=args.max_depth)
    if args.warmup:
        decoder.generate(args.prompt, max_new_tokens=min(8, args.max_new_tokens), seed=args.seed)
    result = decoder.generate(args.prompt, max_new_tokens=args.max_new_tokens, seed=args.seed)
    print(f"pair: {pair.name}  policy: {policy.name}  sampling: {sampling.describe()}  dtype: {args.dtype}\n")
    print(f"{args.prompt}{result.text}\n")
    if not args.quiet_rounds:
        _print_rounds(result)
    rows = [_summary(f"speculative ({policy.name})", result)]
    if args.compare:
        plain = generate_plain(
            pair.target, args.prompt, args.max_new_tokens, sampling, tokenizer=pair.tokenizer, seed=args.seed
        )
        rows.append(_summary("plain target", plain))
    print()
    print(format_table(["decoder", "tokens", "rounds", "tokens/round", "accept rate", "seconds", "tokens/s"], rows))
    if args.compare:
        print(f"\nspeedup over plain decoding: {result.tokens_per_second / plain.tokens_per_second:.3f}x (same run, same prompt)")
        if sampling.is_greedy:
            same = "identical" if plain.token_ids == result.token_ids else "DIFFERENT"
            print(f"greedy outputs: {same}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``adaptive`` command."""
    parser = argparse.ArgumentParser(prog="adaptive", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    audit = commands.add_parser("exactness", help="audit correction rules: exact induced distributions and Monte Carlo")
    audit.add_argument("--p", type=_floats, default=exactness.SEED_P, help="target distribution, e.g. 0.5,0.3,0.2")
    audit.add_argument("--q", type=_floats, default=exactness.SEED_Q, help="draft distribution, e.g. 0.2,0.5,0.3")
    audit.add_argument("--trials", type=int, default=200_000, help="Monte Carlo trials (default 200000)")
    audit.add_argument("--seed", type=int, default=exactness.SEED_MONTE_CARLO, help="Monte Carlo seed (default 20260923)")
    audit.set_defaults(func=cmd_exactness)

    cost = commands.add_parser("costmodel", help="speedup sweep over static depth and the analytic optimum")
    cost.add_argument("--alpha", type=float, required=True, help="per-token acceptance probability α in [0, 1]")
    cost.add_argument("--c", type=float, required=True, help="draft step cost / target step cost")
    g_group = cost.add_mutually_exclusive_group()
    g_group.add_argument("--g", type=float, default=1.0, help="verification cost in target steps (default 1)")
    g_group.add_argument("--g-profile", help="JSON file with a measured g(γ): {\"g\": {\"1\": 1.02, ...}}")
    cost.add_argument("--max-gamma", type=int, default=16, help="largest γ in the sweep (default 16)")
    cost.set_defaults(func=cmd_costmodel)

    gen = commands.add_parser("generate", help="speculative decoding of one prompt with per-round statistics")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--target", required=True, help="folder (or hub id) of the target model")
    gen.add_argument("--draft", required=True, help="folder (or hub id) of the draft model, same tokenizer")
    gen.add_argument("--policy", default="static:4", help="draft policy spec: static:G, heuristic, confidence[:TAU], entropy[:H], costmodel[:C]")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=None, help="keep the k most probable tokens")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (default 1.0)")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--max-depth", type=int, default=16, help="hard cap on drafted tokens per round")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--compare", action="store_true", help="also run plain target decoding and print the speedup")
    gen.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the short warm-up generation")
    gen.add_argument("--quiet-rounds", action="store_true", help="do not print the per-round table")
    gen.set_defaults(func=cmd_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``adaptive`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as error:
        print(f"adaptive {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
