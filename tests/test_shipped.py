"""The shipped data's location: the checkout's own folders, $ADAPTIVE_DATA, or an installed wheel's copy; experiment
configs by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from adaptive.shipped import SHARE, shipped_experiment, shipped_root
from lab.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_a_checkout_reads_its_own_folders_and_adaptive_data_points_elsewhere(monkeypatch, tmp_path):
    monkeypatch.delenv("ADAPTIVE_DATA", raising=False)
    assert shipped_root() == ROOT
    monkeypatch.setenv("ADAPTIVE_DATA", str(tmp_path))
    assert shipped_root() == tmp_path
    assert SHARE == Path("share") / "adaptive-draft" and Path(sys.prefix).is_dir()


def test_an_experiment_config_is_found_by_name_or_path(monkeypatch):
    monkeypatch.delenv("ADAPTIVE_DATA", raising=False)
    assert shipped_experiment("quickstart") == ROOT / "experiments" / "quickstart.yaml"
    assert shipped_experiment("experiments/tree.yaml") == Path("experiments/tree.yaml")
    assert load_config("quickstart").name == "quickstart"
    with pytest.raises(ConfigError, match="shipped configs, by name: .*quickstart"):
        load_config("quickstrat")
