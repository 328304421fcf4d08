"""Hardware retargeting: how a trained policy fares under another cost profile (another machine, or a
changed one), and how much a short re-training from its checkpoints recovers.

Everything is measured in replay on the val traces (exact acceptances, time from the new profile): the
old policy, every static depth (grid search under the new profile), the oracle, then the re-trained policy.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from adaptive.learned_policy import load_policy
from adaptive.profile import CostProfile
from lab.config import ExperimentConfig, config_from_dict
from lab.environments import AUTO, evaluate
from lab.training import train


def retarget_config(config: ExperimentConfig, run: Path, profile: str, timesteps: int) -> ExperimentConfig:
    """The run's config pointed at ``profile``, starting from the run's checkpoints, ``timesteps`` per phase."""
    data = config.to_dict()
    data["name"] = f"{config.name}-retarget"
    data["init_from"] = str(run)
    data["env"]["profile"] = profile
    for section in ("depth_policy", "size_policy"):
        data[section]["timesteps"] = timesteps
    return config_from_dict(data)


def retarget(run: str | Path, profile: str, timesteps: int, out: str | Path) -> dict:
    """Re-train the run's policy briefly into ``out`` under ``profile`` (a file, or auto: this machine,
    measured now into ``out``), and evaluate the old policy, every static depth and the oracle under it.

    Returns (and writes to ``out/retarget.json``) the speedups of the old policy, the re-trained one, the
    best static depth and the oracle under the new profile, and the re-training's gain over the old policy.
    """
    run, out = Path(run).resolve(), Path(out)
    original = config_from_dict(yaml.safe_load((run / "config.yaml").read_text()))
    if original.env.backend != "replay":
        raise ValueError(f"retargeting replays traces; run {run} was trained on the {original.env.backend!r} backend")
    if profile != AUTO and not Path(profile).is_file():
        raise ValueError(f"profile {profile} does not exist (write one with: adaptive profile --out {profile}, or give auto)")
    config = retarget_config(original, run, profile, timesteps)
    train(config, out)  # resolves an auto profile into out/profile.json
    profile = config.env.profile
    before = evaluate(config, load_policy(run / "final"), CostProfile.load(profile))
    after = json.loads((out / "evaluation.json").read_text())
    statics = {name: v["speedup"] for name, v in before.items() if name.startswith("static:")}
    best_static = max(statics, key=lambda name: statics[name])
    old, new = before["learned"]["speedup"], after["learned"]["speedup"]
    result = {
        "run": str(run),
        "old_profile": original.env.profile,
        "new_profile": profile,
        "timesteps": timesteps,
        "old_policy_on_old_profile": json.loads((run / "evaluation.json").read_text())["learned"]["speedup"],
        "old_policy": old,
        "retrained_policy": new,
        "best_static": {"policy": best_static, "speedup": statics[best_static]},
        "oracle": before.get("oracle", {}).get("speedup"),
        "statics": statics,
        "retraining_gain": new / old - 1,
    }
    (out / "retarget.json").write_text(json.dumps(result, indent=1))
    return result
