"""Where runs and reports live: ``RUNS/NAME-DATE`` folders, and ``RUNS/NAME-latest`` linking the newest."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import yaml


def stamped(parent: str | Path, name: str) -> Path:
    """``parent/NAME-YYYYmmdd-HHMMSS`` (not created)."""
    return Path(parent) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def new_run_folder(parent: str | Path, name: str) -> Path:
    """Create and return ``parent/NAME-YYYYmmdd-HHMMSS``, or ``…-2``, ``…-3`` when runs started in the same second
    took the earlier names (each creation is atomic, so two runs never share a folder)."""
    check_output_folder(parent, "--runs")
    base = stamped(parent, name)
    for attempt in range(1, 1000):
        folder = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise ValueError(f"could not create a run folder beside {base}: 999 folders of that name and second exist")


def check_output_folder(folder: str | Path, option: str) -> Path:
    """Make sure ``folder`` exists (created if need be) and is a writable folder, before any long work; the error
    names ``option`` and the path."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option} {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ValueError(f"{option} {folder} cannot be written to: {error.strerror}") from None
    return folder


def check_output_file(path: str | Path, option: str) -> Path:
    """Make sure a file can be written at ``path`` (its folder created if need be), before any long work."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file path")
    check_output_folder(path.parent, f"{option}'s folder")
    if path.exists():
        try:
            with path.open("ab"):
                pass
        except OSError as error:
            raise ValueError(f"{option} {path} cannot be written to: {error.strerror}") from None
    return path


def latest_link(runs: str | Path, name: str) -> Path:
    """``runs/NAME-latest``: the link to the newest run of an experiment."""
    return Path(runs) / f"{name}-latest"


def link_latest(runs: str | Path, name: str, folder: Path) -> Path:
    """Point ``runs/NAME-latest`` at ``folder`` (a run folder inside ``runs``); returns the link."""
    link = latest_link(runs, name)
    staged = link.with_name(f".{link.name}.{os.getpid()}")
    staged.unlink(missing_ok=True)
    staged.symlink_to(folder.name)
    os.replace(staged, link)  # atomic: runs finishing together leave one valid link
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
