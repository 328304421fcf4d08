"""Gymnasium environments around the speculative decoder: live, exact trace replay, synthetic cost model.

``SpecDecodeEnv`` (envs.env) takes a backend (``LiveBackend``, ``ReplayBackend``, ``SyntheticBackend``);
``gymnasium.make`` knows them by id once this package is imported:

* ``adaptive/SpecDecode-Replay-v0``: shipped (or given) traces + cost profile; kwargs of :func:`make_replay_env`
* ``adaptive/SpecDecode-TreeReplay-v0``: shipped (or given) tree traces + cost profile; kwargs of :func:`make_tree_replay_env`
* ``adaptive/SpecDecode-Synthetic-v0``: kwargs of :func:`make_synthetic_env`
* ``adaptive/SpecDecode-Live-v0``: real models, real clock; kwargs of :func:`make_live_env`
"""

from __future__ import annotations

import gymnasium as gym

from adaptive.observation import ObservationSchema, SchemaMismatch
from envs.backend import Backend, Cycle
from envs.env import SpecDecodeEnv
from envs.factory import DEFAULT_PROFILE, default_traces, make_live_env, make_replay_env, make_synthetic_env, make_tree_replay_env

ENV_IDS = {
    "replay": "adaptive/SpecDecode-Replay-v0",
    "tree_replay": "adaptive/SpecDecode-TreeReplay-v0",
    "synthetic": "adaptive/SpecDecode-Synthetic-v0",
    "live": "adaptive/SpecDecode-Live-v0",
}

for _kind, _factory in (("replay", "make_replay_env"), ("tree_replay", "make_tree_replay_env"), ("synthetic", "make_synthetic_env"), ("live", "make_live_env")):
    if ENV_IDS[_kind] not in gym.registry:
        gym.register(ENV_IDS[_kind], entry_point=f"envs.factory:{_factory}")

__all__ = [
    "Backend",
    "Cycle",
    "DEFAULT_PROFILE",
    "ENV_IDS",
    "ObservationSchema",
    "SchemaMismatch",
    "SpecDecodeEnv",
    "default_traces",
    "make_live_env",
    "make_replay_env",
    "make_tree_replay_env",
    "make_synthetic_env",
]
