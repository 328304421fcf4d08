"""The environment an experiment config describes (timed by the run's cost profile, loaded once), and the
replay evaluation of a policy in it against every static depth and the oracle."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from adaptive.pair import load_pair
from adaptive.policy import DraftPolicy
from adaptive.profile import CostProfile
from adaptive.profiling import profile_pair
from envs.env import SpecDecodeEnv
from envs.factory import make_live_env, make_replay_env, make_synthetic_env, make_tree_replay_env
from lab.background import live_measurement
from lab.config import ExperimentConfig
from lab.evaluation import play, static_sweep, summarise
from policies.baselines import SuffixRule
from policies.oracle import OraclePolicy

log = logging.getLogger(__name__)


AUTO = "auto"
QUICK_CONTEXTS = (64, 128, 256)
"""Contexts a measured-at-start profile covers (replay interpolates between them)."""
TREE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
"""Verified-node counts tree grid search tries (those the traces and profile allow); a tree experiment's profile times
verifications up to the largest, so that its size policy chooses over the same range."""


def quick_profile(pair, max_verify: int, tree_mask: bool = False) -> CostProfile:
    """A short profile of a loaded pair on this machine: interleaved sweeps at three contexts, medians."""
    start = time.perf_counter()
    profile = profile_pair(pair.target, pair.draft, max_verify=max_verify, contexts=QUICK_CONTEXTS, reference_context=128, repetitions=5, tree_mask=tree_mask)
    return profile.with_metadata(measure_seconds=round(time.perf_counter() - start, 1))


def measure_profile(config: ExperimentConfig, folder: Path, max_verify: int | None = None, pair=None) -> Path:
    """A short profile of the config's pair (``pair``, already loaded, or loaded now) on this machine (interleaved
    sweeps, medians; well under a minute at bf16), saved as ``folder/profile.json``: draft step and verification of
    1 to ``max_verify`` tokens (default: the depth cap + 1, or for tree configs the largest of :data:`TREE_SIZES` + 1)
    at three contexts."""
    env = config.env
    if max_verify is None:
        max_verify = max(env.max_depth, max(TREE_SIZES) if env.tree else 0) + 1
    pair = pair or load_pair(config.pair, config.dtype, engine=config.engine)
    with live_measurement():  # this project's background jobs wait meanwhile (lab.background)
        profile = quick_profile(pair, max_verify, env.tree).with_metadata(measured_for=config.name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "profile.json"
    profile.save(path)
    log.info(
        "measured a cost profile of %s on this machine in %.0f s: target step %.1f ms, c %.3f -> %s",
        config.pair,
        profile.document["measure_seconds"],
        profile.target_step_seconds * 1e3,
        profile.c,
        path,
    )
    return path


def decoding_engine(config: ExperimentConfig) -> str:
    """The engine a run decodes on: the config's, or for ``auto`` that of its profile file (an ``auto`` profile:
    ``auto``, which :func:`adaptive.engines.resolve_engine` settles when the pair loads)."""
    if config.engine != AUTO or config.env.profile == AUTO or config.env.backend == "synthetic":
        return config.engine
    return CostProfile.load(config.env.profile).engine


def resolve_profile(config: ExperimentConfig, folder: Path, max_verify: int | None = None, pair=None) -> CostProfile | None:
    """Point ``config.env.profile`` at a file: an ``auto`` profile is measured now into ``folder`` (on ``pair`` if
    the run has loaded it, see :func:`decoding_engine`). An ``auto`` engine becomes the profile's: the one just
    measured on (:func:`adaptive.engines.resolve_engine`), or the one a given profile file was measured on, so that
    live decoding, replay's traces and the profile agree. Returns the profile (None for the synthetic backend)."""
    if config.env.backend == "synthetic":
        return None
    if config.env.profile == AUTO:
        config.env.profile = str(measure_profile(config, folder, max_verify, pair))
    profile = CostProfile.load(config.env.profile)
    measured_on = profile.engine
    if config.engine == AUTO:
        config.engine = measured_on
    elif config.engine != measured_on:
        log.warning("%s was measured on engine %s, this run decodes on %s: its costs are not this engine's", config.env.profile, measured_on, config.engine)
    return profile


def run_profile(config: ExperimentConfig) -> CostProfile | None:
    """The cost profile a run times its cycles with (None for the synthetic backend, which has its own c and g)."""
    return None if config.env.backend == "synthetic" else CostProfile.load(config.env.profile)


def make_env(config: ExperimentConfig, decision: str, partner: DraftPolicy | None, profile: CostProfile | None, evaluation: bool = False) -> SpecDecodeEnv:
    """The environment a config describes, timed by ``profile`` (``evaluation``: replay on the val traces instead
    of train); its observation schema ``env.observation_version`` (default: the newest it can show)."""
    env = config.env
    version = env.observation_version
    if env.backend == "replay":
        traces = (env.eval_traces or ("val" if env.traces == "train" else env.traces)) if evaluation else env.traces
        if env.tree:
            return make_tree_replay_env(traces, profile, env.max_depth, env.tree_size, decision, partner, env.decision_seconds, schema_version=version)
        return make_replay_env(traces, profile, env.max_depth, decision, partner, env.decision_seconds, copy=env.copy, schema_version=version)
    if env.backend == "synthetic":
        return make_synthetic_env(
            env.alphas, env.c, env.g, env.switch_prob, env.max_depth, env.max_new_tokens, 0.1, decision, partner, env.decision_seconds, schema_version=version
        )
    return make_live_env(
        config.pair,
        env.split,
        profile,
        env.max_depth,
        env.max_new_tokens,
        env.temperature,
        decision,
        partner,
        env.decision_seconds,
        dtype=config.dtype,
        schema_version=version,
        engine=config.engine,
    )


def evaluate(config: ExperimentConfig, policy: DraftPolicy, profile: CostProfile | None) -> dict[str, dict]:
    """Speedup over plain decoding (with its 95 % bootstrap interval over episodes: ``low``, ``high``) of the
    learned policy, every static depth and (replay) the oracle, on ``eval_episodes`` episodes of the
    evaluation env (replay: val traces). With a copy drafter beside the
    model (``env.copy``), also every static depth with each other source and SuffixDecoding's rule (the
    oracle knows the model draft's match lengths only)."""
    env = make_env(config, "depth", None, profile, evaluation=True)
    backend = env.backend
    prompts = list(range(min(config.eval_episodes, backend.num_prompts)))
    seconds = config.env.decision_seconds
    runs = {"learned": play(backend, lambda: policy, prompts, None, seconds)}
    runs.update({f"static:{depth}": records for depth, records in static_sweep(backend, prompts, config.env.max_depth, seconds).items()})
    for source in backend.sources[1:]:
        runs.update({f"static:{depth}:{source}": records for depth, records in static_sweep(backend, prompts, config.env.max_depth, seconds, source).items()})
    if len(backend.sources) > 1:
        runs["suffix"] = play(backend, SuffixRule, prompts, None, seconds)
    if config.env.backend == "replay" and not config.env.tree:
        runs["oracle (model draft)" if len(backend.sources) > 1 else "oracle"] = play(backend, lambda: OraclePolicy(backend), prompts, None, seconds)
    summaries = {name: summarise(records, backend.target_step_seconds) for name, records in runs.items()}
    return {name: {"speedup": s.speedup, "low": s.low, "high": s.high, "tokens": s.tokens, "seconds": s.seconds} for name, s in summaries.items()}
