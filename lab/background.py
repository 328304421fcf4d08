"""Background data work (generation, distillation) steps aside while a live measurement runs.

A live measurement (:func:`live_measurement`, used by every live comparison and load test) leaves a marker
named by its process id in ``$ADAPTIVE_MEASURING_DIR`` (default ``runs/measuring``); long background jobs call
:func:`yield_to_measurements` between steps and wait while a marker of a running process exists. Markers of
processes that died are removed, so a killed measurement never holds the background work back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

POLL_SECONDS = 2.0


def measuring_folder() -> Path:
    """Where live measurements leave their markers."""
    return Path(os.environ.get("ADAPTIVE_MEASURING_DIR", "runs/measuring"))


@contextmanager
def live_measurement() -> Iterator[None]:
    """Mark this process as measuring live for the duration of the block."""
    folder = measuring_folder()
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / str(os.getpid())
    marker.touch()
    try:
        yield
    finally:
        marker.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def measurements_running() -> bool:
    """Whether another live process has a marker (markers of dead processes are removed)."""
    folder = measuring_folder()
    running = False
    for marker in folder.glob("*") if folder.is_dir() else []:
        pid = int(marker.name) if marker.name.isdigit() else -1
        if pid == os.getpid():
            continue
        if pid > 0 and _alive(pid):
            running = True
        else:
            marker.unlink(missing_ok=True)
    return running


def yield_to_measurements(sleep: Callable[[float], None] = time.sleep, say: Callable[[str], None] = tqdm.write) -> float:
    """Return once no live measurement runs (at once when none does); the seconds spent waiting."""
    if not measurements_running():
        return 0.0
    say(f"a live measurement runs ({measuring_folder()}): waiting")
    start = time.perf_counter()
    while measurements_running():
        sleep(POLL_SECONDS)
    waited = time.perf_counter() - start
    say(f"resumed after {waited:.0f} s")
    return waited
