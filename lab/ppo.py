"""stable-baselines3 PPO as training uses it: a new model from the config, a trained one to continue from,
and the export of its deterministic action head as a plain MLP (what the decoder runs)."""

from __future__ import annotations

from pathlib import Path

import torch
from stable_baselines3 import PPO

from adaptive.learned_policy import mlp
from envs.env import SpecDecodeEnv
from lab.config import PPOConfig


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


def load_ppo(config: PPOConfig, path: Path, env: SpecDecodeEnv) -> PPO:
    """A trained model to continue from, with this config's optimisation settings and a fresh step count
    (so a linear learning-rate schedule starts from its peak)."""
    if not path.is_file():
        raise ValueError(f"cannot initialise from {path}: no such checkpoint")
    model = PPO.load(path, env=env, device="cpu", **_optimisation(config))
    model.num_timesteps = 0
    return model
