"""The ``adaptive`` command line: exactness audit, cost model, speculative generation."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
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


def _load_pair(args: argparse.Namespace):
    """The pair named by --pair, or the one given by --target and --draft."""
    from adaptive.pair import load_pair, load_pair_from_paths

    if args.pair:
        return load_pair(args.pair, args.dtype, args.device)
    if not (args.target and args.draft):
        raise ValueError("give --pair NAME, or both --target PATH and --draft PATH")
    return load_pair_from_paths(args.target, args.draft, args.dtype, args.device)


def _add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    from adaptive.pair import PAIRS

    parser.add_argument("--pair", help=f"a named pair: {', '.join(PAIRS)}")
    parser.add_argument("--target", help="folder (or hub id) of the target model, instead of --pair")
    parser.add_argument("--draft", help="folder of the draft model (same tokenizer), instead of --pair")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu")


def cmd_profile(args: argparse.Namespace) -> int:
    """Measure draft and verification costs of a pair on this machine and write the JSON profile."""
    from adaptive.profiling import profile_pair, save_profile

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    pair = _load_pair(args)
    contexts = tuple(int(x) for x in args.contexts.split(","))
    profile = profile_pair(
        pair.target, pair.draft, max_verify=args.max_verify, contexts=contexts,
        reference_context=args.reference_context, repetitions=args.repetitions, tree_mask=args.tree_mask,
    )
    profile["pair"] = pair.name
    save_profile(profile, args.out)
    hw = profile["hardware"]
    print(f"pair {pair.name}, {profile['dtype']}, {hw['processor']} ({hw['torch_threads']} threads), {args.repetitions} repetitions, medians")
    print(f"target step {profile['target_step_ms']:.2f} ms, draft step {profile['draft_step_ms']:.2f} ms at context {args.reference_context}")
    rows = []
    for gamma in range(0, args.max_verify):
        point = profile["verify"][str(args.reference_context)][str(gamma + 1)]
        rows.append([gamma, gamma + 1, f"{point['median_ms']:.2f}", f"{point['p25_ms']:.2f}-{point['p75_ms']:.2f}", f"{profile['g'][str(gamma)]:.3f}"])
    print(format_table(["gamma", "tokens verified", "verify ms", "IQR ms", "g(gamma)"], rows))
    by_context = [[ctx, f"{profile['draft_step'][str(ctx)]['median_ms']:.2f}", f"{profile['verify'][str(ctx)]['1']['median_ms']:.2f}"] for ctx in contexts]
    print(format_table(["context", "draft step ms", "target step ms"], by_context))
    print(f"c = {profile['c']:.4f}   profile written to {args.out}")
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    """Distil a draft for the default target on the workload corpus (long: run it in the background)."""
    import json
    import logging

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptive.distill import DistillConfig, distill
    from adaptive.models import cache_root, smollm2_folder

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    folder = smollm2_folder()
    target = AutoModelForCausalLM.from_pretrained(folder, dtype="float32").eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    corpus = args.corpus or cache_root() / "corpus.jsonl"
    if not Path(corpus).is_file():
        raise ValueError(f"corpus {corpus} is missing; build it with `python scripts/build_workload.py`")
    config = DistillConfig(
        num_layers=args.layers,
        vocab_size=args.vocab,
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        response_fraction=args.response_fraction,
        seed=args.seed,
        init=args.init,
    )
    summary = distill(target, tokenizer, Path(corpus), Path(args.out), config, cache_root() / "distill")
    print(json.dumps(summary, indent=1))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Compare learned policies with grid search, the cost model, heuristics and the oracle on the test split."""
    import time

    from adaptive.comparison import evaluate
    from adaptive.config import load_config

    config = load_config(args.config)
    learned = args.policy or ([str(Path(args.runs) / f"{config.name}-latest")] if (Path(args.runs) / f"{config.name}-latest").exists() else [])
    out = Path(args.out or Path("evaluations") / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if config.env.tree:
        from adaptive.tree_comparison import evaluate_trees

        evaluate_trees(config, learned, out, args.live_per_language, args.max_new_tokens)
    else:
        evaluate(config, learned, out, args.live_per_language, args.max_new_tokens, args.grid_live_per_language)
    print((out / "report.md").read_text())
    print(f"report, evaluation.json and plots in {out}")
    return 0


def cmd_retarget(args: argparse.Namespace) -> int:
    """Evaluate a trained policy under another cost profile and re-train it briefly from its checkpoints."""
    import time

    import yaml

    from policies.retarget import retarget

    run = Path(args.run)
    if not (run / "config.yaml").is_file() or not (run / "final").is_dir():
        raise ValueError(f"{run} is not a finished training run folder (config.yaml and final/ expected)")
    name = yaml.safe_load((run / "config.yaml").read_text())["name"]
    out = Path(args.out or Path(args.runs) / f"{name}-retarget-{time.strftime('%Y%m%d-%H%M%S')}")
    print(f"re-training into {out}")
    result = retarget(run, args.profile, args.timesteps, out)
    rows = [
        ["old policy, old profile", f"{result['old_policy_on_old_profile']:.3f}x"],
        ["old policy, new profile", f"{result['old_policy']:.3f}x"],
        [f"re-trained ({args.timesteps} steps), new profile", f"{result['retrained_policy']:.3f}x"],
        [f"best static ({result['best_static']['policy']}), new profile", f"{result['best_static']['speedup']:.3f}x"],
        ["oracle, new profile", f"{result['oracle']:.3f}x"],
    ]
    print(f"replay on the val traces; new profile {args.profile} (old: {result['old_profile']})")
    print(format_table(["policy", "speedup over plain"], rows))
    print(f"re-training gain {result['retraining_gain']:+.1%}; written to {out / 'retarget.json'}; use it: --policy {out}")
    return 0


def _record_trees(args: argparse.Namespace) -> int:
    """Tree traces along the greedy outputs of a split's chain traces (which recorded and checked them)."""
    import time

    from tqdm import tqdm

    from adaptive.profiling import hardware_description
    from adaptive.traces import TraceSet
    from adaptive.tree import TreeShape
    from adaptive.tree_traces import record_trees
    from adaptive.workload import chat_ids, first_per_language, load_prompts

    if args.temperature > 0:
        raise ValueError("--tree records greedy traces only (tree mode is greedy-only); drop --temperature")
    shape = TreeShape.parse(args.tree)
    pair = _load_pair(args)
    name = args.pair or Path(args.draft).name
    source = Path(args.outputs or f"data/traces/{name}-{args.split}.npz")
    if source.suffix != ".npz":
        raise ValueError(f"with --tree, --outputs must be the split's chain trace file (.npz) holding the greedy outputs, got {source}")
    chain = TraceSet.load(source)
    by_id = {p["id"]: p for p in load_prompts(args.split)}
    keep = [i for i in range(len(chain)) if args.lang in (None, chain.langs[i])]
    if args.per_language:
        keep = [keep[k] for k in first_per_language([chain.langs[i] for i in keep], args.per_language)]
    keep = keep[: args.limit]
    prompts = [by_id[chain.prompt_ids[i]] for i in keep]
    ids = [chat_ids(pair.tokenizer, p["prompt"]) for p in prompts]
    if any(len(x) != int(chain.prompt_lengths[i]) for x, i in zip(ids, keep)):
        raise ValueError(f"{source} was recorded with other prompt tokens than this tokenizer gives")
    outputs = [chain.output(i).tolist() for i in keep]
    metadata = {"pair": name, "split": args.split, "outputs_from": str(source), "max_new_tokens": chain.max_new_tokens, "dtype": args.dtype,
                "recorded_on": hardware_description(pair.target.device), "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    start = time.perf_counter()
    with tqdm(total=len(prompts), desc=f"record trees {args.split}", unit="prompt") as progress:
        traces = record_trees(pair.draft, prompts, ids, outputs, shape, args.depth, metadata, progress)
    out = Path(args.out or f"data/traces/{name}-{args.split}-tree.npz")
    traces.save(out)
    print(f"{len(traces)} prompts, {int(traces.offsets[-1])} positions, k={shape.branching} W={shape.width} V={shape.size} depth {args.depth}, "
          f"on-path nodes per position {traces.on_path.sum(axis=1).mean():.3f}, {time.perf_counter() - start:.0f} s -> {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    """Record greedy replay traces of a pair on a workload split."""
    import json
    import time

    from tqdm import tqdm

    from adaptive.profiling import hardware_description, load_profile
    from adaptive.recorder import record
    from adaptive.workload import chat_ids, first_per_language, load_prompts
    from policies import make_policy

    if args.depth < 1 or args.max_new_tokens < 2:
        raise ValueError(f"--depth must be >= 1 and --max-new-tokens >= 2, got {args.depth} and {args.max_new_tokens}")
    if args.tree:
        return _record_trees(args)
    pair = _load_pair(args)
    name = args.pair or Path(args.draft).name
    prompts = load_prompts(args.split, lang=args.lang)
    if args.per_language:
        prompts = [prompts[k] for k in first_per_language([p["lang"] for p in prompts], args.per_language)]
    prompts = prompts[: args.limit]
    given = None
    if args.outputs:
        given = {row["id"]: row["response"] for row in map(json.loads, Path(args.outputs).read_text().splitlines())}
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    decoder = SpeculativeDecoder(pair.target, pair.draft, make_policy("static:1"), sampling, tokenizer=pair.tokenizer, max_depth=args.depth)
    metadata = {
        "pair": name,
        "tokenizer": pair.tokenizer.name_or_path,
        "split": args.split,
        "recorded_on": hardware_description(pair.target.device),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "dtype": args.dtype,
    }
    profile_path = Path(args.profile) if args.profile else Path("profiles") / f"{name}.json"
    if profile_path.is_file():
        metadata["profile"] = {"path": str(profile_path), "hardware": load_profile(profile_path)["hardware"]}
    ids = [chat_ids(pair.tokenizer, p["prompt"]) for p in prompts]
    start = time.perf_counter()
    with tqdm(total=len(prompts), desc=f"record {args.split}", unit="prompt") as progress:
        traces = record(decoder, prompts, ids, args.max_new_tokens, args.depth, metadata, given, progress, args.seed)
    suffix = "" if sampling.is_greedy else f"-t{args.temperature:g}"
    out = Path(args.out or f"data/traces/{name}-{args.split}{suffix}.npz")
    traces.save(out)
    positions = int(traces.offsets[-1])
    summary = f"mean first-step acceptance {traces.accept_prob[:, 0].mean():.3f}" if traces.sampled else f"mean m(t) {traces.match.mean():.3f}"
    print(
        f"{len(traces)} prompts, {positions} positions, K={args.depth}, {sampling.describe()}, {summary}, "
        f"{traces.metadata['repaired_outputs']} given outputs repaired, {time.perf_counter() - start:.0f} s -> {out} "
        f"({out.stat().st_size / 1e6:.1f} MB)"
    )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Train depth (and size) policies with PPO as an experiment config says; or resume a killed run."""
    import json
    import time

    from adaptive.config import load_config
    from policies.training import resume, train

    if bool(args.config) == bool(args.resume):
        raise ValueError("give either a CONFIG file or --resume RUN_DIR")
    if args.resume:
        folder = Path(args.resume)
        final = resume(folder)
    else:
        config = load_config(args.config)
        folder = Path(args.runs) / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        print(f"run folder: {folder}")
        final = train(config, folder)
        latest = Path(args.runs) / f"{config.name}-latest"
        latest.unlink(missing_ok=True)
        latest.symlink_to(folder.name)
        print(f"{latest} now points to this run")
    evaluation = json.loads((folder / "evaluation.json").read_text())
    rows = [[name, f"{v['speedup']:.3f}x", v["tokens"], f"{v['seconds']:.2f}"] for name, v in evaluation.items()]
    print(format_table(["policy (evaluation env)", "speedup over plain", "tokens", "modelled seconds"], rows))
    print(f"policy: {final}   use it: adaptive generate --policy {folder} ...   plots: {folder / 'plots'}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Speculative generation of one prompt, with per-round statistics and optional plain comparison."""
    from adaptive.workload import chat_ids
    from policies import make_policy

    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    policy = make_policy(args.policy)
    pair = _load_pair(args)
    if args.tree:
        from adaptive.tree import TreeShape
        from adaptive.tree_decoder import TreeDecoder

        if not sampling.is_greedy:
            raise ValueError("--tree is greedy-only (exact multi-candidate verification for T > 0 is not implemented): drop --temperature or --tree")
        shape = TreeShape.parse(args.tree)
        tree = TreeDecoder(pair.target, pair.draft, policy, shape, tokenizer=pair.tokenizer, max_depth=args.max_depth)
        run = tree.generate
        mode = f"tree k={shape.branching} W={shape.width} V={shape.size}"
    else:
        chain = SpeculativeDecoder(pair.target, pair.draft, policy, sampling, tokenizer=pair.tokenizer, max_depth=args.max_depth)
        run = functools.partial(chain.generate, seed=args.seed)
        mode = "chain"
    prompt = chat_ids(pair.tokenizer, args.prompt) if args.chat else args.prompt
    if args.warmup:
        run(prompt, min(8, args.max_new_tokens))
    result = run(prompt, args.max_new_tokens)
    print(f"pair: {pair.name}  {mode}  policy: {policy.name}  sampling: {sampling.describe()}  dtype: {args.dtype}\n")
    print(f"{args.prompt}\n--> {result.text}\n")
    if not args.quiet_rounds:
        _print_rounds(result)
    rows = [_summary(f"speculative ({policy.name})", result)]
    if args.compare:
        plain = generate_plain(
            pair.target, prompt, args.max_new_tokens, sampling, tokenizer=pair.tokenizer, seed=args.seed
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


def cmd_demo(args: argparse.Namespace) -> int:
    """Decode one test prompt per language, speculative and plain side by side, and print the speedups."""
    from adaptive.workload import LANGUAGES, chat_ids, load_prompts
    from policies import make_policy

    sampling = SamplingConfig(args.temperature)
    pair = _load_pair(args)
    decoder = SpeculativeDecoder(pair.target, pair.draft, make_policy(args.policy), sampling, tokenizer=pair.tokenizer)
    decoder.generate(chat_ids(pair.tokenizer, "Hello"), max_new_tokens=8)  # warm-up
    print(f"pair {pair.name}, policy {decoder.policy.name}, {sampling.describe()}, {args.max_new_tokens} new tokens, "
          f"first test-split prompt per language, plain and speculative in the same run\n")
    rows = []
    for index, lang in enumerate(LANGUAGES):
        prompt = load_prompts("test", lang=lang)[0]
        ids = chat_ids(pair.tokenizer, prompt["prompt"])
        result = decoder.generate(ids, args.max_new_tokens, seed=args.seed)
        plain = generate_plain(pair.target, ids, args.max_new_tokens, sampling, tokenizer=pair.tokenizer, seed=args.seed)
        if index == 0:
            print(f"[{prompt['id']}] {prompt['prompt'][:200]}\n--> {result.text}\n")
            _print_rounds(result)
            print()
        same = "yes" if result.token_ids == plain.token_ids else ("n/a (sampled)" if not sampling.is_greedy else "NO")
        rows.append([
            lang, prompt["task"], len(result.token_ids), f"{result.mean_emitted:.2f}", f"{result.acceptance_rate:.3f}",
            f"{plain.tokens_per_second:.1f}", f"{result.tokens_per_second:.1f}",
            f"{result.tokens_per_second / plain.tokens_per_second:.2f}x", same,
        ])
    print(format_table(["lang", "task", "tokens", "tokens/round", "accept rate", "plain tok/s", "spec tok/s", "speedup", "identical"], rows))
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
    _add_pair_arguments(gen)
    gen.add_argument(
        "--policy", default="static:4",
        help="draft policy spec: static:G, heuristic, confidence[:TAU], entropy[:H], costmodel[:C], or a learned policy's run folder / policy.json",
    )
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=None, help="keep the k most probable tokens")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (default 1.0)")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--max-depth", type=int, default=16, help="hard cap on drafted tokens per round (tree depth with --tree)")
    gen.add_argument("--tree", metavar="K,W,V", help="draft trees (greedy only): K children per expanded node, W nodes expanded per depth, V nodes verified, e.g. 4,4,32")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    gen.add_argument("--compare", action="store_true", help="also run plain target decoding and print the speedup")
    gen.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the short warm-up generation")
    gen.add_argument("--quiet-rounds", action="store_true", help="do not print the per-round table")
    gen.set_defaults(func=cmd_generate)

    demo = commands.add_parser("demo", help="decode one test prompt per language, speculative vs plain, with speedups")
    _add_pair_arguments(demo)
    demo.set_defaults(pair="smollm2-135m")
    demo.add_argument("--policy", default="entropy", help="draft policy spec (default entropy: the fastest baseline measured on the default pair)")
    demo.add_argument("--temperature", type=float, default=0.0)
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=cmd_demo)

    prof = commands.add_parser("profile", help="measure draft step and verification costs of a pair on this machine")
    _add_pair_arguments(prof)
    prof.add_argument("--out", default="profiles/profile.json", help="where to write the JSON profile")
    prof.add_argument("--max-verify", type=int, default=32, help="largest number of tokens verified at once")
    prof.add_argument("--contexts", default="64,128,512", help="context lengths to measure at")
    prof.add_argument("--reference-context", type=int, default=128, help="context at which c and g are summarised")
    prof.add_argument("--repetitions", type=int, default=7)
    prof.add_argument("--tree-mask", action="store_true", help="time verifications as tree decoding runs them (explicit tree attention mask)")
    prof.add_argument("--threads", type=int, help="torch CPU threads to measure with (default: torch's own choice)")
    prof.set_defaults(func=cmd_profile)

    trn = commands.add_parser("train", help="train draft policies with PPO from an experiment config")
    trn.add_argument("config", nargs="?", help="experiment YAML, e.g. experiments/quickstart.yaml")
    trn.add_argument("--runs", default="runs", help="folder for run folders (default runs/); RUNS/NAME-latest links the newest")
    trn.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint")
    trn.set_defaults(func=cmd_train)

    ev = commands.add_parser("evaluate", help="learned policies vs grid search, cost model, heuristics, oracle on the test split")
    ev.add_argument("config", help="the experiment YAML the policies were trained with")
    ev.add_argument("--policy", action="append", help="learned policy run folder (repeatable; default RUNS/NAME-latest); with a tree config, runs trained on chains decode chains")
    ev.add_argument("--runs", default="runs")
    ev.add_argument("--live-per-language", type=int, default=2, help="test prompts per language decoded live (0: replay only)")
    ev.add_argument("--grid-live-per-language", type=int, default=1, help="val prompts per language on which grid search's 3 best depths are decoded live (0: choose in replay)")
    ev.add_argument("--max-new-tokens", type=int, default=128)
    ev.add_argument("--out", help="report folder (default evaluations/NAME-DATE)")
    ev.set_defaults(func=cmd_evaluate)

    ret = commands.add_parser("retarget", help="re-evaluate a trained policy under another cost profile and re-train it briefly")
    ret.add_argument("run", help="training run folder, e.g. runs/quickstart-latest")
    ret.add_argument("--profile", required=True, help="the new cost profile (adaptive profile --out FILE)")
    ret.add_argument("--timesteps", type=int, default=10_000, help="re-training steps per phase (default 10000)")
    ret.add_argument("--runs", default="runs")
    ret.add_argument("--out", help="run folder of the re-trained policy (default RUNS/NAME-retarget-DATE)")
    ret.set_defaults(func=cmd_retarget)

    rec = commands.add_parser("record", help="record greedy replay traces of a pair on a workload split")
    _add_pair_arguments(rec)
    rec.set_defaults(pair="smollm2-135m")
    rec.add_argument("--split", default="train", choices=["train", "val", "test"])
    rec.add_argument("--lang", choices=["it", "en", "zh", "es"], help="only this language")
    rec.add_argument("--limit", type=int, help="only the first N prompts")
    rec.add_argument("--per-language", type=int, help="only the first N prompts of each language")
    rec.add_argument("--depth", type=int, default=16, help="K: draft steps recorded per position (default 16)")
    rec.add_argument("--max-new-tokens", type=int, default=128)
    rec.add_argument("--outputs", help="JSONL of known greedy outputs {id, response} to reuse (checked, repaired if wrong)")
    rec.add_argument("--temperature", type=float, default=0.0, help="0 = greedy, exact replay (default); > 0 records acceptance probabilities")
    rec.add_argument("--top-k", type=int, default=None)
    rec.add_argument("--top-p", type=float, default=1.0)
    rec.add_argument("--seed", type=int, default=0, help="seed of the sampled outputs and drafts (T > 0)")
    rec.add_argument("--profile", help="cost profile to note in the metadata (default profiles/PAIR.json)")
    rec.add_argument("--tree", metavar="K,W,V", help="record draft-tree traces (greedy) along the outputs of the split's chain traces "
                     "(--outputs FILE.npz, default data/traces/PAIR-SPLIT.npz); V is the default verified nodes; --depth = tree levels")
    rec.add_argument("--out", help="trace file (default data/traces/PAIR-SPLIT.npz, or PAIR-SPLIT-tree.npz with --tree)")
    rec.set_defaults(func=cmd_record)

    dist = commands.add_parser("distill", help="distil a draft from the default target on the workload corpus")
    dist.add_argument("--out", required=True, help="folder for the draft, its checkpoints and log")
    dist.add_argument("--corpus", help="corpus JSONL (default: the one scripts/build_workload.py wrote)")
    dist.add_argument("--layers", type=int, default=2)
    dist.add_argument("--vocab", type=int, default=8192, help="size of the draft's output token subset")
    dist.add_argument("--steps", type=int, default=900)
    dist.add_argument("--batch-size", type=int, default=8)
    dist.add_argument("--learning-rate", type=float, default=5e-4, help="peak AdamW learning rate")
    dist.add_argument("--response-fraction", type=float, default=0.5, help="share of each batch from target responses")
    dist.add_argument("--init", help="continue from this saved draft folder (keeps its layers and token subset)")
    dist.add_argument("--seed", type=int, default=0)
    dist.set_defaults(func=cmd_distill)
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
