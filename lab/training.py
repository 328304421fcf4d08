"""PPO co-training of the depth and verification-size policies from an experiment config.

Phases alternate as in Learning to Draft: train the depth policy with the size policy frozen inside the
env, then the size policy with the depth policy frozen (its first phase with random depths), for
``cotraining.rounds`` rounds. Without ``cotraining.train_size`` only the depth policy is trained (every
drafted token is verified).

A run folder holds ``config.yaml`` (written first, then resolved), ``state.json`` (where training stands and
which ``checkpoints/PHASE-STEP/`` folder holds its models, in :mod:`lab.ppo`'s format: nothing unpickles),
``metrics.csv`` (one row per rollout), ``evaluation.json``, ``plots/`` and ``final/``
(the exported policy: ``policy.safetensors`` + ``policy.json``). :func:`resume` continues a killed run from its
last checkpoint.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from tqdm import tqdm

from adaptive.costmodel import throughput_speedup
from adaptive.files import UnreadableFile, read_json
from adaptive.learned_policy import LearnedPolicy, save_policy
from adaptive.policy import DraftPolicy
from adaptive.tree_traces import TreeTraceSet
from envs.factory import default_traces
from envs.synthetic import SYNTHETIC_STEP_SECONDS, SyntheticBackend
from lab.config import ExperimentConfig, load_config
from lab.environments import AUTO, evaluate, make_env, resolve_profile, run_profile
from lab.plots import plot_training
from lab.ppo import export_sb3, load_state, new_ppo, save_state
from lab.tracking import Tracker
from policies.baselines import RandomDepth

log = logging.getLogger(__name__)
METRICS = [
    "phase",
    "decision",
    "timesteps",
    "reward_per_step",
    "reward_per_cycle",
    "throughput_speedup",
    "accepted_per_cycle",
    "continue_fraction",
    "mean_action",
    "policy_loss",
    "value_loss",
    "entropy_loss",
    "approx_kl",
    "seconds",
]


@dataclass(frozen=True)
class Phase:
    decision: str
    round: int
    partner: str
    """none | random | learned"""


def phases(config: ExperimentConfig) -> list[Phase]:
    """The co-training schedule."""
    plan = []
    cotraining = config.cotraining
    for r in range(cotraining.rounds):
        if cotraining.train_source:
            plan.append(Phase("source", r, "learned" if r > 0 else "none"))
        plan.append(Phase("depth", r, "learned" if (cotraining.train_size and r > 0) or cotraining.train_source else "none"))
        if config.cotraining.train_size:
            plan.append(Phase("size", r, "random" if r == 0 and config.cotraining.random_depth_first else "learned"))
    return plan


class _Progress(BaseCallback):
    """Per-rollout metrics (CSV + W&B), a progress bar, and checkpoints every ``every`` steps."""

    def __init__(self, run: TrainingRun, phase_index: int, done: int, total: int) -> None:
        super().__init__()
        self.run, self.phase_index, self.done, self.total = run, phase_index, done, total
        self.bar = tqdm(total=total, initial=done, desc=f"phase {phase_index + 1}/{len(run.plan)} {run.plan[phase_index].decision}", unit="step")
        self._reset_rollout()

    def _reset_rollout(self) -> None:
        self.rewards, self.actions, self.cycles, self.tokens, self.seconds, self.accepted = [], [], 0, 0, 0.0, 0

    def _on_step(self) -> bool:
        self.done += 1
        self.bar.update()
        self.rewards.append(float(self.locals["rewards"][0]))
        self.actions.append(int(self.locals["actions"][0]))
        info = self.locals["infos"][0]
        if info.get("cycles"):
            self.cycles += 1
            self.tokens += info["emitted"]
            self.seconds += info["draft_seconds"] + info["verify_seconds"] + info["policy_seconds"]
            self.accepted += info["accepted"]
        if self.done % self.run.config.checkpoint_every == 0:
            self.run.checkpoint(self.phase_index, self.done)
        return True

    def _on_rollout_end(self) -> None:
        losses = self.model.logger.name_to_value
        phase = self.run.plan[self.phase_index]
        row = {
            "phase": self.phase_index,
            "decision": phase.decision,
            "timesteps": self.done,
            "reward_per_step": float(np.mean(self.rewards)) if self.rewards else 0.0,
            "reward_per_cycle": float(np.sum(self.rewards)) / max(1, self.cycles),
            "throughput_speedup": throughput_speedup(self.tokens, self.seconds, self.run.target_step_seconds) if self.seconds else 0.0,
            "accepted_per_cycle": self.accepted / max(1, self.cycles),
            "continue_fraction": float(np.mean([a == 1 for a in self.actions])) if phase.decision == "depth" else float("nan"),
            "mean_action": float(np.mean(self.actions)) if self.actions else 0.0,
            "policy_loss": losses.get("train/policy_gradient_loss", float("nan")),
            "value_loss": losses.get("train/value_loss", float("nan")),
            "entropy_loss": losses.get("train/entropy_loss", float("nan")),
            "approx_kl": losses.get("train/approx_kl", float("nan")),
            "seconds": time.time() - self.run.started,
        }
        self.run.record(row)
        self.bar.set_postfix(speedup=f"{row['throughput_speedup']:.3f}")
        self._reset_rollout()

    def _on_training_end(self) -> None:
        self.bar.close()


class TrainingRun:
    """State and files of one training run."""

    def __init__(self, config: ExperimentConfig, folder: Path) -> None:
        self.config = config
        self.folder = folder
        self.plan = phases(config)
        self.models: dict[str, PPO] = {}
        self.started = time.time()
        self.profile = run_profile(config)
        self.target_step_seconds = self.profile.target_step_seconds if self.profile else SYNTHETIC_STEP_SECONDS
        self.tracker = Tracker(config.tracking.wandb, config.tracking.project, config.tracking.group or config.name, folder.name, config.to_dict(), folder)
        self.schema = make_env(config, "depth", None, self.profile).schema
        """What the policies see: the training environment's observation schema."""
        log.info("observation schema version %d (%d fields)", self.schema.version, self.schema.size)

    # --- files -----------------------------------------------------------------------------------------

    def record(self, row: dict) -> None:
        path = self.folder / "metrics.csv"
        new = not path.exists()
        with path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=METRICS)
            if new:
                writer.writeheader()
            writer.writerow(row)
        self.tracker.log({f"{row['decision']}/{k}": v for k, v in row.items() if k not in ("decision",)})

    def checkpoint(self, phase_index: int, done: int) -> None:
        """Save every model and where training stands: a new ``checkpoints/PHASE-STEP/`` folder, then ``state.json``
        naming it (replaced atomically, so a kill at any moment leaves a complete checkpoint named), then the older
        folders go."""
        directory = self.folder / "checkpoints"
        current = directory / f"{phase_index}-{done}"
        shutil.rmtree(current, ignore_errors=True)
        for decision, model in self.models.items():
            save_state(model, current, decision)
        state = {"phase": phase_index, "done": done, "models": sorted(self.models), "checkpoint": current.name}
        (self.folder / "state.tmp.json").write_text(json.dumps(state))
        os.replace(self.folder / "state.tmp.json", self.folder / "state.json")
        for old in directory.iterdir():
            if old != current:
                shutil.rmtree(old) if old.is_dir() else old.unlink()

    # --- policies --------------------------------------------------------------------------------------

    def metadata(self, decision_layers: dict[str, list[int]]) -> dict:
        env = self.config.env
        if env.backend == "synthetic":
            backend = SyntheticBackend(env.alphas, c=env.c, g=env.g, max_depth=env.max_depth)
            profile = {"path": None, "c": backend.c, "g": list(backend.g), "hardware": None}
        else:
            profile = {"path": env.profile, "c": self.profile.c, "g": list(self.profile.g), "hardware": self.profile.hardware}
        return {
            "name": f"learned:{self.config.name}",
            "schema": self.schema.describe(),
            "pair": self.config.pair if env.backend != "synthetic" else "synthetic",
            "profile": profile,
            "config_digest": self.config.digest(),
            "tree": self._tree_shape(),
            "depth_layers": decision_layers.get("depth"),
            "size_layers": decision_layers.get("size"),
            "source_layers": decision_layers.get("source"),
        }

    def _tree_shape(self) -> dict | None:
        """k, W and the default V of the tree traces trained on (None for chains)."""
        env = self.config.env
        if not env.tree:
            return None
        path = Path(env.traces) if env.traces.endswith(".npz") else default_traces(env.traces, self.config.pair, tree=True, engine=self.profile.engine)
        recorded = TreeTraceSet.read_metadata(path)
        return {"branching": recorded["branching"], "width": recorded["width"], "size": env.tree_size}

    def current_policy(self) -> LearnedPolicy:
        """The learned policy as the decoder would run it (exported MLPs)."""
        nets, layers = {}, {}
        for decision, model in self.models.items():
            nets[decision], layers[decision] = export_sb3(model)
        return LearnedPolicy(nets.get("depth"), self.metadata(layers), nets.get("size"), nets.get("source"))

    def partner(self, phase: Phase) -> DraftPolicy | None:
        if phase.partner == "none":
            return None
        if phase.partner == "random":
            return RandomDepth(self.config.env.max_depth, self.config.seed)
        return self.current_policy()

    # --- training --------------------------------------------------------------------------------------

    def run_phases(self, start_phase: int, start_done: int) -> None:
        for index in range(start_phase, len(self.plan)):
            phase = self.plan[index]
            settings = {"depth": self.config.depth_policy, "size": self.config.size_policy, "source": self.config.source_policy}[phase.decision]
            env = make_env(self.config, phase.decision, self.partner(phase), self.profile)
            env.reset(seed=self.config.seed + index)
            if phase.decision in self.models:
                self.models[phase.decision].set_env(env)
            elif self.config.init_from:
                start = checkpoint_folder(Path(self.config.init_from))
                self.models[phase.decision] = load_state(settings, start, phase.decision, env, self.config.seed + index, counters=False)
            else:
                self.models[phase.decision] = new_ppo(settings, env, self.config.seed + index)
            done = start_done if index == start_phase else 0
            remaining = settings.timesteps - done
            if remaining > 0:
                callback = _Progress(self, index, done, settings.timesteps)
                self.models[phase.decision].learn(remaining, callback=callback, reset_num_timesteps=False)
            self.checkpoint(index + 1, 0)

    def finish(self) -> Path:
        """Export the final policy, evaluate it against static depths (and the oracle in replay), plot."""
        policy = self.current_policy()
        final = self.folder / "final"
        save_policy(final, policy.depth_net, policy.metadata, policy.size_net, policy.source_net)
        evaluation = evaluate(self.config, policy, self.profile)
        (self.folder / "evaluation.json").write_text(json.dumps(evaluation, indent=1))
        rows = [[k, v["speedup"], v["tokens"], v["seconds"]] for k, v in evaluation.items()]
        self.tracker.log_table("evaluation", ["policy", "speedup", "tokens", "seconds"], rows)
        plot_training(self.folder)
        self.tracker.log_artifact(final, f"{self.config.name}-policy", "policy")
        self.tracker.finish()
        return final


def checkpoint_folder(run: Path) -> Path:
    """The folder of a run's newest checkpoint (after training: its final models), as ``state.json`` names it."""
    state = read_json(run / "state.json", "training run state")
    name = state.get("checkpoint")
    if not isinstance(name, str) or "/" in name or not (run / "checkpoints" / name).is_dir():
        raise UnreadableFile(f"{run / 'state.json'} names no checkpoint folder of this run (found {name!r}); was it written by an older version?")
    return run / "checkpoints" / name


def train(config: ExperimentConfig, folder: str | Path) -> Path:
    """Train into ``folder`` (new, or empty); returns the final policy folder. ``config.yaml`` is written at once,
    so a run killed at any moment resumes; a profile ``auto`` is then measured on this machine and kept in the
    folder (``config.yaml`` is rewritten to name that file, so a resumed run uses it)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        raise ValueError(f"run folder {folder} is not empty: resume it (adaptive train --resume {folder}) or train into a new one")
    _write_config(config, folder)
    return _run(config, folder, {"phase": 0, "done": 0, "models": []})


def resume(folder: str | Path) -> Path:
    """Continue a killed run from its last checkpoint (or from its start, if it was killed before the first);
    returns the final policy folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a training run folder (no such folder)")
    if not (folder / "config.yaml").is_file():
        raise ValueError(f"{folder} is not a training run folder (no config.yaml)")
    config = load_config(folder / "config.yaml")
    state = read_json(folder / "state.json", "training run state") if (folder / "state.json").is_file() else {"phase": 0, "done": 0, "models": []}
    _truncate_metrics(folder, state)
    log.info("resuming %s at phase %d, step %d", folder, state["phase"], state["done"])
    return _run(config, folder, state)


def _write_config(config: ExperimentConfig, folder: Path) -> None:
    (folder / "config.tmp.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    os.replace(folder / "config.tmp.yaml", folder / "config.yaml")


def _run(config: ExperimentConfig, folder: Path, state: dict) -> Path:
    """Resolve an ``auto`` profile (measured now if it was not yet) and engine, restore the saved models, train on, finish."""
    if AUTO in (config.env.profile, config.engine) and config.env.backend != "synthetic":
        resolve_profile(config, folder)
        _write_config(config, folder)
    torch.manual_seed(config.seed)
    run = TrainingRun(config, folder)
    if state["models"]:
        saved = checkpoint_folder(folder)
        settings = {"depth": config.depth_policy, "size": config.size_policy, "source": config.source_policy}
        for decision in state["models"]:
            env = make_env(config, decision, None, run.profile)
            run.models[decision] = load_state(settings[decision], saved, decision, env, config.seed)
    run.run_phases(state["phase"], state["done"])
    return run.finish()


def _truncate_metrics(folder: Path, state: dict) -> None:
    """Drop metric rows logged after the checkpoint we resume from (they will be produced again)."""
    path = folder / "metrics.csv"
    if not path.is_file():
        return
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    kept = [r for r in rows if (int(r["phase"]), int(r["timesteps"])) <= (state["phase"], state["done"])]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=METRICS)
        writer.writeheader()
        writer.writerows(kept)
