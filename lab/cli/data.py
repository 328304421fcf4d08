"""Commands that measure or make data: ``profile``, ``record``, ``fit-acceptance``, ``distill``."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import time
from pathlib import Path

import torch

from adaptive.batch_profile import BatchCostProfile
from adaptive.copy_draft import CopyDraft
from adaptive.lean import LeanLlama
from adaptive.models import cache_root
from adaptive.pair import load_target
from adaptive.precision import DTYPES, bf16_matmuls, resolve_dtype
from adaptive.profile import CostProfile
from adaptive.profiling import hardware_description, hardware_differences, profile_batches, profile_pair
from adaptive.sampling import SamplingConfig
from adaptive.traces import TraceSet
from adaptive.tree import TreeShape
from adaptive.workload import COPY_TASKS, LANGUAGES, TASKS, load_prompts
from envs.factory import DEFAULT_PROFILE, default_traces, engine_suffix
from lab.acceptance import calibration, fit_predictor, sweep_thresholds
from lab.chat_prompts import diversity, write_chat_prompts
from lab.cli.commands import add_command
from lab.cli.common import add_engine_argument, add_pair_arguments, add_worker_arguments, pair_from_arguments, pair_name
from lab.distill import StandaloneKind
from lab.distill_data import CHAT_POOL, CHAT_TEST, POOL, SHARDS, generate_shards, load_target_for_generation
from lab.distill_eagle3 import Eagle3Kind
from lab.draft_training import TrainingConfig, train_draft, workload_sequences
from lab.plots import plot_calibration
from lab.recording import TRACES, record_chains, record_chains_sharded, record_tree_traces, select_prompts
from lab.report import format_table
from lab.runs import check_output_file
from lab.scale import wants_ray
from policies.acceptance import SHIPPED

TASK_GROUPS = {"copy-heavy": COPY_TASKS, "all": TASKS}
"""Names for several task types at once (their prompts take turns within each language)."""


def _profile_batches(pair, args: argparse.Namespace) -> int:
    """``adaptive profile --batches``: the batched cost profile, and the depth its cost model picks per batch size."""
    sizes = tuple(int(x) for x in args.batches.split(","))
    document = profile_batches(
        pair.target, pair.draft, batch_sizes=sizes, max_tokens=args.max_verify, context=args.reference_context, repetitions=args.repetitions
    )
    profile = BatchCostProfile.from_dict({**document, "pair": pair.name})
    profile.save(args.out)
    print(f"pair {pair.name}, {document['dtype']}, {document['hardware']['processor']} ({document['hardware']['torch_threads']} threads), medians")
    rows = [[b, f"{profile.draft(b):.1f}", *(f"{profile.target(b, n):.1f}" for n in range(1, args.max_verify + 1))] for b in sizes]
    print(format_table(["batch", "draft ms", *(f"target {n} ms" for n in range(1, args.max_verify + 1))], rows))
    alphas = (0.3, 0.5, 0.7)
    best = [[b, *(profile.best_depth(b, a) for a in alphas)] for b in sizes]
    print(format_table(["batch", *(f"best depth at alpha {a}" for a in alphas)], best))
    print(f"batched profile written to {args.out}")
    return 0


def _check_profile(path: Path, device: str) -> int:
    """``adaptive profile --check FILE``: 0 when FILE's timings were measured on hardware like this machine's, else 1
    with what differs."""
    recorded = json.loads(path.read_text())["hardware"]
    differences = hardware_differences(recorded, hardware_description(torch.device(device)))
    if differences:
        print(f"{path} was measured on other hardware:", *differences, sep="\n  ")
        return 1
    print(f"{path} was measured on hardware like this machine's ({recorded['processor']}, {recorded.get('matrix_flags')}, {recorded['torch_threads']} threads)")
    return 0


def _check_speed(path: Path, args: argparse.Namespace) -> int:
    """``adaptive profile --check FILE --speed``: 0 when this machine runs the pair's target and draft steps now within
    ``--speed-tolerance`` of FILE's, else 1. A host's speed can change between days (on a shared 2-core EPYC the target
    step went from 55.7 to 20.5 ms overnight) while its CPU flags stay the same."""
    document = json.loads(path.read_text())
    if not (args.pair or args.target):
        if "pair" not in document:
            raise ValueError(f"{path} does not name its pair: give --pair NAME (or --target and --draft) with --speed")
        args.pair = document["pair"]
    args.dtype = document.get("dtype", args.dtype)  # the profile's precision and engine, whatever --dtype and --engine say
    args.engine = document.get("engine", "eager")
    recorded = CostProfile.from_dict(document, str(path))
    reference = recorded.document["reference_context"]
    pair = pair_from_arguments(args)
    now = profile_pair(
        pair.target, pair.draft, max_verify=1, contexts=(reference,), reference_context=reference, repetitions=args.repetitions, prefill_lengths=()
    )  # the steps only
    steps = {"target step": (now.target_step_ms, recorded.target_step_ms), "draft step": (now.draft_ms[0], recorded.draft_seconds(reference) * 1e3)}
    worst = 0.0
    for name, (here, there) in steps.items():
        ratio = here / there
        worst = max(worst, abs(ratio - 1.0))
        print(f"{name} at context {reference}: {here:.2f} ms here now, {there:.2f} ms in {path} ({ratio:.2f}x)")
    print(f"c here now {now.c:.4f}, in the profile {recorded.c:.4f}; profile measured {document.get('measured_at', '?')}")
    if worst > args.speed_tolerance:
        print(f"this machine runs at another speed than {path} says (beyond ±{args.speed_tolerance:.0%}): re-measure the profile before judging policies by it")
        return 1
    print(f"within ±{args.speed_tolerance:.0%} of {path}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Measure draft and verification costs of a pair on this machine and write the JSON profile."""
    if args.check is None:
        check_output_file(args.out, "--out")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.speed and not args.check:
        raise ValueError("--speed goes with --check FILE")
    if args.speed_tolerance <= 0:
        raise ValueError(f"--speed-tolerance must be above 0 (a relative difference, e.g. 0.25), got {args.speed_tolerance}")
    if args.check:
        same = _check_profile(Path(args.check), args.device)
        return _check_speed(Path(args.check), args) if same == 0 and args.speed else same
    pair = pair_from_arguments(args)
    if args.batches:
        return _profile_batches(pair, args)
    contexts = tuple(int(x) for x in args.contexts.split(","))
    profile = profile_pair(
        pair.target,
        pair.draft,
        max_verify=args.max_verify,
        contexts=contexts,
        reference_context=args.reference_context,
        repetitions=args.repetitions,
        tree_mask=args.tree_mask,
    ).with_metadata(pair=pair.name)
    profile.save(args.out)
    document, hw = profile.document, profile.hardware
    setting = f"{document['dtype']}, engine {document['engine']}, {hw['processor']} ({hw['torch_threads']} threads)"
    print(f"pair {pair.name}, {setting}, {args.repetitions} repetitions, medians")
    print(f"target step {profile.target_step_ms:.2f} ms, draft step {document['draft_step_ms']:.2f} ms at context {args.reference_context}")
    rows = []
    for gamma in range(0, args.max_verify):
        point = document["verify"][str(args.reference_context)][str(gamma + 1)]
        rows.append([gamma, gamma + 1, f"{point['median_ms']:.2f}", f"{point['p25_ms']:.2f}-{point['p75_ms']:.2f}", f"{profile.g[gamma]:.3f}"])
    print(format_table(["gamma", "tokens verified", "verify ms", "IQR ms", "g(gamma)"], rows))
    by_context = [[ctx, f"{document['draft_step'][str(ctx)]['median_ms']:.2f}", f"{document['verify'][str(ctx)]['1']['median_ms']:.2f}"] for ctx in contexts]
    print(format_table(["context", "draft step ms", "target step ms"], by_context))
    catch_up = document.get("draft_catch_up", {}).get(str(args.reference_context), [])
    if catch_up:
        steps = ", ".join(f"n={n} {p['median_ms']:.2f}" for n, p in enumerate(catch_up, 1))
        print(f"a round's first draft step after a verification that emitted n tokens, ms: {steps}")
    if "round_work" in document:
        work = document["round_work"]
        print(
            f"the decoder's own work per round (outside forwards, {work['rounds']} rounds fitted): drafting {work['draft_fixed_ms']:.3f} + "
            f"{work['draft_token_ms']:.3f}/token ms, verifying {work['verify_fixed_ms']:.3f} + {work['verify_token_ms']:.3f}/token ms"
        )
    if "tree_round_work" in document:
        work = document["tree_round_work"]
        print(
            f"a tree round (branching {work['branching']}, width {work['width']}; {work['rounds']} rounds fitted): each later level's draft forward "
            f"{work['level_forward_ms']:.2f} ms; the tree decoder's own work: growing {work['draft_fixed_ms']:.3f} + {work['draft_level_ms']:.3f}/level ms, "
            f"verifying {work['verify_fixed_ms']:.3f} + {work['verify_node_ms']:.3f}/node ms"
        )
    if "prefill" in document:
        prefill = document["prefill"]
        fits = ", ".join(f"{kind} {prefill[kind]['fixed_ms']:.2f} + {prefill[kind]['token_ms']:.3f}/token ms" for kind in ("plain", "speculative"))
        print(f"a generation's prefill and set-up (prompts of {', '.join(map(str, prefill['lengths']))} tokens): {fits}")
    print(f"c = {profile.c:.4f}   profile written to {args.out}")
    return 0


def _trace_file(name: str) -> Path:
    """A shipped split's chain traces by name (train, val), or a trace file."""
    return Path(name) if name.endswith(".npz") else default_traces(name)


def cmd_fit_acceptance(args: argparse.Namespace) -> int:
    """Fit the acceptance predictor on training traces, check its calibration on held-out ones, and price SpecDec++'s
    rule over a grid of thresholds in replay on the training side (train and val; test chooses nothing)."""
    if not 1 <= args.max_depth <= 16:
        raise SystemExit(f"--max-depth must lie in 1..16, got {args.max_depth}")
    thresholds = [float(h) for h in args.thresholds.split(",")]
    if not all(0 < h < 1 for h in thresholds):
        raise SystemExit(f"--thresholds must lie in (0, 1), got {args.thresholds}")
    loaded = {name: TraceSet.load(_trace_file(name)) for name in dict.fromkeys([*args.traces, *args.tune, args.check])}
    fitting = {name: loaded[name] for name in args.traces}
    tuning = {name: loaded[name] for name in args.tune}
    checking = loaded[args.check]
    predictor = fit_predictor(list(fitting.values()), args.max_depth)
    predictor.save(args.out)
    checked = calibration(predictor, checking, args.max_depth)
    profile = CostProfile.load(args.profile)
    speeds = sweep_thresholds(tuning, profile, predictor, thresholds, args.max_depth, args.decision_seconds)
    fitted = predictor.metadata
    print(f"predictor fitted on {', '.join(args.traces)} ({fitted['examples']:,} drafted steps, {fitted['accepted']:.3f} accepted) -> {args.out}")
    rows = [[key, f"{checked[key]['brier']:.4f}", f"{checked[key]['log_loss']:.4f}", f"{checked[key]['ece']:.4f}"] for key in ("predictor", "top1")]
    print(f"calibration on {args.check} ({checked['examples']:,} drafted steps):")
    print(format_table(["P(accepted) from", "Brier", "log-loss", "ECE"], rows))
    best = max((name for name in speeds if name.startswith("specdec")), key=lambda name: speeds[name]["all"])
    reference = speeds["confidence:0.4"]["all"]
    table = [[name, *(f"{speeds[name][split]:.1f}" for split in [*tuning, "all"]), f"{speeds[name]['all'] / reference:.3f}"] for name in speeds]
    print(f"replay, tokens per modelled second (profile {args.profile}):")
    print(format_table(["policy", *tuning, "all", "/ confidence:0.4"], table))
    print(f"best threshold on {', '.join(args.tune)}: {best}")
    if args.report:
        report = Path(args.report)
        report.parent.mkdir(parents=True, exist_ok=True)
        document = {"predictor": str(args.out), "traces": args.traces, "tune": args.tune, "check": args.check}
        document |= {"calibration": checked, "replay": speeds, "best": best}
        report.with_suffix(".json").write_text(json.dumps(document | {"profile": str(args.profile), "max_depth": args.max_depth}, indent=1))
        plot_calibration(checked, report.with_suffix(".png"))
        print(f"report: {report.with_suffix('.json')}, reliability diagram: {report.with_suffix('.png')}")
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    """Record replay traces of a pair on a workload split (chains; with --tree, trees along the chains' outputs)."""
    if args.depth < 1 or args.max_new_tokens < 2:
        raise ValueError(f"--depth must be >= 1 and --max-new-tokens >= 2, got {args.depth} and {args.max_new_tokens}")
    if args.tree and args.temperature > 0:
        raise ValueError(
            "--tree follows the outputs of a chain trace file and keeps their sampling: for trees at T > 0, give sampled chain traces "
            "(--outputs data/traces/PAIR-SPLIT-t0.7.npz, recorded with --temperature 0.7) and drop --temperature"
        )
    if args.copy and (args.tree or args.temperature > 0):
        raise ValueError("--copy records greedy chain traces (copy replay is greedy, chains only); drop --tree / --temperature")
    if not (args.pair or args.target):
        args.pair = "smollm2-135m"
    if args.out:
        check_output_file(args.out, "--out")  # before the recording, not after it
    if args.tree and wants_ray(args.workers, args.address):
        raise ValueError("--workers / --address shard chain recording; record tree traces in one process (drop them)")
    name = pair_name(args)
    start = time.perf_counter()
    if args.tree:
        pair = pair_from_arguments(args)
        shape = TreeShape.parse(args.tree)
        source = args.outputs or TRACES / f"{name}-{args.split}{engine_suffix(args.engine)}.npz"
        traces = record_tree_traces(
            pair,
            name,
            source,
            split=args.split,
            dtype=args.dtype,
            shape=shape,
            depth=args.depth,
            lang=args.lang,
            per_language=args.per_language,
            limit=args.limit,
        )
        sampled = f"-t{traces.temperature:g}" if traces.temperature > 0 else ""
        out = Path(args.out or TRACES / f"{name}-{args.split}-tree{sampled}{engine_suffix(args.engine)}.npz")
        traces.save(out)
        print(
            f"{len(traces)} prompts, {int(traces.offsets[-1])} positions, k={shape.branching} W={shape.width} V={shape.size} depth {args.depth}, "
            f"on-path nodes per position {traces.on_path.sum(axis=1).mean():.3f}, {time.perf_counter() - start:.0f} s -> {out} "
            f"({out.stat().st_size / 1e6:.1f} MB)"
        )
        return 0
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    prompts = select_prompts(args.split, args.lang, args.per_language, args.limit, TASK_GROUPS.get(args.task, args.task))
    settings = {
        "split": args.split,
        "dtype": args.dtype,
        "depth": args.depth,
        "max_new_tokens": args.max_new_tokens,
        "sampling": sampling,
        "outputs": args.outputs,
        "profile": args.profile,
        "seed": args.seed,
        "samples": args.samples,
        "copy": CopyDraft() if args.copy else None,
    }
    if wants_ray(args.workers, args.address):
        load = functools.partial(
            pair_from_arguments, argparse.Namespace(**{k: getattr(args, k) for k in ("pair", "target", "draft", "dtype", "device", "engine")})
        )
        traces = record_chains_sharded(load, name, prompts, workers=args.workers, address=args.address, **settings)
    else:
        traces = record_chains(pair_from_arguments(args), name, prompts, **settings)
    task = f"-{args.task}" if args.task not in (None, "all") else ""
    suffix = task + ("" if sampling.is_greedy else f"-t{args.temperature:g}") + ("-copy" if args.copy else "") + engine_suffix(traces.metadata["engine"])
    out = Path(args.out or TRACES / f"{name}-{args.split}{suffix}.npz")
    traces.save(out)
    summary = f"mean acceptance probability {traces.accept_prob.mean():.3f}" if traces.sampled else f"mean m(t) {traces.match.mean():.3f}"
    if traces.copy is not None:
        summary += f", copy drafter: mean match {traces.copy.match.mean():.3f}, proposes at {(traces.copy.available > 0).mean():.0%} of positions"
    print(
        f"{len(traces)} prompts, {int(traces.offsets[-1])} positions, K={args.depth}, {sampling.describe()}, {summary}, "
        f"{traces.metadata['repaired_outputs']} given outputs repaired, {time.perf_counter() - start:.0f} s -> {out} "
        f"({out.stat().st_size / 1e6:.1f} MB)"
    )
    return 0


def warn_if_emulated_bf16(dtype: str, flag: str) -> None:
    """Say so when bfloat16 is asked for on a CPU that would only emulate it (several times slower than float32)."""
    if dtype == "bfloat16" and not bf16_matmuls():
        logging.warning(
            "%s bfloat16 on a CPU without native bf16 (no avx512_bf16/amx_bf16 flag): it runs emulated, several times slower "
            "than float32 (5.6x for the teacher forward on a 2-core AMD EPYC); %s float32 is the fast choice on this machine",
            flag,
            flag,
        )


def cmd_distill_data(args: argparse.Namespace) -> int:
    """The target's own responses to the draft-training prompt pool, in resumable shards (hours: background)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    prompts = [json.loads(line) for line in Path(args.pool).read_text().splitlines()]
    if args.lang:
        prompts = [p for p in prompts if p["lang"] in args.lang]
    warn_if_emulated_bf16(args.dtype, "--dtype")
    generate_shards(
        prompts,
        Path(args.out),
        temperature=args.temperature,
        dtype=DTYPES[resolve_dtype(args.dtype)],
        batch_size=args.batch_size,
        shard_size=args.shard_size,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    return 0


def cmd_chat_prompts(args: argparse.Namespace) -> int:
    """General-chat requests for the draft pool: expanded seeds, then English turns the target writes (hours: background)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path(args.out)
    if not args.report:
        warn_if_emulated_bf16(args.dtype, "--dtype")
        model, tokenizer = load_target_for_generation(DTYPES[resolve_dtype(args.dtype)])
        engine = LeanLlama(model, "model")
        held_out = [p["prompt"] for split in ("val", "test") for p in load_prompts(split) if len(p["prompt"]) > 40]
        avoid = [json.loads(line)["prompt"] for line in CHAT_TEST.read_text().splitlines()]
        write_chat_prompts(engine, tokenizer, out, magpie=args.magpie, held_out=held_out, avoid=avoid, batch_size=args.batch_size, seed=args.seed)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    report = diversity(rows)
    columns = ["requests", "mean_chars", "distinct_1", "distinct_2"]
    print(format_table(["lang", "source", *columns], [[*key, f"{r['requests']:,}", *(f"{r[c]:.3g}" for c in columns[1:])] for key, r in report.items()]))
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    """Train a draft for the default target on its own responses to the draft-training prompts (long: run
    it in the background; rerun with the same --out to continue): a standalone model or an EAGLE-3 head."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    kind = Eagle3Kind(args.ttt_steps) if args.kind == "eagle3" else StandaloneKind(args.layers, args.init)
    warn_if_emulated_bf16(args.target_dtype, "--target-dtype")
    target, tokenizer = load_target("smollm2-135m", args.target_dtype)
    config = TrainingConfig(
        draft_vocab_size=args.vocab, steps=args.steps, batch_size=args.batch_size, learning_rate=args.learning_rate, seed=args.seed, max_length=args.max_length
    )
    features = None if args.feature_cache == "none" else Path(args.feature_cache)
    also = {}
    if args.measure_split != "none":  # what the policies will see: the workload's prompts, never the draft's
        rows = load_prompts(args.measure_split)
        prompts = {p["id"]: p["prompt"] for p in rows}
        traces = TraceSet.load(TRACES / f"smollm2-135m-{args.measure_split}.npz")
        also[args.measure_split] = workload_sequences(traces, prompts, tokenizer, args.measure_per_language)
        copy_traces = TRACES / f"smollm2-135m-{args.measure_split}-copy.npz"  # they also hold the copy-heavy prompts
        if copy_traces.is_file():
            copy_heavy = {p["id"]: p["prompt"] for p in rows if p["task"] in COPY_TASKS}
            also[f"{args.measure_split} copy-heavy"] = workload_sequences(TraceSet.load(copy_traces), copy_heavy, tokenizer, args.measure_per_language)
    print(json.dumps(train_draft(kind, target, tokenizer, Path(args.data), Path(args.out), config, features, not args.read_cache_only, also), indent=1))
    return 0


def register(commands) -> None:
    """Add this module's subcommands to the ``adaptive`` parser."""
    prof = add_command(commands, "profile")
    add_pair_arguments(prof)
    add_engine_argument(prof)
    prof.add_argument("--out", default="profiles/profile.json", help="where to write the JSON profile")
    prof.add_argument("--max-verify", type=int, default=32, help="largest number of tokens verified at once")
    prof.add_argument("--contexts", default="64,128,512", help="context lengths to measure at")
    prof.add_argument("--reference-context", type=int, default=128, help="context at which c and g are summarised")
    prof.add_argument("--repetitions", type=int, default=7)
    prof.add_argument("--tree-mask", action="store_true", help="time verifications as tree decoding runs them (explicit tree attention mask)")
    prof.add_argument("--threads", type=int, help="torch CPU threads to measure with (default: torch's own choice)")
    prof.add_argument(
        "--batches",
        help="instead: the batched decoder's forwards at these batch sizes (e.g. 1,2,4,8; --max-verify tokens per row, at --reference-context)",
    )
    prof.add_argument("--check", metavar="FILE", help="instead: exit 1 naming what differs unless FILE (any profile) was measured on hardware like this")
    prof.add_argument(
        "--speed",
        action="store_true",
        help="with --check: also time the pair's target and draft steps now (at FILE's precision and reference context, --repetitions "
        "times) and exit 1 when either differs from FILE's by more than --speed-tolerance",
    )
    prof.add_argument("--speed-tolerance", type=float, default=0.25, help="relative difference --speed allows (default 0.25)")
    prof.set_defaults(func=cmd_profile)

    fit = add_command(commands, "fit-acceptance")
    fit.add_argument("--traces", nargs="+", default=["train"], help="traces to fit on: shipped split names or .npz files (default train)")
    fit.add_argument("--check", default="val", help="held-out traces for the calibration check (default val)")
    fit.add_argument("--tune", nargs="+", default=["train", "val"], help="traces the thresholds are priced on in replay (default train val; never test)")
    fit.add_argument("--max-depth", type=int, default=8, help="drafted steps per position used (default 8)")
    fit.add_argument("--profile", default=str(DEFAULT_PROFILE), help="cost profile replay prices the thresholds with")
    fit.add_argument("--thresholds", default="0.3,0.5,0.6,0.7,0.8,0.9", help="SpecDec++ rejection thresholds to price")
    fit.add_argument("--decision-seconds", type=float, default=1e-4, help="charged per decision of the rule in replay (it reads the draft's features)")
    fit.add_argument("--out", default=str(SHIPPED), help="predictor JSON (default: the one specdec uses)")
    fit.add_argument("--report", help="also write REPORT.json (calibration, replay) and REPORT.png (reliability diagram)")
    fit.set_defaults(func=cmd_fit_acceptance)

    rec = add_command(commands, "record")
    add_pair_arguments(rec)
    add_engine_argument(rec)
    rec.add_argument("--split", default="train", choices=["train", "val", "test"])
    rec.add_argument("--lang", choices=LANGUAGES, help="only this language")
    rec.add_argument("--limit", type=int, help="only the first N prompts")
    rec.add_argument("--per-language", type=int, help="only the first N prompts of each language")
    rec.add_argument(
        "--task",
        choices=[*TASKS, *TASK_GROUPS],
        help="only this task type (copy-heavy: the four whose answers copy the prompt; all: every type, taking turns in each language)",
    )
    rec.add_argument("--copy", action="store_true", help="also record the copy drafter's chains at every position (chains)")
    rec.add_argument("--depth", type=int, default=16, help="K: draft steps recorded per position (default 16)")
    rec.add_argument("--max-new-tokens", type=int, default=128)
    rec.add_argument(
        "--outputs",
        help="known greedy outputs to reuse (checked by one teacher-forced forward, regenerated from the first token that disagrees): "
        "a JSONL of {id, response} rows or a folder of them, e.g. from adaptive distill-data --pool data/workload/prompts.jsonl --out DIR",
    )
    rec.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0: sampled outputs and their acceptance probabilities")
    rec.add_argument("--top-k", type=int, default=None)
    rec.add_argument("--top-p", type=float, default=1.0)
    rec.add_argument("--seed", type=int, default=0, help="seed of the sampled outputs and drafts (T > 0)")
    rec.add_argument("--samples", type=int, default=1, help="T > 0: sampled outputs recorded per prompt (default 1)")
    rec.add_argument("--profile", help="cost profile to note in the metadata (default profiles/PAIR.json)")
    rec.add_argument(
        "--tree",
        metavar="K,W,V",
        help="record draft-tree traces along the outputs of the split's chain traces, greedy or sampled (--outputs FILE.npz, "
        "default data/traces/PAIR-SPLIT[-ENGINE].npz; sampled ones write PAIR-SPLIT-tree-tT.npz); V is the default verified nodes; "
        "--depth = tree levels",
    )
    rec.add_argument(
        "--out",
        help="trace file (default data/traces/PAIR-SPLIT.npz, or PAIR-SPLIT-tree.npz with --tree; ending -ENGINE.npz when "
        "recorded on another engine than eager, e.g. PAIR-SPLIT-compiled-int4.npz)",
    )
    add_worker_arguments(rec, "prompts")
    rec.set_defaults(func=cmd_record)

    data = add_command(commands, "distill-data")
    data.add_argument("--pool", default=str(POOL), help="draft-training prompts (scripts/build_draft_pool.py)")
    data.add_argument("--out", default=str(SHARDS), help="shard folder (rerun to continue; default: the committed shards)")
    data.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; the head trains on both greedy and T = 0.7 shards")
    data.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="bfloat16", help="auto: bfloat16 where the CPU multiplies it natively")
    data.add_argument("--lang", nargs="+", choices=LANGUAGES, help="only the prompts in these languages (default: all)")
    data.add_argument("--batch-size", type=int, default=64)
    data.add_argument("--shard-size", type=int, default=512)
    data.add_argument("--max-new-tokens", type=int, default=128)
    data.add_argument("--seed", type=int, default=0)
    data.set_defaults(func=cmd_distill_data)

    chat = add_command(commands, "chat-prompts")
    chat.add_argument("--out", default=str(CHAT_POOL), help="JSONL the turns are appended to (rerun to continue)")
    chat.add_argument("--magpie", type=int, default=12_000, help="English turns the target writes itself, after the expanded seeds (23,040)")
    chat.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="bfloat16", help="auto: bfloat16 where the CPU multiplies it natively")
    chat.add_argument("--batch-size", type=int, default=64)
    chat.add_argument("--seed", type=int, default=0)
    chat.add_argument("--report", action="store_true", help="only print how diverse the turns in --out are")
    chat.set_defaults(func=cmd_chat_prompts)

    dist = add_command(commands, "distill")
    dist.add_argument("--kind", choices=["standalone", "eagle3"], default="standalone", help="standalone 2-layer model (default) or EAGLE-3 head")
    dist.add_argument("--out", required=True, help="folder for the draft, its checkpoint and log (rerun to continue)")
    dist.add_argument("--data", default=str(SHARDS), help="response shards (adaptive distill-data)")
    dist.add_argument("--steps", type=int, default=4000, help="optimiser steps in all (cosine schedule over them)")
    dist.add_argument("--batch-size", type=int, default=8)
    dist.add_argument("--learning-rate", type=float, default=5e-4, help="peak AdamW learning rate")
    dist.add_argument("--vocab", type=int, default=8192, help="size of the draft vocabulary (benchmarks/draft_vocabulary.py measures coverage per size)")
    dist.add_argument("--max-length", type=int, default=320, help="tokens per training sequence, prompt + response (512 keeps 256-token answers)")
    dist.add_argument("--target-dtype", choices=["bfloat16", "float32"], default="bfloat16", help="dtype of the target's forward")
    dist.add_argument(
        "--feature-cache",
        default=str(cache_root() / "features"),
        help="folder for the target's features on local disk, read instead of recomputed after the first epoch (none: recompute)",
    )
    dist.add_argument(
        "--read-cache-only",
        action="store_true",
        help="use the features another training fills in the cache, never write them (two trainings at once share one cache)",
    )
    dist.add_argument(
        "--measure-split",
        choices=["val", "test", "none"],
        default="val",
        help="also measure the draft at each checkpoint on this workload split's prompts and greedy outputs, and apart on its copy-heavy prompts (default val)",
    )
    dist.add_argument("--measure-per-language", type=int, default=16, help="prompts per language of --measure-split")
    dist.add_argument("--ttt-steps", type=int, default=7, help="eagle3: draft steps unrolled in training")
    dist.add_argument("--layers", type=int, default=2, help="standalone: transformer layers, initialised from the target's first")
    dist.add_argument("--init", help="standalone: start from this saved draft folder (keeps its layers and vocabulary)")
    dist.add_argument("--seed", type=int, default=0)
    dist.set_defaults(func=cmd_distill)
