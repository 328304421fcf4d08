"""Precision: ``auto`` picks bfloat16 only where the CPU (or a GPU) multiplies bf16 natively."""

from __future__ import annotations

import pytest

from adaptive.precision import bf16_matmuls, resolve_dtype


def test_auto_precision_follows_the_cpu_flags():
    assert resolve_dtype("auto") == ("bfloat16" if bf16_matmuls() else "float32")
    assert resolve_dtype("float32") == "float32"
    with pytest.raises(ValueError, match="auto or one of"):
        resolve_dtype("fp8")
