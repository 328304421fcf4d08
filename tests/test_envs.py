"""Environments: replay equals live greedy decoding round for round, the synthetic env finds the cost
model's optimum, API conformance (Gymnasium and SB3 checkers, vectorised envs, seeding)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
from conftest import flat_profile
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

import envs
from adaptive.costmodel import optimal_gamma
from adaptive.decoder import SpeculativeDecoder
from adaptive.observation import ObservationSchema, SchemaMismatch
from adaptive.policy import DraftState
from adaptive.recorder import record
from adaptive.traces import with_margins
from envs.env import SpecDecodeEnv
from envs.factory import TRACES, default_traces
from envs.live import LiveBackend
from envs.replay import ReplayBackend
from envs.rollout import run_policy
from envs.synthetic import SyntheticBackend
from policies import make_policy
from policies.baselines import StaticDepth
from policies.oracle import OraclePolicy

PROMPTS = [[1, 4, 6], [9, 2, 2, 5, 11], [3], [7, 7, 1, 0]]
DEPTH = 6


@pytest.fixture(scope="module")
def traces(target, near_draft):
    decoder = SpeculativeDecoder(target, near_draft, make_policy("static:1"))
    rows = [{"id": str(i), "lang": "en"} for i in range(len(PROMPTS))]
    return record(decoder, rows, PROMPTS, max_new_tokens=40, depth=DEPTH, metadata={"pair": "tiny"})


@pytest.mark.parametrize("spec", ["static:1", "static:3", "static:6", "heuristic:2"])
def test_replay_accepts_what_live_greedy_decoding_accepts_round_for_round(target, near_draft, traces, spec):
    replayed = run_policy(ReplayBackend(traces, flat_profile()), make_policy(spec), range(len(PROMPTS)))
    for prompt, episode in zip(PROMPTS, replayed):
        live = SpeculativeDecoder(target, near_draft, make_policy(spec), max_depth=DEPTH).generate(prompt, 40)
        assert [c.accepted for c in episode.cycles] == [r.accepted for r in live.rounds]
        assert [c.emitted for c in episode.cycles] == [r.emitted for r in live.rounds]
        assert [c.drafted for c in episode.cycles] == [r.drafted for r in live.rounds]
    assert sum(c.accepted for e in replayed for c in e.cycles) > 10


class StepSpy(StaticDepth):
    """static:3 noting the features of every draft step it is shown."""

    reads_step_features = True

    def __init__(self) -> None:
        super().__init__(3)
        self.shown: list[tuple[float, float, float]] = []

    def should_continue(self, state: DraftState) -> bool:
        step = state.steps[-1]
        self.shown.append((step.top1_prob, step.entropy, step.margin))
        return super().should_continue(state)


def test_a_depth_decision_is_shown_the_same_step_features_live_and_in_replay(target, near_draft, traces):
    """Each draft step's top-1 probability, entropy and margin (top-1 minus top-2) reach the policy alike from
    the live decoder and from the recorded traces (stored in float16)."""
    replayed, live = StepSpy(), StepSpy()
    run_policy(ReplayBackend(traces, flat_profile()), replayed, range(len(PROMPTS)), decision_seconds=0.0)
    decoder = SpeculativeDecoder(target, near_draft, live, max_depth=DEPTH)
    for prompt in PROMPTS:
        decoder.generate(prompt, 40)
    assert len(replayed.shown) == len(live.shown) > 20
    np.testing.assert_allclose(replayed.shown, live.shown, atol=2e-3, rtol=2e-3)
    margins = [margin for _, _, margin in live.shown]
    assert all(0.0 <= m <= top1 for (top1, _, m) in live.shown) and len(set(np.round(margins, 3))) > 5


def test_replay_of_traces_without_margins_shows_the_former_schema(traces):
    """Traces recorded before margins were (NaN when read) train version 1 (3 with the copy drafter); asking
    them for version 4 is refused, naming the cure."""
    former = replace(traces, features=with_margins(traces.features[..., :3]))
    assert traces.has_margins and not former.has_margins
    assert SpecDecodeEnv(ReplayBackend(traces, flat_profile())).schema.version == 4
    assert SpecDecodeEnv(ReplayBackend(former, flat_profile())).schema.version == 1
    with pytest.raises(ValueError, match="margin.*re-record"):
        SpecDecodeEnv(ReplayBackend(former, flat_profile()), schema_version=4)


def test_live_backend_runs_the_real_decoder(target, near_draft):
    decoder = SpeculativeDecoder(target, near_draft, make_policy("static:1"), max_depth=DEPTH)
    episodes = run_policy(LiveBackend(decoder, PROMPTS, flat_profile(), max_new_tokens=40), make_policy("static:3"), [0, 1])
    for prompt, episode in zip(PROMPTS, episodes):
        live = SpeculativeDecoder(target, near_draft, make_policy("static:3"), max_depth=DEPTH).generate(prompt, 40)
        assert [c.accepted for c in episode.cycles] == [r.accepted for r in live.rounds]
        assert episode.seconds > 0 and all(c.draft_seconds > 0 for c in episode.cycles if c.drafted)


def test_oracle_is_at_least_as_fast_as_every_static_depth(traces):
    backend = ReplayBackend(traces, flat_profile())
    oracle = run_policy(backend, OraclePolicy(backend), range(len(PROMPTS)))
    oracle_speed = sum(e.tokens for e in oracle) / sum(e.seconds for e in oracle)
    for gamma in range(1, DEPTH + 1):
        static = run_policy(backend, make_policy(f"static:{gamma}"), range(len(PROMPTS)))
        assert oracle_speed >= sum(e.tokens for e in static) / sum(e.seconds for e in static)
    assert all(c.accepted == c.drafted or c.drafted == 1 for e in oracle for c in e.cycles if c.drafted < DEPTH)


def test_replay_charges_a_rule_nothing_per_decision_and_other_policies_the_configured_cost(traces):
    """A static depth's decisions cost about 2 µs live, so replay charges them nothing whatever the configured
    cost; a policy that reads the draft's features (here the confidence rule) pays the configured cost for every
    decision: one per depth decision and one per size decision, so at least one per round."""
    backend, cost = ReplayBackend(traces, flat_profile()), 1e-3

    def extra_decisions(spec: str) -> tuple[float, int]:
        charged = run_policy(backend, make_policy(spec), range(len(PROMPTS)), decision_seconds=cost)
        free = run_policy(backend, make_policy(spec), range(len(PROMPTS)), decision_seconds=0.0)
        rounds = sum(len(e.cycles) for e in free)
        return (sum(e.seconds for e in charged) - sum(e.seconds for e in free)) / cost, rounds

    static, _ = extra_decisions("static:3")
    assert static == pytest.approx(0.0, abs=1e-6)
    confidence, rounds = extra_decisions("confidence")
    assert confidence == pytest.approx(round(confidence), abs=1e-6) and round(confidence) >= rounds


def test_replay_prices_each_round_s_draft_steps_by_their_position(traces):
    """With a measured draft run (first step after the target's forward 3 ms, later ones 0.5 ms) every replayed round
    is charged the run's first steps: a round of d steps 3 + 0.5 (d - 1) ms, not d times the mean."""
    profile = replace(flat_profile(), draft_run_ms=((3.0, 0.5, 0.5, 0.5),))
    for episode in run_policy(ReplayBackend(traces, profile), make_policy("static:3"), range(len(PROMPTS))):
        for cycle in episode.cycles:
            assert cycle.draft_seconds == pytest.approx((3.0 + 0.5 * (cycle.drafted - 1)) * 1e-3 if cycle.drafted else 0.0)
    assert any(cycle.drafted == 3 for episode in run_policy(ReplayBackend(traces, profile), make_policy("static:3"), range(1)) for cycle in episode.cycles)


def test_replay_prices_a_round_s_first_step_by_what_the_last_round_emitted_and_charges_the_decoder_s_own_work(traces):
    """With a measured catch-up (the first draft step after a verification that emitted n tokens: 1 + n ms) and the
    decoder's own work (drafting 0.2 + 0.1 per token, verifying 0.3 + 0.05 per token, ms), every replayed round after
    the first is charged exactly that; the first, which follows the prefill, the run's first step."""
    work = {"draft_fixed_ms": 0.2, "draft_token_ms": 0.1, "verify_fixed_ms": 0.3, "verify_token_ms": 0.05}
    profile = replace(flat_profile(), draft_run_ms=((3.0, 0.5, 0.5, 0.5),), catch_up_ms=(tuple(1.0 + n for n in range(1, 9)),), round_work_ms=work)
    base = flat_profile()
    for episode in run_policy(ReplayBackend(traces, profile), make_policy("static:3"), range(len(PROMPTS))):
        for i, cycle in enumerate(episode.cycles):
            last = episode.cycles[i - 1].accepted + 1 if i else None
            forwards = (3.0 if last is None else 1.0 + last) + 0.5 * (cycle.drafted - 1) if cycle.drafted else 0.0
            assert cycle.draft_seconds == pytest.approx((forwards + 0.2 + 0.1 * cycle.drafted) * 1e-3)
            verify = base.verify_seconds(0, cycle.verified) + (0.3 + 0.05 * cycle.verified) * 1e-3
            assert cycle.verify_seconds == pytest.approx(verify)
    assert profile.drafting_seconds(0, 1, 12) == pytest.approx(13e-3)  # past the measured 8: 1 ms more per token


def test_synthetic_env_with_constant_alpha_finds_the_cost_model_optimum():
    alpha, c = 0.8, 0.3  # S(2) = 1.525, S(3) = 1.554, S(4) = 1.527: the optimum leads by 1.8 %
    speeds = {}
    for gamma in range(1, 9):
        backend = SyntheticBackend(alpha, c=c, max_depth=8, max_new_tokens=60_000)
        (episode,) = run_policy(backend, make_policy(f"static:{gamma}"), [gamma], decision_seconds=0.0)
        speeds[gamma] = episode.throughput * backend.target_step_seconds
    # 60,000 tokens: relative standard error of a throughput ~0.3 %, well under the 1.8 % lead.
    assert max(speeds, key=speeds.get) == optimal_gamma(alpha, c, 1.0, max_gamma=8).gamma == 3
    assert speeds[3] == pytest.approx(optimal_gamma(alpha, c, 1.0, max_gamma=8).speedup, rel=0.01)


def test_registered_envs_pass_gymnasium_and_sb3_checks(traces):
    for decision in ("depth", "size"):
        gym_check_env(gym.make(envs.ENV_IDS["synthetic"], decision=decision, alphas=(0.3, 0.9), switch_prob=0.1).unwrapped)
        sb3_check_env(envs.make_synthetic_env(decision=decision))
        replay = envs.make_replay_env(traces, flat_profile(), decision=decision)
        gym_check_env(replay)
        sb3_check_env(envs.make_replay_env(traces, flat_profile(), decision=decision))


def test_live_env_passes_the_checkers(target, near_draft):
    decoder = SpeculativeDecoder(target, near_draft, make_policy("static:1"), max_depth=4)
    ticks = itertools.count()
    decoder.clock = lambda: next(ticks) / 1024  # exact in binary; the checker demands equal rewards for equal seeds: tick, don't time
    gym_check_env(SpecDecodeEnv(LiveBackend(decoder, PROMPTS, flat_profile(), max_new_tokens=12)))


def _play(env, seed, steps=300):
    env.reset(seed=seed)
    env.action_space.seed(seed)
    trajectory = []
    for _ in range(steps):
        obs, reward, terminated, _, _ = env.step(env.action_space.sample())
        trajectory.append((obs.tobytes(), reward))
        if terminated:
            env.reset()
    return trajectory


def test_seeding_is_deterministic(traces):
    for make in (lambda: envs.make_synthetic_env(alphas=(0.2, 0.9), switch_prob=0.2), lambda: envs.make_replay_env(traces, flat_profile())):
        assert _play(make(), 3) == _play(make(), 3)
        assert _play(make(), 3) != _play(make(), 4)


def test_depth_reward_is_zero_until_stop_and_cycle_speedup_at_stop():
    env = envs.make_synthetic_env(alphas=0.7, c=0.1, max_depth=4)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(1)
    assert reward == 0.0 and info["cycles"] == 0
    _, reward, _, _, info = env.step(0)
    assert info["cycles"] == 1 and info["drafted"] == 2
    seconds = info["draft_seconds"] + info["verify_seconds"] + info["policy_seconds"]
    assert reward == pytest.approx(info["emitted"] / seconds * 0.05)


def test_vectorised_envs(traces):
    for vec in (DummyVecEnv, SubprocVecEnv):
        venv = vec([lambda: envs.make_synthetic_env(alphas=(0.3, 0.8), switch_prob=0.1)] * 2)
        venv.seed(0)
        obs = venv.reset()
        assert obs.shape == (2, ObservationSchema(8).size)
        for _ in range(50):
            obs, rewards, dones, infos = venv.step(np.array([1, 0]))
        venv.close()


def test_observation_schema_is_versioned_and_checked():
    schema = ObservationSchema(8)
    schema.check(schema.describe())
    with pytest.raises(SchemaMismatch, match="max_depth"):
        schema.check(ObservationSchema(6).describe())
    with pytest.raises(SchemaMismatch, match="version"):
        schema.check({**schema.describe(), "version": 0})
    assert len(schema.names) == schema.size == envs.make_synthetic_env().observation_space.shape[0]


def test_schemas_of_every_version_rebuild_from_a_saved_description():
    """Schema 4 (each step's margin; with the copy drafter, its first proposal too) is what environments
    produce; policies of versions 1-3 keep loading and are shown their own layout; an unknown version is
    refused by name."""
    from adaptive.observation import ObservationBuilder

    copy = {v: ObservationSchema(4, copy=True, version=v) for v in (2, 3, 4)}
    plain = {v: ObservationSchema(4, version=v) for v in (1, 4)}
    assert ObservationSchema(4, copy=True) == copy[4] and ObservationSchema(4) == plain[4]
    assert copy[3].size == copy[2].size + 2 and copy[4].size == copy[3].size + 4 and plain[4].size == plain[1].size + 4
    assert copy[3].names[: copy[2].names.index("copy_match") + 1] == copy[2].names[: copy[2].names.index("copy_match") + 1]
    for schema in (*copy.values(), *plain.values()):
        assert ObservationSchema.of(schema.describe()) == schema
    vectors = {}
    for version, schema in copy.items():
        builder = ObservationBuilder(schema, 0.1, [1.0] * 8)
        builder.new_round([2, 3], "copy", 12, (0.75, 0.5))
        builder.add_step(1, 0.75, 0.5, -0.3, 12, margin=0.6)
        vectors[version] = dict(zip(schema.names, builder.build(1, 4, 100, 7)))
    assert vectors[3]["copy_top1"] == 0.75 and vectors[3]["copy_entropy"] == pytest.approx(0.05)
    assert {k: v for k, v in vectors[3].items() if k not in ("copy_top1", "copy_entropy")} == vectors[2]
    assert vectors[4]["step_1_margin"] == pytest.approx(0.6) and vectors[4]["step_2_margin"] == 0.0
    assert {k: v for k, v in vectors[4].items() if not k.endswith("_margin")} == vectors[3]
    with pytest.raises(ValueError, match="no margin"):
        ObservationBuilder(copy[4], 0.1, [1.0] * 8).add_step(1, 0.75, 0.5, -0.3, 12, margin=float("nan"))
    with pytest.raises(ValueError, match="version must be one of"):
        ObservationSchema(4, copy=False, version=3)
    with pytest.raises(SchemaMismatch, match="version 7 is unknown"):
        ObservationSchema.of({**copy[4].describe(), "version": 7})
    with pytest.raises(SchemaMismatch, match="size"):  # a description that contradicts its version
        ObservationSchema.of({**copy[3].describe(), "version": 2})
    tree = ObservationSchema(4, version=5, tree=True)  # version 5: the grown tree's best nodes and level masses
    assert tree.size == plain[4].size + 32 + 4 and tree.names[: plain[4].size] == plain[4].names
    assert ObservationSchema.of(tree.describe()) == tree
    for wrong in ({"version": 5}, {"tree": True}, {"version": 5, "tree": True, "copy": True}):
        with pytest.raises(ValueError, match="version 5, tree=True and no copy drafter"):
            ObservationSchema(4, **wrong)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="decision must be one of"):
        envs.make_synthetic_env(decision="width")
    with pytest.raises(ValueError, match="alpha"):
        envs.make_synthetic_env(alphas=1.5)
    env = envs.make_synthetic_env()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="outside"):
        env.step(5)


def test_a_split_name_replays_the_traces_recorded_on_the_profile_s_engine():
    """Replay by split name reads the shipped traces of the engine the profile timed (eager: the plain file name;
    another engine: the name ending with it), and an engine with none shipped is refused with the command that
    records them."""
    assert default_traces("val") == TRACES / "smollm2-135m-val.npz"
    int4 = envs.make_replay_env("train", replace(flat_profile(), document={"engine": "compiled-int4"}))
    assert int4.backend.traces.metadata["engine"] == "compiled-int4"
    with pytest.raises(FileNotFoundError, match="adaptive record --pair smollm2-135m --engine lean-int8 --split train"):
        envs.make_replay_env("train", replace(flat_profile(), document={"engine": "lean-int8"}))
