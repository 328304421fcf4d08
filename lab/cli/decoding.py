"""Commands about decoding itself: ``exactness``, ``costmodel``, ``generate``, ``demo``."""

from __future__ import annotations

import argparse
import functools

import torch

from adaptive import costmodel, exactness
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.divergence import first_divergence
from adaptive.generation import prompt_token_ids
from adaptive.policy import RoundStats
from adaptive.profile import CostProfile
from adaptive.sampling import SamplingConfig
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.workload import LANGUAGES, chat_ids, load_prompts
from lab.cli.commands import add_command
from lab.cli.common import add_engine_argument, add_pair_arguments, floats, pair_from_arguments, print_rounds, summary_row
from lab.report import format_table
from policies import make_policy

POLICY_HELP = "draft policy spec: static:G, heuristic, confidence[:TAU], entropy[:H], costmodel[:C], or a learned policy's run folder / policy.json"


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
    g: costmodel.GCurve = CostProfile.load(args.g_profile).g_curve() if args.g_profile else args.g
    points = costmodel.sweep(lambda gamma: costmodel.expected_tokens(args.alpha, gamma), args.c, g, args.max_gamma)
    best = costmodel.best(points)
    g_label = f"profile {args.g_profile}" if args.g_profile else f"g={args.g:g}"
    print(f"alpha={args.alpha:g}  c={args.c:g}  {g_label}")
    rows = [[p.gamma, f"{p.expected_tokens:.6f}", f"{p.cost:.4f}", f"{p.speedup:.4f}", "<- optimum" if p is best else ""] for p in points]
    print(format_table(["gamma", "E[tokens]", "g+c*gamma", "speedup", ""], rows))
    print(f"optimal gamma* = {best.gamma}: E = {best.expected_tokens:.6f}, S = {best.speedup:.3f}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Speculative generation of one prompt, with per-round statistics and optional plain comparison."""
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    policy = make_policy(args.policy, pair=args.pair)
    pair = pair_from_arguments(args)
    if args.tree:
        shape = TreeShape.parse(args.tree)
        decoder = TreeDecoder(pair.target, pair.draft, policy, shape, sampling, tokenizer=pair.tokenizer, max_depth=args.max_depth)
        mode = f"tree k={shape.branching} W={shape.width} V={shape.size}"
    else:
        decoder = SpeculativeDecoder(pair.target, pair.draft, policy, sampling, tokenizer=pair.tokenizer, max_depth=args.max_depth)
        mode = "chain"
    run = functools.partial(decoder.generate, seed=args.seed)
    templated = not args.raw and bool(getattr(pair.tokenizer, "chat_template", None))
    prompt = chat_ids(pair.tokenizer, args.prompt) if templated else args.prompt
    if args.warmup:
        run(prompt, min(8, args.max_new_tokens))
    form = "the tokenizer's chat template (--raw: as given)" if templated else "as given" + ("" if args.raw else " (the tokenizer has no chat template)")
    print(f"pair: {pair.name}  {mode}  policy: {policy.name}  sampling: {sampling.describe()}  dtype: {args.dtype}  engine: {args.engine}")
    print(f"prompt: {form}\n\n{args.prompt}\n--> ", end="", flush=True)
    stream = TextStream(pair.tokenizer)
    result = run(prompt, args.max_new_tokens, on_round=stream)
    stream.finish()
    if result.stop_reason == "context":
        print(f"note: stopped after {len(result.token_ids)} new tokens, where the prompt and the output fill the model's positions\n")
    if not args.quiet_rounds:
        print_rounds(result)
    rows = [summary_row(f"speculative ({policy.name})", result)]
    if args.compare:
        plain = generate_plain(pair.target, prompt, args.max_new_tokens, sampling, tokenizer=pair.tokenizer, seed=args.seed)
        rows.append(summary_row("plain target", plain))
    print()
    print(format_table(["decoder", "tokens", "rounds", "tokens/round", "accept rate", "seconds", "tokens/s"], rows))
    if args.compare:
        print(f"\nspeedup over plain decoding: {result.tokens_per_second / plain.tokens_per_second:.3f}x (same run, same prompt)")
        if sampling.is_greedy:
            print(f"greedy outputs: {'identical' if plain.token_ids == result.token_ids else 'DIFFERENT'}")
            divergence = first_divergence(pair.target, prompt_token_ids(prompt, pair.tokenizer), plain.token_ids, result.token_ids)
            if divergence is not None:
                print(divergence.describe(lambda t: pair.tokenizer.decode([t])))
                print(
                    "(at float32 the outputs are identical by construction; at bfloat16 a k-token verification forward and a 1-token "
                    "forward round differently, so near-ties can flip: the output still follows the target's verification forward)"
                )
    return 0


class TextStream:
    """Prints a generation's text as its rounds are accepted: the whole output is decoded again each round (so that
    tokens which only make sense together print right) and what is new is printed; a character still incomplete
    (the replacement character at the end) waits for the next round."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.tokens, self.shown = tokenizer, [], 0

    def _text(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def __call__(self, stats: RoundStats) -> None:
        self.tokens += stats.tokens
        text = self._text()
        ready = len(text.rstrip("\ufffd"))
        if ready > self.shown:
            print(text[self.shown : ready], end="", flush=True)
            self.shown = ready

    def finish(self) -> None:
        """Print what is left, end the line and leave a blank one."""
        print(self._text()[self.shown :] + "\n", flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    """Decode one test prompt per language, speculative and plain side by side, and print the speedups."""
    sampling = SamplingConfig(args.temperature)
    pair = pair_from_arguments(args)
    decoder = SpeculativeDecoder(pair.target, pair.draft, make_policy(args.policy, pair=args.pair), sampling, tokenizer=pair.tokenizer)
    decoder.generate(chat_ids(pair.tokenizer, "Hello"), max_new_tokens=8)  # warm-up
    print(
        f"pair {pair.name}, policy {decoder.policy.name}, {sampling.describe()}, {args.max_new_tokens} new tokens, "
        f"first test-split prompt per language, plain and speculative in the same run\n"
    )
    rows = []
    for index, lang in enumerate(LANGUAGES):
        prompt = load_prompts("test", lang=lang)[0]
        ids = chat_ids(pair.tokenizer, prompt["prompt"])
        result = decoder.generate(ids, args.max_new_tokens, seed=args.seed)
        plain = generate_plain(pair.target, ids, args.max_new_tokens, sampling, tokenizer=pair.tokenizer, seed=args.seed)
        if index == 0:
            print(f"[{prompt['id']}] {prompt['prompt'][:200]}\n--> {result.text}\n")
            print_rounds(result)
            print()
        same = "yes" if result.token_ids == plain.token_ids else ("n/a (sampled)" if not sampling.is_greedy else "NO")
        rows.append(
            [
                lang,
                prompt["task"],
                len(result.token_ids),
                f"{result.mean_emitted:.2f}",
                f"{result.acceptance_rate:.3f}",
                f"{plain.tokens_per_second:.1f}",
                f"{result.tokens_per_second:.1f}",
                f"{result.tokens_per_second / plain.tokens_per_second:.2f}x",
                same,
            ]
        )
    print(format_table(["lang", "task", "tokens", "tokens/round", "accept rate", "plain tok/s", "spec tok/s", "speedup", "identical"], rows))
    return 0


def register(commands) -> None:
    """Add this module's subcommands to the ``adaptive`` parser."""
    audit = add_command(commands, "exactness")
    audit.add_argument("--p", type=floats, default=exactness.SEED_P, help="target distribution, e.g. 0.5,0.3,0.2")
    audit.add_argument("--q", type=floats, default=exactness.SEED_Q, help="draft distribution, e.g. 0.2,0.5,0.3")
    audit.add_argument("--trials", type=int, default=200_000, help="Monte Carlo trials (default 200000)")
    audit.add_argument("--seed", type=int, default=exactness.SEED_MONTE_CARLO, help="Monte Carlo seed (default 20260923)")
    audit.set_defaults(func=cmd_exactness)

    cost = add_command(commands, "costmodel")
    cost.add_argument("--alpha", type=float, required=True, help="per-token acceptance probability α in [0, 1]")
    cost.add_argument("--c", type=float, required=True, help="draft step cost / target step cost")
    g_group = cost.add_mutually_exclusive_group()
    g_group.add_argument("--g", type=float, default=1.0, help="verification cost in target steps (default 1)")
    g_group.add_argument("--g-profile", help="a measured cost profile (adaptive profile --out FILE): g(γ) from it")
    cost.add_argument("--max-gamma", type=int, default=16, help="largest γ in the sweep (default 16)")
    cost.set_defaults(func=cmd_costmodel)

    gen = add_command(commands, "generate")
    gen.add_argument("prompt", help="the prompt text")
    add_pair_arguments(gen)
    add_engine_argument(gen)
    gen.add_argument("--policy", default="static:4", help=POLICY_HELP)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=None, help="keep the k most probable tokens")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (default 1.0)")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--max-depth", type=int, default=16, help="hard cap on drafted tokens per round (tree depth with --tree)")
    gen.add_argument("--tree", metavar="K,W,V", help="draft trees: K children per expanded node, W nodes expanded per depth, V nodes verified, e.g. 4,4,32")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--raw", action="store_true", help="feed the prompt as given (default: in the tokenizer's chat template, where it has one)")
    gen.add_argument("--compare", action="store_true", help="also run plain target decoding and print the speedup")
    gen.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the short warm-up generation")
    gen.add_argument("--quiet-rounds", action="store_true", help="do not print the per-round table")
    gen.set_defaults(func=cmd_generate)

    demo = add_command(commands, "demo")
    add_pair_arguments(demo)
    add_engine_argument(demo)
    demo.set_defaults(pair="smollm2-135m")
    demo.add_argument("--policy", default="entropy", help="draft policy spec (default entropy: the fastest baseline measured on the default pair)")
    demo.add_argument("--temperature", type=float, default=0.0)
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=cmd_demo)
