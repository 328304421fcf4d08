"""Which floating-point precision this machine multiplies fastest: bfloat16 where the hardware has native
bf16 matrix instructions (a GPU, or a CPU with AVX512-BF16 or AMX-BF16), else float32."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
DEFAULT_DTYPE = "auto"
"""The precision every loader, CLI command and experiment uses unless told otherwise (see :func:`resolve_dtype`)."""
CHOICES = (DEFAULT_DTYPE, "float32", "bfloat16", "float16")
"""The precisions ``--dtype`` and an experiment's ``dtype`` accept (float64 is for tests, through the Python API)."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as ``/proc/cpuinfo`` lists them (empty where it cannot be read)."""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(flags.partition(":")[2].split())


@functools.cache
def bf16_matmuls(device: str = "cpu") -> bool:
    """True where bf16 matrix products run natively (on CPUs: the ``avx512_bf16`` or ``amx_bf16`` flag)."""
    if device.startswith("cuda"):
        return torch.cuda.is_available()
    return any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)


def resolve_dtype(name: str, device: str = "cpu") -> str:
    """``auto`` -> ``bfloat16`` where :func:`bf16_matmuls`, else ``float32``; any other name is checked and returned."""
    if name == "auto":
        return "bfloat16" if bf16_matmuls(device) else "float32"
    if name not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {sorted(DTYPES)}, got {name!r}")
    return name
