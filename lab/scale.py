"""Work that outgrows one process: independent tasks as Ray tasks, or one after another in this process.

``workers`` > 1 (or an ``address``) runs each task as a Ray task of one CPU: on a local Ray started here
with ``workers`` CPUs, or on the cluster at ``address`` / ``RAY_ADDRESS`` (``ray start --head`` on the head
node; every node needs the project installed at the same path). Otherwise the tasks run here, in order.
Ray is the optional extra ``scale`` (``pip install -e ".[scale]"``).

A Ray task runs in a worker process with one CPU (Ray sets its torch threads to 1) and in the driver's
working directory when that exists there, so relative paths (data/, runs/) mean the same as here. A local
Ray's workers run at this process's priority (``RAY_worker_niceness`` 0 unless set; Ray's default is 15).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm


def wants_ray(workers: int, address: str | None) -> bool:
    """True when the tasks go to Ray: several workers, or a cluster address (given or in ``RAY_ADDRESS``)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    return workers > 1 or bool(address or os.environ.get("RAY_ADDRESS"))


def _ray():
    try:
        import ray
    except ImportError as error:
        raise RuntimeError('--workers > 1 and --address need Ray: pip install -e ".[scale]" (or drop them to run in this process)') from error
    return ray


def _in_folder(folder: str, function: Callable, argument) -> Any:
    if os.path.isdir(folder):
        os.chdir(folder)
    return function(argument)


def parallel_map(function: Callable[[Any], Any], arguments: Sequence, workers: int = 1, address: str | None = None, desc: str = "tasks") -> list:
    """``function(a)`` for every ``a`` of ``arguments``, results in their order, with a progress bar over
    finished tasks. ``function`` must be importable by name (a module-level function) for Ray workers."""
    if not wants_ray(workers, address):
        return [function(argument) for argument in tqdm(arguments, desc=desc, unit="task")]
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        cluster = address or os.environ.get("RAY_ADDRESS")
        options = {"address": cluster} if cluster else {"num_cpus": workers, "include_dashboard": False}
        if not cluster:  # Ray runs workers at nice 15; here they are the work, on equal terms with this process
            os.environ.setdefault("RAY_worker_niceness", "0")
        ray.init(**options, configure_logging=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(_in_folder)
        pending = {task.remote(os.getcwd(), function, argument): index for index, argument in enumerate(arguments)}
        results: list = [None] * len(arguments)
        with tqdm(total=len(arguments), desc=f"{desc} on Ray", unit="task") as progress:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for reference in done:
                    results[pending.pop(reference)] = ray.get(reference)
                    progress.update()
        return results
    finally:
        if started_here:
            ray.shutdown()
