"""Weights & Biases logging that never stops the work it records.

Offline by default (runs sync later with ``wandb sync``); ``online`` only when configured; ``disabled``
turns it off. Any W&B error is reported once as a warning and logging stops; training goes on.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


class Tracker:
    """One W&B run (or nothing, when disabled or broken)."""

    def __init__(self, mode: str, project: str, group: str, name: str, config: dict, folder: Path, job_type: str = "train") -> None:
        self.run = None
        if mode == "disabled":
            return
        try:
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            folder.mkdir(parents=True, exist_ok=True)
            # read now, not when wandb was first imported: how long an unreachable server may hold this run up
            timeout = os.environ.get("WANDB_INIT_TIMEOUT")
            settings = wandb.Settings(init_timeout=float(timeout)) if timeout else None
            self.run = wandb.init(
                mode=mode, project=project, group=group, name=name, job_type=job_type, config=config, dir=str(folder), reinit="create_new", settings=settings
            )
        except Exception as error:  # noqa: BLE001 - tracking must never stop training
            self._fail("init", error)

    def _fail(self, what: str, error: Exception) -> None:
        log.warning("W&B %s failed (%s: %s); continuing without tracking", what, type(error).__name__, error)
        self.run = None

    def log(self, values: dict, step: int | None = None) -> None:
        if self.run is None:
            return
        try:
            self.run.log(values, step=step)
        except Exception as error:  # noqa: BLE001
            self._fail("log", error)

    def log_table(self, key: str, columns: list[str], rows: list[list]) -> None:
        if self.run is None:
            return
        try:
            import wandb

            self.run.log({key: wandb.Table(columns=columns, data=rows)})
        except Exception as error:  # noqa: BLE001
            self._fail("table", error)

    def log_bar_chart(self, key: str, labels: list[str], values: list[float], value_name: str, title: str) -> None:
        """A native W&B bar chart (one bar per label)."""
        if self.run is None:
            return
        try:
            import wandb

            table = wandb.Table(columns=["label", value_name], data=[[label, value] for label, value in zip(labels, values)])
            self.run.log({key: wandb.plot.bar(table, "label", value_name, title=title)})
        except Exception as error:  # noqa: BLE001
            self._fail("chart", error)

    def log_images(self, images: dict[str, Path]) -> None:
        """PNG files as W&B images, keyed by name."""
        if self.run is None:
            return
        try:
            import wandb

            self.run.log({key: wandb.Image(str(path)) for key, path in images.items() if path.is_file()})
        except Exception as error:  # noqa: BLE001
            self._fail("images", error)

    def log_artifact(self, folder: Path, name: str, kind: str) -> None:
        if self.run is None:
            return
        try:
            import wandb

            artifact = wandb.Artifact(name, type=kind)
            artifact.add_dir(str(folder))
            self.run.log_artifact(artifact)
        except Exception as error:  # noqa: BLE001
            self._fail("artifact", error)

    def finish(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
        except Exception as error:  # noqa: BLE001
            self._fail("finish", error)
