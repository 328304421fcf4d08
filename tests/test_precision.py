"""Precision: ``auto`` picks bfloat16 only where the CPU (or a GPU) multiplies bf16 natively."""

from __future__ import annotations

import pytest

from adaptive.precision import bf16_matmuls, resolve_dtype
from lab.cli.data import warn_if_emulated_bf16


def test_auto_precision_follows_the_cpu_flags():
    assert resolve_dtype("auto") == ("bfloat16" if bf16_matmuls() else "float32")
    assert resolve_dtype("float32") == "float32"
    with pytest.raises(ValueError, match="auto or one of"):
        resolve_dtype("fp8")


def test_asking_for_bf16_where_it_is_emulated_says_so(caplog):
    """The distillation commands warn when bfloat16 would run emulated on this CPU, and only then."""
    with caplog.at_level("WARNING"):
        warn_if_emulated_bf16("float32", "--dtype")
        assert not caplog.records
        warn_if_emulated_bf16("bfloat16", "--target-dtype")
    assert bool(caplog.records) == (not bf16_matmuls())
    if caplog.records:
        assert "--target-dtype float32 is the fast choice" in caplog.text
