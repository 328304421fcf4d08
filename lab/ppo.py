"""stable-baselines3 PPO as training uses it: a new model from the config, its training state saved and restored
in the project's own format, and the export of its deterministic action head as a plain MLP (what the decoder runs).

Training state, per decision (``depth``, ``size``, ``source``) in a checkpoint folder: ``DECISION.safetensors``
(policy and value weights), ``DECISION.optimizer.pt`` (Adam's state, read with ``torch.load(weights_only=True)``)
and ``DECISION.json`` (format, layer sizes, spaces, step counters). Nothing in it is unpickled when read, unlike
SB3's own ``.zip``, which this project neither writes nor reads: a shared run folder cannot run code.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import torch
from safetensors.torch import save_file
from stable_baselines3 import PPO

from adaptive.files import UnreadableFile, load_weights, read_json, read_tensors
from adaptive.learned_policy import mlp
from envs.env import SpecDecodeEnv
from lab.config import PPOConfig

STATE_FORMAT = "adaptive-ppo-state/1"


def export_sb3(model) -> tuple[torch.nn.Sequential, list[int]]:
    """The deterministic action head of an SB3 PPO MlpPolicy as a plain MLP (and its layer sizes)."""
    policy = model.policy
    linears = [m for m in policy.mlp_extractor.policy_net if isinstance(m, torch.nn.Linear)] + [policy.action_net]
    sizes = [linears[0].in_features] + [layer.out_features for layer in linears]
    net = mlp(sizes)
    for target, source in zip([m for m in net if isinstance(m, torch.nn.Linear)], linears):
        target.load_state_dict(source.state_dict())
    return net.eval(), sizes


def _learning_rate(config: PPOConfig):
    """SB3 learning rate: constant, or decaying linearly to 0 over the phase."""
    rate = config.learning_rate
    return (lambda progress: rate * progress) if config.lr_schedule == "linear" else rate


def _optimisation(config: PPOConfig) -> dict:
    """The settings a new model and a continued one share."""
    return {
        "learning_rate": _learning_rate(config),
        "n_steps": config.n_steps,
        "batch_size": config.batch_size,
        "n_epochs": config.n_epochs,
        "gamma": config.gamma,
        "gae_lambda": config.gae_lambda,
        "ent_coef": config.ent_coef,
        "clip_range": config.clip_range,
    }


def new_ppo(config: PPOConfig, env: SpecDecodeEnv, seed: int) -> PPO:
    return PPO(
        "MlpPolicy",
        env,
        policy_kwargs={"net_arch": {"pi": list(config.net), "vf": list(config.net)}},
        seed=seed,
        device="cpu",
        verbose=0,
        **_optimisation(config),
    )


def _spaces(holder: SpecDecodeEnv | PPO) -> dict:
    """The observation size and the number of actions of an environment or a model."""
    return {"observation": int(holder.observation_space.shape[0]), "actions": int(holder.action_space.n)}


def save_state(model: PPO, folder: Path, decision: str) -> None:
    """Write ``decision``'s training state into ``folder`` (the project's format: see the module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in model.policy.state_dict().items()}, folder / f"{decision}.safetensors")
    torch.save(model.policy.optimizer.state_dict(), folder / f"{decision}.optimizer.pt")
    meta = {
        "format": STATE_FORMAT,
        "net": list(model.policy_kwargs["net_arch"]["pi"]),
        "spaces": _spaces(model),
        "num_timesteps": int(model.num_timesteps),
        "n_updates": int(model._n_updates),
    }
    (folder / f"{decision}.json").write_text(json.dumps(meta, indent=1))


def load_state(config: PPOConfig, folder: Path, decision: str, env: SpecDecodeEnv, seed: int, counters: bool = True) -> PPO:
    """``decision``'s model as saved in ``folder`` (its layer sizes, weights and optimiser state), with this config's
    optimisation settings, on ``env``. ``counters``: keep its step count (resuming); otherwise start at 0, so a linear
    learning-rate schedule starts from its peak (continuing from another run). Unpickles nothing."""
    sidecar = folder / f"{decision}.json"
    if not sidecar.is_file() and (folder / f"{decision}.zip").is_file():
        raise UnreadableFile(
            f"{folder / (decision + '.zip')} is a stable-baselines3 zip, which unpickles when read and is not loaded; "
            "this run was trained by an older version: train it again"
        )
    meta = read_json(sidecar, "training state")
    if meta.get("format") != STATE_FORMAT:
        raise UnreadableFile(f"training state {sidecar} is not of format {STATE_FORMAT} (found {meta.get('format')!r})")
    if meta.get("spaces") != _spaces(env):
        raise UnreadableFile(f"training state {sidecar} was trained on {meta.get('spaces')}; this environment has {_spaces(env)}")
    if not isinstance(meta.get("net"), list) or not all(isinstance(n, int) and n > 0 for n in meta["net"]):
        raise UnreadableFile(f"training state {sidecar}: 'net' must list positive layer sizes, got {meta.get('net')!r}")
    model = new_ppo(dataclasses.replace(config, net=meta["net"]), env, seed)
    weights = folder / f"{decision}.safetensors"
    load_weights(model.policy, read_tensors(weights, "training state"), weights, "training state")
    optimiser = folder / f"{decision}.optimizer.pt"
    if not optimiser.is_file():
        raise UnreadableFile(f"training state {optimiser} does not exist")
    try:
        model.policy.optimizer.load_state_dict(torch.load(optimiser, weights_only=True))
    except (pickle.UnpicklingError, RuntimeError, ValueError, KeyError, EOFError) as error:
        raise UnreadableFile(f"optimiser state {optimiser} is refused or damaged (plain tensors expected: {str(error).splitlines()[0]})") from None
    if counters:
        model.num_timesteps, model._n_updates = int(meta["num_timesteps"]), int(meta["n_updates"])
    return model
