"""Where the shipped data lives: the workload's prompts, the replay traces, the cost profiles and the experiment
configs.

Run from a checkout (or an editable install), they are the repository's own ``data/``, ``profiles/`` and
``experiments/``. A package installed from a wheel carries them in ``<prefix>/share/adaptive-draft`` (the data files
``pyproject.toml`` names). ``$ADAPTIVE_DATA`` points at another folder laid out the same way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SHARE = Path("share") / "adaptive-draft"
"""Where an installed wheel puts the shipped data, under the environment's prefix."""


def shipped_root() -> Path:
    """The folder holding ``data/``, ``profiles/`` and ``experiments/``: ``$ADAPTIVE_DATA``, else the checkout this
    package runs from, else the installed copy under ``sys.prefix``."""
    if os.environ.get("ADAPTIVE_DATA"):
        return Path(os.environ["ADAPTIVE_DATA"])
    checkout = Path(__file__).resolve().parents[1]
    return checkout if (checkout / "data" / "workload").is_dir() else Path(sys.prefix) / SHARE


def shipped_experiment(name: str) -> Path:
    """An experiment config by path, or by the name of a shipped one (``quickstart`` for ``experiments/quickstart.yaml``)."""
    path = Path(name)
    if path.exists() or path.suffix or len(path.parts) > 1:
        return path
    return shipped_root() / "experiments" / f"{name}.yaml"
