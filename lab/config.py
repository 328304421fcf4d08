"""Experiment configs (``experiments/*.yaml``): typed sections, validated on load.

An unknown key, a wrong type or a value out of range is a :class:`ConfigError` naming the key (with its
section path) and what is allowed. Every section has defaults, so a config only states what it changes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from adaptive.engines import AUTO, DEFAULT_ENGINE, ENGINES
from adaptive.observation import VERSIONS
from adaptive.precision import CHOICES as DTYPE_CHOICES
from adaptive.precision import DEFAULT_DTYPE
from adaptive.shipped import shipped_experiment, shipped_root


class ConfigError(ValueError):
    """A config key is unknown or its value is not allowed."""


@dataclass
class EnvConfig:
    backend: str = "replay"
    """replay | synthetic | live"""
    traces: str = "train"
    """replay: a shipped split name (train, val) or a trace file; with ``copy``, a split name means the copy traces"""
    eval_traces: str | None = None
    """replay: what the run's final evaluation replays (default: val when ``traces`` is train, else ``traces``)"""
    profile: str = "auto"
    """a cost profile file (replay time, evaluation), or auto: measure a short one of the pair on this machine at
    start and keep it in the run or evaluation folder"""
    max_depth: int = 8
    decision_seconds: float = 1e-4
    alphas: list[float] = field(default_factory=lambda: [0.7])
    """synthetic: acceptance probability of each hidden regime"""
    switch_prob: float = 0.0
    """synthetic: probability of a regime switch between rounds"""
    c: float = 0.05
    """synthetic: draft step cost relative to a target step"""
    g: float = 1.0
    """synthetic: verification cost relative to a target step"""
    max_new_tokens: int = 128
    """synthetic and live: tokens per generation (replay uses the traces' budget)"""
    split: str = "train"
    """live: workload split"""
    temperature: float = 0.0
    """live: sampling temperature (replay is greedy)"""
    tree: bool = False
    """replay: grow draft trees (tree traces data/traces/PAIR-SPLIT-tree.npz, from adaptive record --tree)"""
    tree_size: int = 8
    """tree: verified nodes V when no size policy decides"""
    copy: bool = False
    """replay: the traces hold the copy drafter's chains (adaptive record --copy) and the decoder has it beside
    the model, so a round may draft with it (the policy picks: model, copy, or copy then model)"""
    observation_version: int | None = None
    """the policies' observation schema version (:mod:`adaptive.observation`); default: the newest the
    environment can show (4, with the draft steps' margins; 3 or 1 on traces recorded before margins were)"""

    def validate(self, where: str) -> None:
        _one_of(f"{where}.backend", self.backend, ("replay", "synthetic", "live"))
        _at_least(f"{where}.max_depth", self.max_depth, 1)
        _at_least(f"{where}.decision_seconds", self.decision_seconds, 0.0)
        for alpha in self.alphas:
            if not 0.0 <= alpha < 1.0:
                raise ConfigError(f"{where}.alphas: every alpha must lie in [0, 1), got {alpha}")
        if not self.alphas:
            raise ConfigError(f"{where}.alphas: give at least one alpha")
        if not 0.0 <= self.switch_prob <= 1.0:
            raise ConfigError(f"{where}.switch_prob must lie in [0, 1], got {self.switch_prob}")
        _at_least(f"{where}.c", self.c, 0.0)
        _at_least(f"{where}.g", self.g, 1e-9)
        _at_least(f"{where}.max_new_tokens", self.max_new_tokens, 2)
        _one_of(f"{where}.split", self.split, ("train", "val", "test"))
        _at_least(f"{where}.temperature", self.temperature, 0.0)
        _at_least(f"{where}.tree_size", self.tree_size, 1)
        if self.profile != "auto" and self.backend != "synthetic" and not Path(self.profile).is_file():
            raise ConfigError(f"{where}.profile must be auto or an existing profile file (adaptive profile --out FILE), got {self.profile!r}")
        if self.copy and (self.backend != "replay" or self.tree):
            raise ConfigError(
                f"{where}.copy needs {where}.backend replay with chain traces (recorded with --copy), got {self.backend!r}{' with tree' if self.tree else ''}"
            )
        if self.observation_version is not None:
            _one_of(f"{where}.observation_version", self.observation_version, VERSIONS[self.copy])
        if self.tree and self.backend != "replay":
            raise ConfigError(f"{where}.tree needs {where}.backend replay (tree policies train on greedy tree traces, replayed), got {self.backend!r}")


@dataclass
class PPOConfig:
    net: list[int] = field(default_factory=lambda: [64, 64])
    """hidden layer sizes of the policy and value MLPs"""
    learning_rate: float = 1e-3
    lr_schedule: str = "linear"
    """linear (decay to 0 over each training phase) | constant"""
    n_steps: int = 2048
    batch_size: int = 256
    n_epochs: int = 10
    gamma: float = 0.999
    gae_lambda: float = 0.95
    ent_coef: float = 0.01
    clip_range: float = 0.2
    timesteps: int = 20_000
    """environment steps per co-training round"""

    def validate(self, where: str) -> None:
        if not self.net or any(n < 1 for n in self.net):
            raise ConfigError(f"{where}.net must be a non-empty list of positive layer sizes, got {self.net}")
        _at_least(f"{where}.learning_rate", self.learning_rate, 1e-12)
        _one_of(f"{where}.lr_schedule", self.lr_schedule, ("linear", "constant"))
        _at_least(f"{where}.n_steps", self.n_steps, 2)
        _at_least(f"{where}.batch_size", self.batch_size, 2)
        _at_least(f"{where}.n_epochs", self.n_epochs, 1)
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{where}.{name} must lie in [0, 1], got {getattr(self, name)}")
        _at_least(f"{where}.ent_coef", self.ent_coef, 0.0)
        _at_least(f"{where}.clip_range", self.clip_range, 1e-9)
        _at_least(f"{where}.timesteps", self.timesteps, 1)


def _size_defaults() -> PPOConfig:
    return PPOConfig(net=[256, 64], gamma=0.9)


@dataclass
class CotrainingConfig:
    rounds: int = 1
    """alternations: each trains the depth policy (size frozen), then the size policy (depth frozen)"""
    train_size: bool = False
    """also train a verification-size policy (chains: verifying fewer than drafted rarely pays)"""
    random_depth_first: bool = True
    """the size policy's first phase sees random depths, as in Learning to Draft"""
    train_source: bool = False
    """also train a source policy (env.copy: what drafts each round), first in every round"""

    def validate(self, where: str) -> None:
        _at_least(f"{where}.rounds", self.rounds, 1)


@dataclass
class TrackingConfig:
    wandb: str = "offline"
    """offline | online | disabled"""
    project: str = "adaptive-draft"
    group: str | None = None
    """W&B group (default: the experiment name)"""

    def validate(self, where: str) -> None:
        _one_of(f"{where}.wandb", self.wandb, ("offline", "online", "disabled"))


@dataclass
class ExperimentConfig:
    name: str = "experiment"
    seed: int = 0
    pair: str = "smollm2-135m"
    dtype: str = DEFAULT_DTYPE
    """the pair's precision for live decoding and measured profiles: auto (bfloat16 where this machine multiplies it
    natively, else float32), float32, bfloat16 or float16"""
    engine: str = DEFAULT_ENGINE
    """the target's forward for live decoding and measured profiles: auto (compiled-int4 where it runs, else eager;
    adaptive.engines.resolve_engine), eager (transformers), lean, lean-int8, lean-int4, lean-int4-aten, compiled,
    compiled-int8, compiled-int4 or compiled-int4-aten (adaptive.engines.ENGINES); replay reads the shipped traces recorded on the profile's engine"""
    env: EnvConfig = field(default_factory=EnvConfig)
    depth_policy: PPOConfig = field(default_factory=PPOConfig)
    size_policy: PPOConfig = field(default_factory=_size_defaults)
    source_policy: PPOConfig = field(default_factory=_size_defaults)
    cotraining: CotrainingConfig = field(default_factory=CotrainingConfig)
    checkpoint_every: int = 10_000
    """environment steps between checkpoints (a killed run loses at most this much)"""
    eval_episodes: int = 20
    """episodes on which the final policies and the baselines are compared after training"""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    init_from: str | None = None
    """a run folder whose final checkpoints start training (retargeting: a short re-training on a new
    profile); its network sizes are kept"""

    def validate(self) -> None:
        if not self.name or "/" in self.name:
            raise ConfigError(f"name must be a non-empty string without '/', got {self.name!r}")
        if self.init_from is not None and not ((Path(self.init_from) / "checkpoints").is_dir() and (Path(self.init_from) / "state.json").is_file()):
            raise ConfigError(f"init_from must be a training run folder (with state.json and checkpoints/), got {self.init_from!r}")
        _one_of("dtype", self.dtype, DTYPE_CHOICES)
        _one_of("engine", self.engine, (AUTO, *ENGINES))
        _at_least("checkpoint_every", self.checkpoint_every, 1)
        _at_least("eval_episodes", self.eval_episodes, 1)
        self.env.validate("env")
        self.depth_policy.validate("depth_policy")
        self.size_policy.validate("size_policy")
        self.source_policy.validate("source_policy")
        if self.cotraining.train_source and not self.env.copy:
            raise ConfigError("cotraining.train_source needs env.copy: true (a copy drafter beside the model to choose from)")
        self.cotraining.validate("cotraining")
        self.tracking.validate("tracking")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """Short hash of the resolved config (stored with trained policies)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment YAML: a path, or the name of a shipped config (``quickstart``)."""
    path = shipped_experiment(str(path))
    if not path.is_file():
        shipped = sorted(p.stem for p in (shipped_root() / "experiments").glob("*.yaml"))
        raise ConfigError(f"config file {path} does not exist (shipped configs, by name: {', '.join(shipped) or 'none found'})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}: {getattr(error, 'problem', None) or error}") from None
    if data is None:
        raise ConfigError(f"config file {path} is empty; an experiment names at least its 'name' (see experiments/quickstart.yaml)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    if "name" not in data:
        raise ConfigError(f"config file {path} names no experiment: add a line 'name: ...' (run folders and policies are called by it)")
    return config_from_dict(data)


def config_from_dict(data: dict) -> ExperimentConfig:
    """Build and validate a config from a (YAML-like) mapping."""
    config = _build(ExperimentConfig, data, "")
    config.validate()
    return config


def _build(cls, data: dict, where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            raise ConfigError(f"unknown key {path!r}; allowed in {where or 'the top level'}: {', '.join(fields)}")
        values[key] = _convert(hints[key], value, path)
    return cls(**values)


def _convert(hint, value, path: str):
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        hint = next(o for o in options if o is not type(None))
        origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{path} must be a list of {item.__name__}, got {value!r}")
        return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint in (str, bool) and isinstance(value, hint):
        return value
    raise ConfigError(f"{path} must be {hint.__name__}, got {value!r}")


def _one_of(path: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{path} must be one of {', '.join(map(str, allowed))}; got {value!r}")


def _at_least(path: str, value, minimum) -> None:
    if value < minimum:
        raise ConfigError(f"{path} must be >= {minimum}, got {value!r}")
