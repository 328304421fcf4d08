"""Environment constructors by backend (the entry points ``gymnasium.make`` uses)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from adaptive.costmodel import GCurve
from adaptive.decoder import SpeculativeDecoder
from adaptive.engines import DEFAULT_ENGINE, engine_of
from adaptive.pair import load_pair
from adaptive.policy import BasePolicy, DraftPolicy
from adaptive.precision import DEFAULT_DTYPE
from adaptive.profile import CostProfile
from adaptive.sampling import SamplingConfig
from adaptive.shipped import shipped_root
from adaptive.traces import TraceSet
from adaptive.tree_traces import TreeTraceSet
from adaptive.workload import chat_ids, load_prompts
from envs.env import DEFAULT_DECISION_SECONDS, SpecDecodeEnv
from envs.live import LiveBackend
from envs.replay import ReplayBackend
from envs.synthetic import SyntheticBackend
from envs.tree_replay import TreeReplayBackend

ROOT = shipped_root()
DEFAULT_PROFILE = ROOT / "profiles" / "smollm2-135m.json"
TREE_PROFILE = ROOT / "profiles" / "smollm2-135m-tree.json"
"""Verification timed with a tree attention mask, up to 64 nodes (``adaptive profile --tree-mask --max-verify 64``)."""
TRACES = ROOT / "data" / "traces"


def engine_suffix(engine: str) -> str:
    """What a shipped trace file's name ends with for traces recorded on ``engine`` (nothing for eager)."""
    return "" if engine == "eager" else f"-{engine}"


def default_traces(split: str = "train", pair: str = "smollm2-135m", tree: bool = False, copy: bool = False, engine: str = "eager") -> Path:
    """Path of the shipped greedy traces of ``pair`` for ``split`` (``tree``: tree traces; ``copy``: chain
    traces holding the copy drafter's chains too, every task type), recorded on ``engine`` (a low-bit target
    accepts differently from eager's); ``adaptive record`` makes more."""
    if tree and copy:
        raise ValueError("copy drafter chains are recorded in chain traces, not tree traces")
    path = TRACES / f"{pair}-{split}{'-tree' if tree else ''}{'-copy' if copy else ''}{engine_suffix(engine)}.npz"
    if not path.is_file():
        shipped = sorted(p.name for p in TRACES.glob("*.npz")) if TRACES.is_dir() else []
        record = f"adaptive record --pair {pair} --engine {engine} --split {split}{' --tree K,W,V' if tree else ''}{' --copy' if copy else ''}"
        raise FileNotFoundError(
            f"no shipped traces for pair {pair!r}, split {split!r}, engine {engine!r} at {path}; shipped: {shipped or 'none'}. "
            f"Record them ({record}), or time the run with a profile of the engine the shipped ones were recorded on"
        )
    return path


def make_replay_env(
    traces: str | Path | TraceSet = "train",
    profile: str | Path | CostProfile = DEFAULT_PROFILE,
    max_depth: int | None = None,
    decision: str = "depth",
    partner: DraftPolicy | None = None,
    decision_seconds: float = DEFAULT_DECISION_SECONDS,
    episode: str = "cycle",
    copy: bool = False,
    schema_version: int | None = None,
) -> SpecDecodeEnv:
    """Replay env. ``traces``: a split name of the shipped traces ("train", "val"; with ``copy``, the copy
    traces; those recorded on the profile's engine), a trace file or a TraceSet; ``copy``: a copy drafter beside
    the model (the traces must hold its chains)."""
    if not isinstance(profile, CostProfile):
        profile = CostProfile.load(profile)
    if not isinstance(traces, TraceSet):
        path = Path(traces)
        traces = TraceSet.load(path if path.suffix == ".npz" else default_traces(str(traces), copy=copy, engine=profile.engine))
    if copy and traces.copy is None:
        raise ValueError("these traces hold no copy-drafter chains; record them with `adaptive record --copy`")
    return SpecDecodeEnv(ReplayBackend(traces, profile, max_depth, copy=copy), decision, partner, decision_seconds, episode, schema_version)


def make_tree_replay_env(
    traces: str | Path | TreeTraceSet = "train",
    profile: str | Path | CostProfile = TREE_PROFILE,
    max_depth: int | None = None,
    size: int | None = None,
    decision: str = "depth",
    partner: DraftPolicy | None = None,
    decision_seconds: float = DEFAULT_DECISION_SECONDS,
    episode: str = "cycle",
    schema_version: int | None = None,
) -> SpecDecodeEnv:
    """Tree replay env. ``traces``: a split name of the shipped tree traces (those recorded on the profile's engine),
    a tree trace file or a TreeTraceSet; ``size``: the verified nodes V when no size policy decides (default: the traces' V)."""
    if not isinstance(profile, CostProfile):
        profile = CostProfile.load(profile)
    if not isinstance(traces, TreeTraceSet):
        path = Path(traces)
        traces = TreeTraceSet.load(path if path.suffix == ".npz" else default_traces(str(traces), tree=True, engine=profile.engine))
    return SpecDecodeEnv(TreeReplayBackend(traces, profile, max_depth, size), decision, partner, decision_seconds, episode, schema_version)


def make_synthetic_env(
    alphas: float | Sequence[float] = 0.7,
    c: float = 0.05,
    g: GCurve = 1.0,
    switch_prob: float = 0.0,
    max_depth: int = 8,
    max_new_tokens: int = 256,
    feature_noise: float = 0.1,
    decision: str = "depth",
    partner: DraftPolicy | None = None,
    decision_seconds: float = 0.0,
    episode: str = "cycle",
    schema_version: int | None = None,
) -> SpecDecodeEnv:
    """Cost-model env: constant α, or Markov-modulated regimes ``alphas`` switching with ``switch_prob``."""
    backend = SyntheticBackend(alphas, c=c, g=g, switch_prob=switch_prob, max_depth=max_depth, max_new_tokens=max_new_tokens, feature_noise=feature_noise)
    return SpecDecodeEnv(backend, decision, partner, decision_seconds, episode, schema_version)


def make_live_env(
    pair: str = "smollm2-135m",
    split: str = "val",
    profile: str | Path | CostProfile = DEFAULT_PROFILE,
    max_depth: int = 8,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    decision: str = "depth",
    partner: DraftPolicy | None = None,
    decision_seconds: float = DEFAULT_DECISION_SECONDS,
    episode: str = "cycle",
    dtype: str = DEFAULT_DTYPE,
    schema_version: int | None = None,
    engine: str = DEFAULT_ENGINE,
) -> SpecDecodeEnv:
    """Live env over a named pair (at ``dtype``, its target run through ``engine``) and a workload split
    (chat-formatted prompts); ``profile`` (the observation's costs) must have been measured on that engine."""
    if not isinstance(profile, CostProfile):
        profile = CostProfile.load(profile)
    loaded = load_pair(pair, dtype, engine=engine)
    if engine_of(loaded.target) != profile.engine:
        raise ValueError(
            f"the profile was measured on engine {profile.engine!r}, the live pair runs {engine_of(loaded.target)!r}: "
            "measure one on this engine (profile: auto, or adaptive profile --engine E) or set the engine to the profile's"
        )
    decoder = SpeculativeDecoder(loaded.target, loaded.draft, BasePolicy(), SamplingConfig(temperature), tokenizer=loaded.tokenizer, max_depth=max_depth)
    prompts = [chat_ids(loaded.tokenizer, p["prompt"]) for p in load_prompts(split)]
    return SpecDecodeEnv(LiveBackend(decoder, prompts, profile, max_new_tokens), decision, partner, decision_seconds, episode, schema_version)
