"""Where runs and reports live: ``RUNS/NAME-DATE`` folders, and ``RUNS/NAME-latest`` linking the newest."""

from __future__ import annotations

import time
from pathlib import Path

import yaml


def stamped(parent: str | Path, name: str) -> Path:
    """``parent/NAME-YYYYmmdd-HHMMSS`` (not created)."""
    return Path(parent) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def latest_link(runs: str | Path, name: str) -> Path:
    """``runs/NAME-latest``: the link to the newest run of an experiment."""
    return Path(runs) / f"{name}-latest"


def link_latest(runs: str | Path, name: str, folder: Path) -> Path:
    """Point ``runs/NAME-latest`` at ``folder`` (a run folder inside ``runs``); returns the link."""
    link = latest_link(runs, name)
    link.unlink(missing_ok=True)
    link.symlink_to(folder.name)
    return link


def latest_runs(runs: str | Path, name: str) -> list[str]:
    """``[runs/NAME-latest]`` if it exists, else ``[]`` (the default learned policies of an evaluation)."""
    link = latest_link(runs, name)
    return [str(link)] if link.exists() else []


def finished_run_name(run: str | Path) -> str:
    """The experiment name of a finished training run folder; a clear error for anything else."""
    run = Path(run)
    if not (run / "config.yaml").is_file() or not (run / "final").is_dir():
        raise ValueError(f"{run} is not a finished training run folder (config.yaml and final/ expected)")
    return yaml.safe_load((run / "config.yaml").read_text())["name"]
