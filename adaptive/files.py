"""Reading the files users share (policies, traces, heads, profiles, training state) without running code.

Every reader here names the file and what was expected when it cannot read it, and none unpickles: JSON,
safetensors, ``.npz`` of plain arrays (``allow_pickle=False``). The errors are :class:`UnreadableFile`, a
``ValueError``, so the command line reports them as one line.
"""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file


class UnreadableFile(ValueError):
    """A file is missing, damaged or not of the kind expected; the message names it."""


def _existing(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise UnreadableFile(f"{what} {path} does not exist")
    if not path.is_file():
        raise UnreadableFile(f"{what} {path} is not a file")
    return path


def read_json(path: str | Path, what: str) -> dict:
    """A JSON object from ``path`` (``what`` names the kind of file in errors)."""
    path = _existing(path, what)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UnreadableFile(f"{what} {path} is not UTF-8 text (JSON expected)") from None
    except json.JSONDecodeError as error:
        raise UnreadableFile(f"{what} {path} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}") from None
    if not isinstance(document, dict):
        raise UnreadableFile(f"{what} {path} must hold a JSON object, found {type(document).__name__}")
    return document


def read_tensors(path: str | Path, what: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (never unpickles)."""
    path = _existing(path, what)
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as error:
        raise UnreadableFile(f"{what} {path} is not a readable safetensors file ({error})") from None


def read_arrays(path: str | Path, what: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, read in full now (never unpickles: an array of Python objects is refused)."""
    path = _existing(path, what)
    name = "?"
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise UnreadableFile(f"{what} {path} is a single array, not an .npz archive")
            arrays = {}
            for name in data.files:
                arrays[name] = data[name]
            return arrays
    except UnreadableFile:
        raise
    except ValueError as error:
        if "allow_pickle" in str(error):
            where = f"its array {name!r} holds" if name != "?" else "it holds"
            raise UnreadableFile(f"{what} {path} is refused: {where} pickled Python objects, and loading them could run code") from None
        raise UnreadableFile(f"{what} {path} is not a readable .npz file ({error})") from None
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error, KeyError) as error:
        raise UnreadableFile(f"{what} {path} is not a readable .npz file (damaged or cut short: {error})") from None


def load_weights(module: torch.nn.Module, tensors: dict[str, torch.Tensor], path: str | Path, what: str) -> None:
    """Load ``tensors`` into ``module`` strictly: every weight present, none extra, every shape right."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    wrong = [f"{k} {tuple(tensors[k].shape)} (expected {tuple(v.shape)})" for k, v in expected.items() if k in tensors and tensors[k].shape != v.shape]
    if missing or unexpected or wrong:
        problems = [("missing", ", ".join(missing)), ("unexpected", ", ".join(unexpected)), ("wrong shape", "; ".join(wrong))]
        raise UnreadableFile(f"{what} {path} does not match: {'; '.join(f'{kind} {names}' for kind, names in problems if names)}")
    module.load_state_dict(tensors)
