"""Hardware retargeting: re-evaluation under another profile, re-training from a run's checkpoints, and
what-if profiles derived from measured ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from adaptive.learned_policy import load_policy
from adaptive.profile import CostProfile
from lab.cli import main
from lab.config import ConfigError, config_from_dict
from lab.retarget import retarget
from lab.training import train

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "profiles" / "smollm2-135m.json")


def replay_config(name: str, **changes) -> dict:
    config = {
        "name": name,
        "seed": 0,
        "env": {"backend": "replay", "max_depth": 4, "profile": PROFILE},
        "depth_policy": {"timesteps": 512, "n_steps": 256, "batch_size": 64, "n_epochs": 2},
        "eval_episodes": 12,
        "tracking": {"wandb": "disabled"},
    }
    config.update(changes)
    return config


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("retarget") / "run"
    train(config_from_dict(replay_config("base")), folder)
    return folder


def _weights(folder: Path) -> list[np.ndarray]:
    return [p.detach().numpy() for p in load_policy(folder).depth_net.parameters()]


def test_init_from_starts_at_the_old_weights(run, tmp_path):
    frozen = replay_config("frozen", init_from=str(run))
    frozen["depth_policy"]["learning_rate"] = 1e-12
    train(config_from_dict(frozen), tmp_path / "frozen")
    for old, new in zip(_weights(run), _weights(tmp_path / "frozen"), strict=True):
        np.testing.assert_allclose(new, old, atol=1e-6)
    train(config_from_dict(replay_config("fresh", seed=1)), tmp_path / "fresh")
    assert not np.allclose(_weights(run)[0], _weights(tmp_path / "fresh")[0], atol=1e-3)


def test_init_from_must_be_a_run_folder(tmp_path):
    with pytest.raises(ConfigError, match="init_from"):
        config_from_dict(replay_config("bad", init_from=str(tmp_path)))


def test_retargeting_to_the_same_profile_reproduces_the_old_evaluation(run, tmp_path):
    result = retarget(run, PROFILE, 256, tmp_path / "same")
    assert result["old_policy"] == pytest.approx(result["old_policy_on_old_profile"], rel=1e-12)
    assert result["best_static"]["speedup"] == max(result["statics"].values())
    assert result["oracle"] >= max(result["old_policy"], result["retrained_policy"], result["best_static"]["speedup"])
    assert json.loads((tmp_path / "same" / "retarget.json").read_text()) == result


def test_a_profile_with_free_width_makes_deeper_drafting_pay(run, tmp_path):
    flat = tmp_path / "flat.json"
    CostProfile.load(PROFILE).scaled(0.0, 0.1).save(flat)
    result = retarget(run, str(flat), 256, tmp_path / "flat")
    statics = result["statics"]
    assert statics["static:4"] > statics["static:1"], statics  # measured profile: static:1 is best
    assert result["old_policy"] != pytest.approx(result["old_policy_on_old_profile"])


def test_scaled_profile_identity_and_flat_verification():
    measured = CostProfile.load(PROFILE)
    same = measured.scaled(1.0, 1.0)
    assert same.c == pytest.approx(measured.c) and same.g == pytest.approx(measured.g)
    flat = measured.scaled(0.0, 0.5)
    assert all(v == pytest.approx(1.0) for v in flat.g)
    assert flat.c == pytest.approx(measured.c / 2)
    assert "what_if" in flat.hardware
    with pytest.raises(ValueError, match="draft_scale"):
        measured.scaled(0.1, 0.0)


def test_cli_names_a_missing_profile(run, capsys):
    assert main(["retarget", str(run), "--profile", "nowhere.json"]) == 2
    assert "nowhere.json" in capsys.readouterr().err


def test_a_continued_model_takes_the_new_configs_optimisation_settings(run):
    from dataclasses import replace

    from lab.environments import make_env
    from lab.ppo import load_state
    from lab.training import checkpoint_folder

    config = config_from_dict(replay_config("continued", init_from=str(run)))
    settings = replace(config.depth_policy, clip_range=0.05, ent_coef=0.123, n_epochs=3)
    env = make_env(config, "depth", None, CostProfile.load(PROFILE))
    model = load_state(settings, checkpoint_folder(run), "depth", env, 0, counters=False)
    assert (model.clip_range(1.0), model.ent_coef, model.n_epochs, model.num_timesteps) == (0.05, 0.123, 3, 0)
