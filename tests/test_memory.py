"""Peak memory of a piece of work (CPU: the process's peak resident set, reset per measurement)."""

from __future__ import annotations

import numpy as np

from lab.memory import PeakMemory


def test_peak_memory_sees_a_temporary_allocation_and_resets_between_measurements():
    with PeakMemory("cpu") as big:
        block = np.ones(40_000_000)  # 305 MiB, touched
        del block
    with PeakMemory("cpu") as small:
        np.ones(1000).sum()
    assert big.mib is not None and small.mib is not None
    assert big.mib - small.mib > 250
