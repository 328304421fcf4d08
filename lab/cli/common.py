"""What several commands share: pair arguments, and the per-round and summary tables of a generation."""

from __future__ import annotations

import argparse
from pathlib import Path

from adaptive.engines import AUTO, DEFAULT_ENGINE, ENGINES, use_engine
from adaptive.generation import GenerationResult
from adaptive.pair import COPY, PAIRS, ModelPair, load_copy_pair, load_pair, load_pair_from_paths
from adaptive.precision import CHOICES as DTYPE_CHOICES
from adaptive.precision import DEFAULT_DTYPE
from adaptive.tree import TreeShape
from lab.report import format_table


def floats(text: str) -> tuple[float, ...]:
    """argparse type: comma-separated numbers."""
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from error


def tree_shape(spec: str) -> TreeShape:
    """argparse type: a draft tree shape ``k,W,V`` (:meth:`TreeShape.parse`, its message kept)."""
    try:
        return TreeShape.parse(spec)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", help=f"a named pair: {', '.join(PAIRS)}")
    parser.add_argument("--target", help="folder (or hub id) of the target model, instead of --pair")
    parser.add_argument(
        "--draft",
        help=f"folder of the draft model (same tokenizer) or an EAGLE-3 head, with --target; or {COPY!r}: the model-free copy drafter, with --pair or --target",
    )
    parser.add_argument(
        "--dtype",
        default=DEFAULT_DTYPE,
        choices=DTYPE_CHOICES,
        help="model precision (default auto: bfloat16 where this machine multiplies bf16 natively, else float32)",
    )
    parser.add_argument("--device", default="cpu")


def add_engine_argument(parser: argparse.ArgumentParser) -> None:
    """--engine: the forward every decoder of the command runs (:data:`adaptive.engines.ENGINES`)."""
    parser.add_argument(
        "--engine",
        default=DEFAULT_ENGINE,
        choices=[AUTO, *ENGINES],
        help="the target's (and a standalone draft's) forward: auto (the default: compiled-int4 where it runs, else eager; "
        "it says which), eager (transformers' own forward, for debugging), lean (fused products, "
        "preallocated cache), lean-int8 or lean-int4 (weight-only low-bit products; int4 holds the shipped Q4_1 weights, "
        "multiplied by the project's AVX512-BF16 kernel where the CPU has it; lean-int4-aten: on torch's kernel); "
        "compiled, compiled-int8, compiled-int4, compiled-int4-aten: the same with the one-token step and verifications "
        "of up to 16 tokens compiled by inductor (about a minute "
        "the first time, seconds once cached); an EAGLE-3 head follows (int8 under the low-bit engines, its draft step "
        "compiled under the compiled ones); the batched decoder runs the lean forward uncompiled",
    )


def add_worker_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """--workers and --address: run the command's independent tasks on Ray (:mod:`lab.scale`)."""
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help=f"split the {what} across N Ray workers (a local Ray with N CPUs; needs the scale extra); default 1: in this process",
    )
    parser.add_argument("--address", help="a running Ray cluster (ray start --head) instead of a local one; default $RAY_ADDRESS")


def pair_from_arguments(args: argparse.Namespace) -> ModelPair:
    """The pair named by --pair (its target with the copy drafter under --draft copy), or the one given by
    --target and --draft; run through --engine where the command has it."""
    if args.pair:
        if args.draft not in (None, COPY):
            raise ValueError(f"--pair {args.pair} brings its own draft; with --pair, --draft may only be {COPY!r} (got {args.draft!r})")
        pair = (load_copy_pair if args.draft == COPY else load_pair)(args.pair, args.dtype, args.device)
    elif not (args.target and args.draft):
        raise ValueError("give --pair NAME, or both --target PATH and --draft PATH")
    else:
        pair = load_pair_from_paths(args.target, args.draft, args.dtype, args.device)
    args.engine = use_engine((pair.target, pair.draft), getattr(args, "engine", "eager"))  # auto resolved: what ran is what is recorded
    return pair


def pair_name(args: argparse.Namespace) -> str:
    """The name trace and profile files are called by: the pair's, or the draft folder's."""
    if args.draft == COPY:
        return f"{args.pair or Path(args.target).name}-{COPY}"
    return args.pair or Path(args.draft).name


def print_rounds(result: GenerationResult) -> None:
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


def summary_row(label: str, result: GenerationResult) -> list:
    return [
        label,
        len(result.token_ids),
        len(result.rounds),
        f"{result.mean_emitted:.2f}",
        f"{result.acceptance_rate:.3f}",
        f"{result.total_time:.3f}",
        f"{result.tokens_per_second:.1f}",
    ]
