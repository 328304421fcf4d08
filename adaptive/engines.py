"""The forwards a command can run its models through (``--engine``): transformers' eager one or a lean one
(:mod:`adaptive.lean`), its EAGLE-3 heads following (:mod:`adaptive.lean_head`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from torch._inductor.cpp_builder import get_cpp_compiler
from transformers import PreTrainedModel

from adaptive import lowbit_kernels
from adaptive.eagle3 import Eagle3Head
from adaptive.lean import GROUP, check_layout, make_lean
from adaptive.lean_head import HEAD_WEIGHTS, lean_head

ENGINES = {
    "eager": None,
    "lean": ("model", False),
    "lean-int8": ("int8", False),
    "lean-int4": ("int4", False),
    "lean-int4-aten": ("int4-aten", False),
    "compiled": ("model", True),
    "compiled-int8": ("int8", True),
    "compiled-int4": ("int4", True),
    "compiled-int4-aten": ("int4-aten", True),
}
"""What ``--engine`` takes: transformers' eager forward, or the lean one (weights, one-token step compiled)."""
AUTO = "auto"
DEFAULT_ENGINE = AUTO
"""What ``--engine``, experiment configs and the live entry points default to: :func:`resolve_engine` picks."""
FASTEST = "compiled-int4"
"""The engine ``auto`` picks where it can run (measured fastest here: benchmarks/results/engine-speed.md)."""


def resolve_engine(engine: str, target: PreTrainedModel) -> str:
    """The :data:`ENGINES` name ``engine`` stands for with ``target``: itself, or for ``auto`` :data:`FASTEST` where
    it runs (a Llama-layout model on the CPU whose products' input sizes are multiples of 32, and a C++ compiler for
    inductor; lean-int4 without one), else eager. What ``auto`` chose, and why, is said on stderr."""
    if engine != AUTO:
        if engine not in ENGINES:
            raise ValueError(f"engine must be {AUTO} or one of {', '.join(ENGINES)}, got {engine!r}")
        return engine
    obstacle = _lean_obstacle(target)
    if obstacle:
        chosen, why = "eager", obstacle
    elif not _has_cpp_compiler():
        chosen, why = "lean-int4", "no C++ compiler found for inductor (install g++ for compiled-int4)"
    else:
        kernel = "project's AVX512-BF16 kernels" if lowbit_kernels.obstacle() is None else f"torch's kernels: {lowbit_kernels.obstacle()}"
        chosen, why = FASTEST, f"int4 weights (the shipped Q4_1 grid) on the {kernel}, one-token step and verifications compiled"
    print(f"engine auto: {chosen} ({why}; --engine eager for transformers' own forward)", file=sys.stderr)
    return chosen


def _lean_obstacle(target: PreTrainedModel) -> str | None:
    """Why the int4 lean engine cannot run ``target``, or None."""
    if target.device.type != "cpu":
        return f"the model is on {target.device}; the int4 engine runs on the CPU"
    try:
        check_layout(target)
    except ValueError as error:
        return str(error).split(":")[0]
    config = target.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inputs = {config.hidden_size, config.intermediate_size, config.num_attention_heads * head_dim}
    if any(size % GROUP for size in inputs):
        return f"int4 needs product input sizes that are multiples of {GROUP}, this model has {sorted(inputs)}"
    return None


def _has_cpp_compiler() -> bool:
    try:
        get_cpp_compiler()
    except Exception:  # inductor raises its own error kinds when no compiler is found
        return False
    return True


def engine_of(model: object) -> str:
    """The :data:`ENGINES` name ``model`` runs through."""
    engine = getattr(model, "lean_engine", None)
    return "eager" if engine is None else next(name for name, kind in ENGINES.items() if kind == (engine.weights, engine.compiled))


def use_engine(models: Sequence[object], engine: str) -> str:
    """Run each of ``models`` that is a transformers Llama-layout model through ``engine`` (:data:`ENGINES`); each
    EAGLE-3 head drafts with a copy whose matrices are as :data:`HEAD_WEIGHTS` says for the engine's weights (under
    ``lean``, with the model's own weights, the head itself), its own-state step compiled under the compiled engines;
    distilled drafts and the copy drafter keep their own forward. ``auto``: as :func:`resolve_engine` says for the
    first of ``models`` (the target). Returns the engine used."""
    engine = resolve_engine(engine, models[0])
    for model in models:
        if isinstance(model, Eagle3Head):
            model.__dict__.pop("lean_engine", None)
            if ENGINES[engine] is not None and ENGINES[engine] != ("model", False):
                weights, compiled = ENGINES[engine]
                model.__dict__["lean_engine"] = lean_head(model, HEAD_WEIGHTS[weights], compiled)  # not a registered submodule: never saved or trained
        elif isinstance(model, PreTrainedModel):
            if ENGINES[engine] is None:
                model.__dict__.pop("lean_engine", None)
            else:
                make_lean(model, *ENGINES[engine])
    return engine
