"""The forwards a command can run its models through (``--engine``): transformers' eager one or a lean one
(:mod:`adaptive.lean`), its EAGLE-3 heads following (:mod:`adaptive.lean_head`)."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedModel

from adaptive.eagle3 import Eagle3Head
from adaptive.lean import make_lean
from adaptive.lean_head import HEAD_WEIGHTS, lean_head

ENGINES = {
    "eager": None,
    "lean": ("model", False),
    "lean-int8": ("int8", False),
    "lean-int4": ("int4", False),
    "compiled": ("model", True),
    "compiled-int8": ("int8", True),
    "compiled-int4": ("int4", True),
}
"""What ``--engine`` takes: transformers' eager forward, or the lean one (weights, one-token step compiled)."""


def engine_of(model: object) -> str:
    """The :data:`ENGINES` name ``model`` runs through."""
    engine = getattr(model, "lean_engine", None)
    return "eager" if engine is None else next(name for name, kind in ENGINES.items() if kind == (engine.weights, engine.compiled))


def use_engine(models: Sequence[object], engine: str) -> None:
    """Run each of ``models`` that is a transformers Llama-layout model through ``engine`` (:data:`ENGINES`); each
    EAGLE-3 head drafts with a copy whose matrices are as :data:`HEAD_WEIGHTS` says for the engine's weights (under
    ``lean``, with the model's own weights, the head itself), its own-state step compiled under the compiled engines;
    distilled drafts and the copy drafter keep their own forward."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
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
