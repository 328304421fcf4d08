"""Batched replay: what the batched decoder does under greedy decoding, a load process, PPO on it."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from test_batch_decoder import StopWhenUnsure, synthetic_profile

from adaptive.batch_decoder import BatchedSpeculativeDecoder
from adaptive.batch_observation import BatchObservationSchema
from adaptive.decoder import SpeculativeDecoder
from adaptive.learned_batch_policy import load_batch_policy
from adaptive.policy import SteppedBatchPolicy
from adaptive.recorder import record
from envs.batch_replay import BatchReplayEnv
from lab.batch_training import (
    CAPPED,
    ORACLE,
    ORACLE_CAPPED,
    ReplayOracle,
    best_static_schedule,
    judge,
    replay_load,
    train_batch_policy,
    train_best_of_seeds,
    worst_load_ratio,
)
from lab.config import PPOConfig
from lab.loadtest import Load, run_load
from policies import make_policy
from policies.batch import BatchSizeSchedule, FixedBatchDepth, make_batch_policy

PROMPTS = [[1, 4, 6], [3, 3], [2, 2, 9, 11, 5], [7, 8], [12, 0, 3, 3]]


@pytest.fixture(scope="module")
def traces(target, near_draft):
    decoder = SpeculativeDecoder(target, near_draft, make_policy("static:1"))
    rows = [{"id": str(i), "lang": "en"} for i in range(len(PROMPTS))]
    return record(decoder, rows, PROMPTS, max_new_tokens=24, depth=6, metadata={"pair": "tiny"})


def test_batched_replay_accepts_what_the_batched_decoder_accepts(traces, target, near_draft):
    """One request at a time (load 1, no switching), a static depth: the replayed rounds' emitted tokens
    equal the batched decoder's, request after request."""
    profile = synthetic_profile({1: 1.0, 8: 20.0})
    env = BatchReplayEnv(traces, profile, loads=(1,), switch_prob=0.0, max_depth=4, rounds=10**6)
    env.reset(seed=0)
    order = [r.prompt for r in env.batch]
    replayed = []
    while len(order) <= 3:
        _, reward, _, _, info = env.step(3)
        replayed.append(info["emitted"])
        if env.batch[0].t == 0:  # the request finished: the next one started
            order.append(env.batch[0].prompt)
    decoder = BatchedSpeculativeDecoder(target, near_draft, FixedBatchDepth(3), max_depth=4, max_batch=1)
    live = []
    for prompt in order[:3]:
        decoder.submit(PROMPTS[prompt], 24)
        while not decoder.idle:
            live.append(sum(decoder.step().emitted))
    assert replayed[: len(live)] == live


def test_batched_replay_passes_the_checker_and_rewards_plain_steps_with_one(traces):
    profile = synthetic_profile({1: 1.0, 8: 20.0})
    env = BatchReplayEnv(traces, profile, loads=(1, 2, 8), switch_prob=0.1, max_depth=4, rounds=50)
    check_env(env, skip_render_check=True)
    env.reset(seed=3)
    for _ in range(40):
        _, reward, _, _, info = env.step(0)
        assert reward == pytest.approx(info["emitted"] / info["batch"])  # 1.0 until a request's last token
    with pytest.raises(ValueError, match="loads must lie within"):
        BatchReplayEnv(traces, profile, loads=(16,))


def test_a_load_aware_policy_learns_to_draft_alone_and_not_in_a_full_batch(traces, tmp_path):
    """Verification flat at batch 1 and steep at batch 8: the best static depth differs by load, and PPO
    (short) matches the per-load best within a few percent at both; the saved policy loads by folder."""
    profile = synthetic_profile({1: 0.5, 8: 60.0})
    ppo = PPOConfig(timesteps=6144, n_steps=1024, batch_size=256, gamma=0.9)
    policy, evaluation = train_batch_policy(traces, profile, tmp_path / "run", ppo, (1, 8), max_depth=4, decision_ms=0.0)
    assert evaluation["1"]["best static depth"] > 0 == evaluation["8"]["best static depth"]
    for load in ("1", "8"):
        assert evaluation[load]["learned over best static"] > 0.95, evaluation
    assert best_static_schedule(evaluation, 8).name == f"schedule:1-7={evaluation['1']['best static depth']},8-8=0"
    assert make_batch_policy(str(tmp_path / "run")).name == load_batch_policy(tmp_path / "run").name == policy.name
    for load in ("1", "8"):  # capped at the schedule: never a longer gap than the schedule's (round cost grows with depth here)
        row = evaluation[load]
        assert row["itl p95 ms"][CAPPED] <= row["itl p95 ms"]["best static"] + 1e-9
        assert row["capped over best static"] == pytest.approx(row[CAPPED] / row["best static"])
    assert evaluation["8"][CAPPED] == pytest.approx(1.0)  # the schedule says plain in a full batch, and so does the cap
    again = judge(BatchReplayEnv(traces, profile, (1, 8), 0.0, 4, rounds=10**9), {"static:0": FixedBatchDepth(0)}, (1, 8), rounds=200)
    assert again["8"]["static:0"] == pytest.approx(1.0)


def test_the_replay_oracle_picks_the_round_that_emits_most_per_second_and_bounds_the_static_depths(traces):
    """Each round the oracle's depth is the one whose round, run on a copy of the environment, emits the most
    tokens per second (the shallower on a tie); replayed at a load it is at least as fast as every static depth
    (faster alone, where speculation pays), and within the per-batch-size schedule it never makes a longer gap."""
    profile = synthetic_profile({1: 0.5, 8: 60.0})
    env = BatchReplayEnv(traces, profile, loads=(1, 8), switch_prob=0.3, max_depth=4, rounds=10**6)
    env.reset(seed=5)
    for _ in range(60):
        rates = []
        for depth in range(5):
            info = copy.deepcopy(env).step(depth)[-1]
            rates.append(info["emitted"] / info["seconds"])
        chosen = env.oracle_depth(4)
        assert rates[chosen] == max(rates) and all(rate < rates[chosen] for rate in rates[:chosen])
        assert env.oracle_depth(1) == max(range(2), key=lambda d: (rates[d], -d))
        env.step(chosen)
    judged_env = BatchReplayEnv(traces, profile, (1, 8), 0.0, 4, rounds=10**9)
    statics = {f"static:{d}": FixedBatchDepth(d) for d in range(5)}
    evaluation = judge(judged_env, statics, (1, 8), rounds=400)
    schedule = best_static_schedule(evaluation, 8)
    judge(judged_env, {ORACLE: ReplayOracle(judged_env), ORACLE_CAPPED: ReplayOracle(judged_env, schedule)}, (1, 8), rounds=400, into=evaluation)
    for row in evaluation.values():
        assert row[ORACLE] >= row["best static"] and row[ORACLE_CAPPED] >= row["best static"]
        assert row["itl p95 ms"][ORACLE_CAPPED] <= row["itl p95 ms"]["best static"] + 1e-9
    assert evaluation["1"][ORACLE] > evaluation["1"]["best static"] * 1.01  # alone, where speculation pays, knowing m(t) pays more


def test_training_several_seeds_keeps_the_one_best_at_its_worst_load(traces, tmp_path):
    """Each seed's run is kept apart; the one whose worst load is closest to the best static depth is copied to
    the folder (weights, judgement) under the folder's name."""
    profile = synthetic_profile({1: 0.5, 8: 60.0})
    ppo = PPOConfig(timesteps=1024, n_steps=512, batch_size=256, gamma=0.9)
    out = tmp_path / "run"
    policy, chosen, judged = train_best_of_seeds(traces, profile, out, ppo, (0, 1), (1, 8), max_depth=4, decision_ms=0.0)
    assert chosen == max((0, 1), key=lambda seed: worst_load_ratio(judged[seed]))
    assert worst_load_ratio(judged[chosen]) == min(row["learned over best static"] for row in judged[chosen].values())
    assert json.loads((out / "evaluation.json").read_text()) == judged[chosen]
    assert (out / "policy.safetensors").read_bytes() == (out / f"seed-{chosen}" / "policy.safetensors").read_bytes()
    assert policy.name == "learned-batch:run"
    assert json.loads((out / "seeds.json").read_text())["chosen"] == chosen
    with pytest.raises(ValueError, match="at least one seed"):
        train_best_of_seeds(traces, profile, tmp_path / "none", ppo, ())


def test_with_a_latency_target_only_requests_meeting_it_count(traces):
    """Goodput reward: in each round, a request's tokens count when round time / its tokens meets the target;
    no target counts every token (throughput), a target below any round counts none."""
    profile = synthetic_profile({1: 1.0, 2: 2.0})
    round_ms = profile.round_ms(2, 3)
    assert 2 * 40.0 > round_ms > 40.0  # at 40 ms per token, a request emitting one token misses, two or more meet it
    offsets, match = traces.offsets.tolist(), traces.match.tolist()
    seen = {}
    for slo in (None, 1e6, 1.0, 40.0):
        env = BatchReplayEnv(traces, profile, loads=(2,), switch_prob=0.0, max_depth=4, rounds=100, slo_tpot_ms=slo)
        env.reset(seed=5)
        seen[slo] = []
        for _ in range(20):
            before = [(r.prompt, r.t) for r in env.batch]
            _, reward, _, _, info = env.step(3)
            tokens = [min(min(3, match[offsets[p] + t]) + 1, offsets[p + 1] - offsets[p] - t) for p, t in before]
            assert info["emitted"] == sum(tokens)
            expected = sum(n for n in tokens if slo is None or round_ms / n <= slo)
            assert info["counted"] == expected
            assert reward == pytest.approx(expected / info["seconds"] / (2 / (profile.round_ms(2, 0) / 1e3)))
            seen[slo].append(info["counted"] / info["emitted"])
    assert seen[None] == seen[1e6] == [1.0] * 20 and seen[1.0] == [0.0] * 20
    assert 0.0 < sum(seen[40.0]) / 20 < 1.0  # some tokens met the target, some missed it
    with pytest.raises(ValueError, match="slo_tpot_ms must be a positive"):
        BatchReplayEnv(traces, profile, loads=(2,), slo_tpot_ms=0.0)


def test_replay_counts_inter_token_gaps_as_the_load_test_does(traces):
    """Each round, a request's first token waits the round and the rest arrive with it: plain decoding's gaps
    are all one step; a static depth's p95 is the p95 of those gaps, computed by hand from the same rounds."""
    profile = synthetic_profile({1: 1.0, 2: 2.0})
    env = BatchReplayEnv(traces, profile, loads=(2,), switch_prob=0.0, max_depth=4, rounds=10**9)
    plain = replay_load(env, FixedBatchDepth(0), 2, rounds=50, seed=3)
    assert plain.rate == pytest.approx(1.0) and plain.itl_p95_ms == pytest.approx(profile.round_ms(2, 0))
    env.reset(seed=3, options={"load": 2})
    gaps = []
    for _ in range(50):
        _, _, _, _, info = env.step(3)
        gaps += [g for tokens in info["tokens_per_request"] for g in [profile.round_ms(2, 3)] + [0.0] * (tokens - 1)]
    deep = replay_load(env, FixedBatchDepth(3), 2, rounds=50, seed=3)
    assert deep.itl_p95_ms == pytest.approx(float(np.percentile(gaps, 95)))
    assert 0.0 in gaps and deep.itl_p95_ms == pytest.approx(profile.round_ms(2, 3))  # zeros below, a round's time at p95


def test_a_fixed_request_stream_replays_as_a_load_test_sends_it(traces, target, near_draft):
    """Given the stream of requests a load test sends (trace indices, in order), replay runs closed-loop clients
    over exactly those and ends when the last finishes: the same batch sizes round by round and the same tokens as
    the load test of the batched decoder with the same prompts."""
    profile = synthetic_profile({1: 1.0, 8: 20.0})
    env = BatchReplayEnv(traces, profile, loads=(2,), switch_prob=0.0, max_depth=4, rounds=10**6)
    stream = [3, 0, 4, 1, 2]
    env.reset(seed=0, options={"load": 2, "requests": stream})
    replayed = []
    while True:
        _, _, finished, _, info = env.step(3)
        replayed.append((info["batch"], info["emitted"]))
        if finished:
            break
    decoder = BatchedSpeculativeDecoder(target, near_draft, FixedBatchDepth(3), max_depth=4, max_batch=2)
    results, _, rounds = run_load(decoder, [PROMPTS[i] for i in stream], Load(len(stream), concurrency=2), max_new_tokens=24)
    assert [batch for batch, _ in replayed] == [batch for batch, *_ in rounds]
    assert sum(emitted for _, emitted in replayed) == sum(len(r.token_ids) for r in results)
    assert replay_load(env, FixedBatchDepth(3), 2, rounds=0, seed=0, requests=stream).rate > 1.0  # the stream, not 0 rounds
    with pytest.raises(ValueError, match="trace indices in 0..4"):
        env.reset(options={"load": 2, "requests": [0, 5]})


def test_replay_charges_each_decision_of_a_learned_policy_and_none_of_a_rule(traces):
    """With decision_ms, a round costs its profile time plus that much per decision asked: one per round of a
    depth-picking agent, one per ask of a per-step agent (before its first step and after each step below the
    bound), a judged policy's asks as the live decoder makes them, nothing for a rule or the schedule."""
    profile = synthetic_profile({1: 1.0, 8: 20.0})
    env = BatchReplayEnv(traces, profile, loads=(1,), switch_prob=0.0, max_depth=4, decision_ms=5.0)
    env.reset(seed=0)
    assert env.step(3)[4]["seconds"] * 1e3 == pytest.approx(profile.round_ms(1, 3) + 5.0)
    assert env.play(FixedBatchDepth(3))[4]["seconds"] * 1e3 == pytest.approx(profile.round_ms(1, 3))
    assert env.play(BatchSizeSchedule("1-8=2"))[4]["seconds"] * 1e3 == pytest.approx(profile.round_ms(1, 2))
    stepped = StopWhenUnsure(bound=4, threshold=2.0)  # never sure: stops after the first step, asked twice
    assert env.play(stepped)[4]["seconds"] * 1e3 == pytest.approx(profile.round_ms(1, 1) + 2 * 5.0)
    capped = make_batch_policy("capped:1-8=3:static:3")
    assert env.play(capped)[4]["seconds"] * 1e3 == pytest.approx(profile.round_ms(1, 3))
    per_step = BatchReplayEnv(traces, profile, loads=(1,), switch_prob=0.0, max_depth=4, stepwise=True, decision_ms=5.0)
    per_step.reset(seed=0)
    per_step.step(1)
    per_step.step(1)
    *_, info = per_step.step(0)  # drafted 2, then verified: asked three times
    assert info["depth"] == 2 and info["seconds"] * 1e3 == pytest.approx(profile.round_ms(1, 2) + 3 * 5.0)
    with pytest.raises(ValueError, match="decision_ms must be >= 0"):
        BatchReplayEnv(traces, profile, loads=(1,), decision_ms=-1.0)


def test_a_policy_trained_inside_the_schedule_never_drafts_deeper_than_it(traces, tmp_path):
    """The environment's cap clamps each action to the schedule's depth at the batch size; PPO trained so is
    saved with its cap, which loading by folder applies: in replay it never drafts deeper than the schedule."""
    profile = synthetic_profile({1: 0.5, 8: 60.0})
    cap = BatchSizeSchedule("1-7=2,8-8=0")
    env = BatchReplayEnv(traces, profile, loads=(1, 8), switch_prob=0.5, max_depth=4, rounds=10**9, cap=cap)
    env.reset(seed=0)
    for action in [4, 1, 3, 0] * 10:
        size = len(env.batch)
        assert env.step(action)[-1]["depth"] == min(action, 2 if size < 8 else 0)
    ppo = PPOConfig(timesteps=2048, n_steps=1024, batch_size=256, gamma=0.9)
    policy, evaluation = train_batch_policy(traces, profile, tmp_path / "run", ppo, (1, 8), max_depth=4, cap_at_schedule=True, decision_ms=0.0)
    limits = best_static_schedule(evaluation, 8)
    assert policy.name == f"capped:{limits.spec}:learned-batch:run" == make_batch_policy(str(tmp_path / "run")).name
    for load in (1, 8):
        env = BatchReplayEnv(traces, profile, loads=(load,), switch_prob=0.0, max_depth=4, rounds=10**9)
        env.reset(seed=2)
        for _ in range(100):
            state = env.state()
            depth = policy.depth(state)
            assert depth <= limits.depth(state)
            env.step(depth)
        assert evaluation[str(load)]["learned"] == evaluation[str(load)][CAPPED]


def test_per_step_replay_drafts_until_told_to_verify_and_credits_the_round_when_it_ends(traces):
    """Per step: 1 drafts one more token (reward 0, the round goes on, the draft's recorded top-1
    probabilities shown), 0 verifies; the verified round is the per-round environment's round at that depth,
    with its reward, and ends the episode while the clients carry on; a round at the cap's depth is verified
    without asking."""
    profile = synthetic_profile({1: 1.0, 2: 2.0, 8: 20.0})
    env = BatchReplayEnv(traces, profile, loads=(2, 8), switch_prob=0.2, max_depth=4, rounds=10**6, stepwise=True)
    check_env(env, skip_render_check=True)
    assert env.action_space.n == 2 and env.schema.version == 2 and env.observation_space.shape == (env.schema.size,)
    env.reset(seed=1)
    for actions in ([1, 1, 0], [0], [1, 0], [1, 1, 1, 1], [1, 1, 1, 0]):
        rounds = copy.deepcopy(env)
        rounds.stepwise = False
        depth = min(sum(actions), 4)
        expected = rounds.step(depth)
        for i, action in enumerate(actions):
            observation, reward, terminated, _, info = env.step(action)
            if i + 1 < len(actions):
                assert reward == 0.0 and not terminated and info["drafted"] == i + 1
                shown = dict(zip(env.schema.names, observation))
                top1 = [traces.features[traces.offsets[r.prompt] + r.t, : i + 1, 0].astype(float) for r in env.batch]
                assert shown["drafted"] == pytest.approx((i + 1) / 4)
                assert shown["reach_min"] == pytest.approx(min(np.prod(p) for p in top1), rel=1e-5)
                assert shown["top1_last"] == pytest.approx(np.mean([p[-1] for p in top1]), rel=1e-5)
        assert terminated and info["depth"] == depth and reward == pytest.approx(expected[1])
        assert np.array_equal(observation, expected[0])  # the next round's observation, before its first step
        assert info["emitted"] == expected[-1]["emitted"]
        before = [(r.prompt, r.t) for r in env.batch]
        env.reset()
        assert [(r.prompt, r.t) for r in env.batch] == before  # the clients carry on into the next episode
    capped = BatchReplayEnv(traces, profile, loads=(2,), max_depth=4, cap=BatchSizeSchedule("1-8=2"), stepwise=True)
    capped.reset(seed=0)
    assert not capped.step(1)[2] and capped.step(1)[2]  # the second token reaches the cap: verified without asking


def test_replay_shows_a_stepped_policy_what_the_live_decoder_shows(traces, target, near_draft):
    """One request at a time: a stepped policy replayed stops where it stops live, seeing the same top-1
    probabilities (the traces keep them in float16), and the rounds emit the same tokens."""
    profile = synthetic_profile({1: 1.0, 8: 20.0})
    env = BatchReplayEnv(traces, profile, loads=(1,), switch_prob=0.0, max_depth=4, rounds=10**6)
    env.reset(seed=0)
    order, replayed, shown_replay = [env.batch[0].prompt], [], []
    policy = StopWhenUnsure(bound=4, threshold=0.3)
    while len(order) <= 3:
        depth = env.policy_depth(policy)
        shown_replay += policy.shown
        policy.shown = []
        info = env.step(depth)[-1]
        replayed.append((depth, info["emitted"]))
        if env.batch[0].t == 0:
            order.append(env.batch[0].prompt)
    decoder = BatchedSpeculativeDecoder(target, near_draft, policy, max_depth=4, max_batch=1)
    live = []
    for prompt in order[:3]:
        decoder.submit(PROMPTS[prompt], 24)
        while not decoder.idle:
            round_ = decoder.step()
            live.append((round_.depth, sum(round_.emitted)))
    assert replayed[: len(live)] == live
    assert len({d for d, _ in live}) > 1 and len(policy.shown) > 10  # its stops made rounds of several depths
    for seen_live, seen_replay in zip(policy.shown, shown_replay):
        assert seen_live.drafted == seen_replay.drafted
        assert np.allclose(seen_live.top1, seen_replay.top1, atol=2e-3)


def test_a_stepped_policy_learns_to_draft_alone_and_not_in_a_full_batch_and_loads_as_one(traces, tmp_path):
    """PPO deciding per step (short) matches the per-load best static depth within a few per cent where the
    best depths differ by load; saved with observation version 2 it loads as a stepped policy, while a policy
    of version 1 (the kept one) still loads as a per-round policy."""
    profile = synthetic_profile({1: 0.5, 8: 60.0})
    ppo = PPOConfig(timesteps=8192, n_steps=1024, batch_size=256, gamma=1.0)
    policy, evaluation = train_batch_policy(traces, profile, tmp_path / "run", ppo, (1, 8), max_depth=4, stepwise=True, decision_ms=0.0)
    for load in ("1", "8"):
        assert evaluation[load]["learned over best static"] > 0.95, evaluation
    saved = json.loads((tmp_path / "run" / "policy.json").read_text())
    assert saved["schema"]["version"] == 2 and saved["stepwise"] and saved["actions"].startswith("before each draft step")
    assert isinstance(load_batch_policy(tmp_path / "run"), SteppedBatchPolicy)
    kept = load_batch_policy("benchmarks/kept-policies/batch-rounds")
    assert kept.schema.version == 1 and not isinstance(kept, SteppedBatchPolicy)
    with pytest.raises(ValueError, match="versions"):
        BatchObservationSchema.described({**saved["schema"], "version": 9})
