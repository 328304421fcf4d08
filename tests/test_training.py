"""PPO training: reaches the known optimum, learns to adapt, resumes after kill -9, validates configs,
and its exported policies run in the decoder and refuse other observation schemas."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from adaptive.costmodel import optimal_gamma
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.learned_policy import load_policy
from adaptive.observation import ObservationSchema, SchemaMismatch
from lab.config import ConfigError, config_from_dict, load_config
from lab.training import resume, train
from policies import make_policy

ROOT = Path(__file__).resolve().parents[1]


def synthetic(name: str, timesteps: int, **env) -> dict:
    return {
        "name": name,
        "seed": 0,
        "env": {"backend": "synthetic", "max_depth": 8, "max_new_tokens": 256, "decision_seconds": 0.0, **env},
        "depth_policy": {"timesteps": timesteps, "n_steps": 1024, "batch_size": 256, "n_epochs": 5},
        "eval_episodes": 40,
        "tracking": {"wandb": "disabled"},
    }


def test_depth_policy_reaches_97_percent_of_the_cost_model_optimum(tmp_path):
    alpha, c = 0.8, 0.3
    train(config_from_dict(synthetic("constant", 24_000, alphas=[alpha], c=c)), tmp_path / "run")
    evaluation = json.loads((tmp_path / "run" / "evaluation.json").read_text())
    best = optimal_gamma(alpha, c, 1.0, max_gamma=8).gamma
    assert max((k for k in evaluation if k.startswith("static")), key=lambda k: evaluation[k]["speedup"]) == f"static:{best}"
    assert evaluation["learned"]["speedup"] >= 0.97 * evaluation[f"static:{best}"]["speedup"]


def test_adaptivity_pays_when_acceptance_switches_between_hidden_regimes(tmp_path):
    config = synthetic("regimes", 24_000, alphas=[0.2, 0.9], switch_prob=0.05, c=0.1)
    train(config_from_dict(config), tmp_path / "run")
    evaluation = json.loads((tmp_path / "run" / "evaluation.json").read_text())
    best_static = max(v["speedup"] for k, v in evaluation.items() if k.startswith("static"))
    assert evaluation["learned"]["speedup"] > 1.02 * best_static


def test_training_resumes_after_kill_9(tmp_path):
    config = synthetic("resumable", 8_000, alphas=[0.7], c=0.1)
    config["checkpoint_every"] = 1000
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "lab.cli", "train", str(path), "--runs", str(tmp_path / "runs")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    state = None
    while time.time() < deadline:
        states = list((tmp_path / "runs").glob("*/state.json"))
        if states and json.loads(states[0].read_text())["done"] >= 3000:
            state = states[0]
            break
        time.sleep(0.2)
    assert state is not None, "no checkpoint within 120 s"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    run = state.parent
    assert not (run / "final").exists()
    killed_at = json.loads(state.read_text())["done"]
    resume(run)
    assert (run / "final" / "policy.json").is_file()
    rows = (run / "metrics.csv").read_text().splitlines()[1:]
    steps = [int(r.split(",")[2]) for r in rows]
    assert steps == sorted(steps) and steps[-1] >= 8_000 and any(s <= killed_at for s in steps)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"depth_policy": {"lr": 0.1}}, "unknown key 'depth_policy.lr'"),
        ({"env": {"backend": "cloud"}}, "env.backend must be one of replay, synthetic, live"),
        ({"env": {"max_depth": "eight"}}, "env.max_depth must be int"),
        ({"cotraining": {"rounds": 0}}, "cotraining.rounds must be >= 1"),
        ({"tracking": {"wandb": "maybe"}}, "tracking.wandb must be one of offline, online, disabled"),
        ({"env": {"alphas": [0.5, 1.2]}}, "env.alphas"),
        ({"colour": "red"}, "unknown key 'colour'"),
        (
            {"engine": "fast"},
            "engine must be one of auto, eager, lean, lean-int8, lean-int4, lean-int4-aten, "
            "compiled, compiled-int8, compiled-int4, compiled-int4-aten; got 'fast'",
        ),
    ],
)
def test_config_errors_name_the_key(data, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        config_from_dict(data)


def test_shipped_experiment_configs_are_valid():
    for path in (ROOT / "experiments").glob("*.yaml"):
        load_config(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trained") / "run"
    config = synthetic("small", 2_048, alphas=[0.7], c=0.1)
    config["env"]["max_depth"] = 4
    train(config_from_dict(config), folder)
    return folder


def test_load_policy_rejects_another_observation_schema(trained):
    load_policy(trained, schema=ObservationSchema(4))
    with pytest.raises(SchemaMismatch, match="max_depth"):
        load_policy(trained, schema=ObservationSchema(8))
    sidecar = trained / "final" / "policy.json"
    data = json.loads(sidecar.read_text())
    version, data["schema"]["version"] = data["schema"]["version"], 99
    sidecar.write_text(json.dumps(data))
    try:
        with pytest.raises(SchemaMismatch, match="version"):
            load_policy(trained)
    finally:
        data["schema"]["version"] = version
        sidecar.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="pair"):
        load_policy(trained, pair="smollm2-135m")


def test_a_learned_policy_drives_the_decoder_exactly(trained, target, near_draft):
    policy = make_policy(str(trained))
    result = SpeculativeDecoder(target, near_draft, policy, max_depth=8).generate([1, 4, 6], 40)
    assert result.token_ids == generate_plain(target, [1, 4, 6], 40).token_ids
    assert all(1 <= r.drafted <= 4 for r in result.rounds[:-1])
    assert (trained / "plots" / "training.png").is_file() and (trained / "metrics.csv").is_file()


def test_tracker_failures_never_stop_the_work(tmp_path):
    from lab.tracking import Tracker

    broken = Tracker("no-such-mode", "p", "g", "n", {}, tmp_path)
    broken.log({"x": 1})
    broken.finish()
    offline = Tracker("offline", "adaptive-draft-test", "g", "n", {"a": 1}, tmp_path)
    offline.log({"x": 1.0}, step=1)
    offline.log_table("t", ["policy", "speedup"], [["a", 1.1]])
    offline.log_bar_chart("c", ["a", "b"], [1.1, 0.9], "speedup", "title")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.plot([0, 1]), plt.savefig(tmp_path / "p.png"), plt.close()
    offline.log_images({"plot/p": tmp_path / "p.png"})
    assert offline.run is not None  # nothing above failed (a failure drops the run)
    offline.finish()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_an_unreachable_wandb_server_never_stops_training(tmp_path, monkeypatch):
    """tracking.wandb: online, the server unreachable: W&B gives up after WANDB_INIT_TIMEOUT seconds (bounded
    here at 5, set after wandb was first imported and used, as in a long session) and the run trains,
    evaluates and exports as without tracking."""
    from lab.tracking import Tracker

    monkeypatch.delenv("WANDB_MODE", raising=False)
    Tracker("offline", "adaptive-draft-test", "g", "first", {}, tmp_path / "first").finish()
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    config = synthetic("unreachable", 1_024, alphas=[0.7], c=0.1)
    config["tracking"] = {"wandb": "online"}
    start = time.perf_counter()
    train(config_from_dict(config), tmp_path / "run")
    assert (tmp_path / "run" / "evaluation.json").is_file() and (tmp_path / "run" / "final" / "policy.json").is_file()
    assert time.perf_counter() - start < 60


def test_training_is_reproducible_from_its_seed(tmp_path):
    config = synthetic("repeat", 2_048, alphas=[0.3, 0.9], switch_prob=0.1, c=0.1)
    for name in ("a", "b"):
        train(config_from_dict(config), tmp_path / name)
    first, second = ((tmp_path / n / "evaluation.json").read_text() for n in ("a", "b"))
    assert first == second
    strip = lambda text: [line.rsplit(",", 1)[0] for line in text.splitlines()]  # noqa: E731 - last column is wall time
    assert strip((tmp_path / "a" / "metrics.csv").read_text()) == strip((tmp_path / "b" / "metrics.csv").read_text())


def test_the_decoder_policy_agrees_with_the_trained_network(trained):
    """The NumPy forward used while decoding gives the torch MLP's decision on environment observations."""
    import numpy as np
    import torch

    from lab.environments import make_env, run_profile

    policy = load_policy(trained)
    config = config_from_dict(yaml.safe_load((trained / "config.yaml").read_text()))
    env = make_env(config, "depth", None, run_profile(config))
    obs, _ = env.reset(seed=0)
    for _ in range(200):
        state = env.unwrapped.draft_state() if hasattr(env, "unwrapped") else env.draft_state()
        np.testing.assert_allclose(policy.observation(state), obs, atol=1e-6)
        with torch.no_grad():
            expected = int(policy.depth_net(torch.from_numpy(obs)).argmax())
        assert int(policy.should_continue(state)) == expected or state.depth >= state.max_depth
        obs, _, terminated, _, _ = env.step(expected)
        if terminated:
            obs, _ = env.reset()


def test_a_learned_policy_builds_each_round_incrementally_and_rebuilds_on_new_steps(trained):
    """Within a round the policy adds only the new steps to its observation, yet every observation equals a
    fresh policy's; steps replaced under the same round (features computed afterwards) rebuild the round."""
    import numpy as np

    from adaptive.policy import DraftState, DraftStep

    def steps(top1: float, n: int) -> list[DraftStep]:
        return [DraftStep(5, top1, 0.3 * i, -0.2, -0.2 * (i + 1), 0, top1 / 2) for i in range(n)]

    policy = load_policy(trained)
    first, second = steps(0.9, 4), steps(0.2, 4)
    rounds = ((30, (2, 3), first), (33, (2, 3, 2), second))
    states = [DraftState(context, tuple(drafted[:depth]), 4, recent) for context, recent, drafted in rounds for depth in range(1, 5)]
    states.append(DraftState(33, tuple(steps(0.6, 4)), 4, (2, 3, 2)))  # the last round's steps, features recomputed
    for state in states:
        np.testing.assert_array_equal(policy.observation(state), load_policy(trained).observation(state))
        assert policy.should_continue(state) == load_policy(trained).should_continue(state)


def profile_document(c: float = 0.1, copy_ms: float = 0.05) -> dict:
    """A cost-profile document like `adaptive profile` writes: target step 10 ms, +1 ms per extra verified token."""
    point = lambda ms: {"median_ms": ms, "p25_ms": ms, "p75_ms": ms}  # noqa: E731
    verify = {str(n): point(10.0 + n - 1) for n in range(1, 34)}
    return {
        "contexts": [1], "reference_context": 1, "draft_step": {"1": point(10.0 * c)}, "verify": {"1": verify},
        "copy_step": {"1": point(copy_ms)}, "c": c, "g": {str(k): (10.0 + k) / 10.0 for k in range(33)},
        "target_step_ms": 10.0, "hardware": {"machine": "test"},
    }  # fmt: skip


def test_a_source_policy_co_trains_with_the_depth_policy_and_drives_the_decoder(tmp_path, target, near_draft):
    """Replay of traces holding the copy drafter's chains: a source phase, then a depth phase partnered with it;
    the exported policy (observation schema 3) picks sources in the live decoder, whose output stays greedy."""
    from adaptive.copy_draft import CopyDraft
    from adaptive.recorder import record

    prompts = [[15, 0, 9, 4, 2, 11, 15, 0, 9], [1, 2, 3, 1, 2], [7, 7, 7, 7], [5, 6, 5, 6, 5]]
    decoder = SpeculativeDecoder(target, near_draft, make_policy("static:1"))
    traces = record(decoder, [{"id": str(i), "lang": "en"} for i in range(len(prompts))], prompts, 40, 4, {}, copy=CopyDraft())
    traces.save(tmp_path / "copy.npz")
    (tmp_path / "profile.json").write_text(json.dumps(profile_document()))
    config = {
        "name": "sources",
        "env": {"traces": str(tmp_path / "copy.npz"), "profile": str(tmp_path / "profile.json"), "max_depth": 4, "copy": True},
        "depth_policy": {"timesteps": 1024, "n_steps": 512, "batch_size": 128, "n_epochs": 2},
        "source_policy": {"timesteps": 1024, "n_steps": 512, "batch_size": 128, "n_epochs": 2},
        "cotraining": {"train_source": True},
        "eval_episodes": 4,
        "tracking": {"wandb": "disabled"},
    }
    final = train(config_from_dict(config), tmp_path / "run")
    metrics = (tmp_path / "run" / "metrics.csv").read_text()
    assert ",source," in metrics and ",depth," in metrics
    evaluation = json.loads((tmp_path / "run" / "evaluation.json").read_text())
    assert {"learned", "static:4", "static:4:copy", "static:4:copy+model", "suffix", "oracle (model draft)"} <= set(evaluation)
    policy = load_policy(final)
    assert policy.source_net is not None and policy.metadata["schema"]["version"] == 4
    live = SpeculativeDecoder(target, near_draft, policy, max_depth=4, copy=CopyDraft())
    for prompt in prompts:
        result = live.generate(prompt, 30)
        assert result.token_ids == generate_plain(target, prompt, 30).token_ids
    with pytest.raises(ConfigError, match="train_source needs env.copy"):
        config_from_dict({"cotraining": {"train_source": True}})


def test_a_run_evaluates_on_its_eval_traces():
    from adaptive.profile import CostProfile
    from lab.environments import make_env

    profile = CostProfile.load(ROOT / "profiles" / "smollm2-135m.json")
    config = load_config(ROOT / "experiments" / "quickstart.yaml")
    assert make_env(config, "depth", None, profile, evaluation=True).backend.traces.prompt_ids == load_traces("val").prompt_ids
    config.env.traces, config.env.eval_traces = "val", str(ROOT / "data" / "traces" / "smollm2-135m-test.npz")
    assert make_env(config, "depth", None, profile, evaluation=True).backend.traces.prompt_ids == load_traces("test").prompt_ids
    assert make_env(config, "depth", None, profile).backend.traces.prompt_ids == load_traces("val").prompt_ids


def load_traces(split: str):
    from adaptive.traces import TraceSet

    return TraceSet.load(ROOT / "data" / "traces" / f"smollm2-135m-{split}.npz")


def test_an_auto_engine_becomes_the_engine_of_the_profile_a_run_is_timed_by(tmp_path, caplog):
    """The quickstart's engine is auto: timed by a given profile file, it decodes on that profile's engine (the shipped
    eager profile: eager), so live decoding, replay's traces and the costs agree; a named engine other than the
    profile's is kept and warned about."""
    from lab.environments import resolve_profile

    config = load_config(ROOT / "experiments" / "quickstart.yaml")
    assert config.engine == "auto"
    config.env.profile = str(ROOT / "profiles" / "smollm2-135m.json")
    resolve_profile(config, tmp_path)
    assert config.engine == "eager"
    config.engine = "compiled-int4"
    resolve_profile(config, tmp_path)
    assert config.engine == "compiled-int4" and "measured on engine eager, this run decodes on compiled-int4" in caplog.text
