"""Work on Ray (a local Ray of 2 CPUs, as a user with ``--workers 2``): recording sharded across workers writes
the file one process writes, a sweep of 2 configs × 2 seeds trains on 2 workers and compares its runs, and
the same functions run in-process without Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import brief_synthetic_config

from lab.config import config_from_dict
from lab.scale import parallel_map, wants_ray
from lab.training import train

pytest.importorskip("ray", reason="the scale extra (pip install -e '.[scale]') is part of the test setup")


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    result = subprocess.run([sys.executable, "-m", "lab.cli", *args], capture_output=True, text=True, timeout=600, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [[], ["--temperature", "1", "--samples", "2", "--seed", "7"]], ids=["greedy", "sampled"])
def test_recording_on_two_ray_workers_writes_the_single_process_file_byte_for_byte(model_folders, tmp_path, sampling):
    """7 prompts in shards of 3 and 4 (sampled: 2 outputs each, every entry keeping the seed it has in one process)."""
    common = ["record", "--target", model_folders["target"], "--draft", model_folders["draft"], "--engine", "eager", "--split", "test", "--limit", "7"]
    common += ["--max-new-tokens", "12", "--depth", "3", *sampling]
    fixed_time = {"SOURCE_DATE_EPOCH": "1767225600"}
    run_cli(*common, "--out", str(tmp_path / "one.npz"), **fixed_time)
    run_cli(*common, "--out", str(tmp_path / "ray.npz"), "--workers", "2", **fixed_time)
    assert (tmp_path / "one.npz").read_bytes() == (tmp_path / "ray.npz").read_bytes()


def synthetic_base(tmp_path: Path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(brief_synthetic_config("tiny-sweep", eval_episodes=8)))
    return path


@pytest.mark.slow
def test_a_sweep_of_two_configs_and_two_seeds_trains_on_two_ray_workers_and_compares_them(tmp_path):
    base = synthetic_base(tmp_path)
    out = tmp_path / "sweep"
    result = run_cli("sweep", str(base), "--set", "env.max_depth=2,4", "--seeds", "0,1", "--workers", "2", "--out", str(out))
    assert "Grid points" in result.stdout
    comparison = json.loads((out / "sweep.json").read_text())
    assert [r["run"] for r in comparison["runs"]] == [
        "tiny-sweep-max_depth2-s0",
        "tiny-sweep-max_depth2-s1",
        "tiny-sweep-max_depth4-s0",
        "tiny-sweep-max_depth4-s1",
    ]
    for row in comparison["runs"]:
        assert row["learned"]["low"] <= row["learned"]["speedup"] <= row["learned"]["high"]
        assert row["best_static"]["policy"] in ({"static:1", "static:2"} if "depth2" in row["run"] else {f"static:{d}" for d in range(1, 5)})
        assert (out / row["run"] / "final" / "policy.json").is_file()
    assert [p["point"] for p in comparison["points"]] == ["env.max_depth=2", "env.max_depth=4"] and all(p["seeds"] == 2 for p in comparison["points"])
    assert (out / "sweep.png").stat().st_size > 0 and "learned" in (out / "report.md").read_text()
    # a run trained on a Ray worker is the run trained here from the same config
    planned = json.loads((out / "runs.json").read_text())[1]
    train(config_from_dict(planned["config"]), tmp_path / "here")
    here = json.loads((tmp_path / "here" / "evaluation.json").read_text())
    assert here == json.loads((out / planned["name"] / "evaluation.json").read_text())


def test_without_workers_the_tasks_run_here_in_order():
    assert not wants_ray(1, None) or os.environ.get("RAY_ADDRESS")
    assert parallel_map(abs, [-3, 2, -1]) == [3, 2, 1]
    with pytest.raises(ValueError, match="workers must be >= 1"):
        wants_ray(0, None)


def test_bad_sweep_assignments_are_refused_before_anything_runs(tmp_path):
    base = synthetic_base(tmp_path)
    for bad, message in ((["--set", "env.max_depth"], "KEY=V1,V2"), (["--set", "env.no_such_key=1,2"], "no_such_key")):
        result = subprocess.run(
            [sys.executable, "-m", "lab.cli", "sweep", str(base), *bad, "--out", str(tmp_path / "s")], capture_output=True, text=True, timeout=120
        )
        assert result.returncode != 0 and message in result.stderr
        assert not (tmp_path / "s" / "sweep.json").exists()
