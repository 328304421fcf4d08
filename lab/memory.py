"""Peak memory of a piece of work: on CUDA the peak memory allocated by torch on the device; on CPU the
process's peak resident set (Linux: reset by writing 5 to /proc/self/clear_refs, read from VmHWM).
``None`` where neither can be measured."""

from __future__ import annotations

from pathlib import Path

import torch

_STATUS, _CLEAR = Path("/proc/self/status"), Path("/proc/self/clear_refs")


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.mib``."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.mib: float | None = None
        self._measurable = True

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                _CLEAR.write_text("5")
            except OSError:
                self._measurable = False
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mib = torch.cuda.max_memory_allocated(self.device) / 2**20
        elif self._measurable:
            kib = _peak_resident_kib()
            self.mib = kib / 1024 if kib is not None else None


def _peak_resident_kib() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None
