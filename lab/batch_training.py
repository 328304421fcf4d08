"""Training a load-aware batch policy with PPO in batched replay (``adaptive train-batch``), and judging it
there against the static depths, the best static depth per load (the per-batch-size schedule), the batch
cost model and SmartSpec's goodput rule, at each load of its training range — on throughput, or with a
latency target on goodput (:class:`~envs.batch_replay.BatchReplayEnv`'s ``slo_tpot_ms``), and on the 95th
percentile of the gaps between tokens. The learned policy is also judged capped at the schedule found:
never deeper than it at any batch size, so where a round's cost grows with its depth, never a longer round
and never a longer gap. A replay-only oracle, free and capped at the schedule, bounds what choosing each
round's depth could gain."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from tqdm import tqdm

from adaptive.batch_profile import BatchCostProfile
from adaptive.learned_batch_policy import save_batch_policy
from adaptive.policy import RULE_DECISION_SECONDS, BatchPolicy, BatchState
from adaptive.traces import TraceSet
from envs.batch_replay import BatchReplayEnv
from lab.config import PPOConfig
from lab.ppo import export_sb3, new_ppo
from policies.batch import BatchSizeSchedule, CappedBySchedule, CostModelBatch, FixedBatchDepth, GoodputRule, make_batch_policy

CAPPED = "learned, capped"
"""The learned policy capped at the per-batch-size schedule the judgement found (:class:`CappedBySchedule`)."""
ORACLE, ORACLE_CAPPED = "oracle", "oracle, capped"
"""The replay-only myopic oracle (:class:`ReplayOracle`), free and within the schedule: what a policy choosing
each round's depth could gain at most, and at most without longer rounds than the schedule's."""


DEFAULT_DECISION_MS = 0.25
"""Milliseconds charged per decision of a learned batch policy in replay: measured live, a per-step policy's decisions
(top-1 probabilities and forward) took 0.68-0.95 ms per round of about three asks at bf16 (load tests of
2026-12-04/05), a per-round policy's 0.15 ms per round at fp32 (2026-12-05): the load tests' "policy µs/round"."""


class ReplayOracle:
    """Replay only: each round the depth :meth:`~envs.batch_replay.BatchReplayEnv.oracle_depth` picks on
    ``env``, within ``cap``'s depth (without one, the decoder's cap); a bound, charged no decisions."""

    decision_seconds = RULE_DECISION_SECONDS

    def __init__(self, env: BatchReplayEnv, cap: BatchPolicy | None = None) -> None:
        self.env, self.cap = env, cap
        self.name = ORACLE if cap is None else ORACLE_CAPPED

    def depth(self, state: BatchState) -> int:
        return self.env.oracle_depth(state.max_depth if self.cap is None else self.cap.depth(state))


class _Bar(BaseCallback):
    def __init__(self, total: int) -> None:
        super().__init__()
        self.bar = tqdm(total=total, desc="batch policy", unit="step")

    def _on_step(self) -> bool:
        self.bar.update(1)
        return True

    def _on_training_end(self) -> None:
        self.bar.close()


@dataclass(frozen=True)
class LoadReplay:
    """One policy replayed at one load."""

    rate: float
    """Throughput over plain batched decoding's (goodput over it, with a latency target)."""
    itl_p95_ms: float
    """95th percentile of the gaps between a request's tokens: each round, a request's first token waits the
    round and the rest of its tokens arrive with it (gap 0), as the load test counts inter-token latency."""


def replay_load(env: BatchReplayEnv, policy: BatchPolicy, load: int, rounds: int, seed: int, requests: Sequence[int] | None = None) -> LoadReplay:
    """``policy`` over ``rounds`` rounds at a fixed ``load`` (or, given ``requests``, over that fixed stream of
    trace indices, as a load test sends it, until the last finishes): Σ emitted / Σ seconds over the plain rate
    B / step time at the batch sizes met (with the environment's latency target, Σ counted instead of Σ
    emitted), and the 95th percentile of the inter-token gaps."""
    saved = env.switch_prob
    env.switch_prob = 0.0
    env.reset(seed=seed, options={"load": load} if requests is None else {"load": load, "requests": list(requests)})
    emitted = counted = seconds = plain = 0.0
    gaps: list[float] = []
    for _ in range(rounds if requests is None else 10**9):
        _, _, finished, _, info = env.play(policy)
        emitted += info["emitted"]
        counted += info["counted"]
        seconds += info["seconds"]
        plain += info["emitted"] * info["plain_seconds_per_token"]
        for tokens in info["tokens_per_request"]:
            gaps += [info["seconds"] * 1e3] + [0.0] * (tokens - 1)
        if finished:
            break
    env.switch_prob = saved
    return LoadReplay(counted / emitted * plain / seconds, float(np.percentile(gaps, 95)))


def judge(env: BatchReplayEnv, policies: dict[str, BatchPolicy], loads: tuple[int, ...], rounds: int = 2000, seed: int = 1, into: dict | None = None) -> dict:
    """Per load, each policy's replayed throughput (goodput, with a latency target) over plain, and under
    ``itl p95 ms`` its inter-token gap p95; adds ``best static`` (the per-load grid: the per-batch-size
    schedule) and its depth once a static depth is in the row. ``into``: an earlier judgement to extend."""
    table: dict = {} if into is None else into
    for load in loads:
        row = table.setdefault(str(load), {"itl p95 ms": {}})
        for name, policy in policies.items():
            replay = replay_load(env, policy, load, rounds, seed)
            row[name], row["itl p95 ms"][name] = replay.rate, replay.itl_p95_ms
        statics = {d: row[f"static:{d}"] for d in range(env.max_depth + 1) if f"static:{d}" in row}
        if statics:
            best = max(statics, key=statics.get)
            row["best static"], row["best static depth"] = statics[best], best
            row["itl p95 ms"]["best static"] = row["itl p95 ms"][f"static:{best}"]
    return table


def train_batch_policy(
    traces: TraceSet,
    profile: BatchCostProfile,
    out: Path,
    ppo: PPOConfig,
    loads: tuple[int, ...] = (1, 2, 4, 8),
    max_depth: int = 6,
    switch_prob: float = 0.02,
    seed: int = 0,
    metadata: dict | None = None,
    slo_tpot_ms: float | None = None,
    cap_at_schedule: bool = False,
    stepwise: bool = False,
    decision_ms: float = DEFAULT_DECISION_MS,
) -> tuple[BatchPolicy, dict]:
    """PPO on :class:`BatchReplayEnv` (reward: throughput, or goodput under ``slo_tpot_ms``); saves the policy
    in ``out`` and its replay judgement in ``out/evaluation.json``; returns both. The static depths are judged
    first; with ``cap_at_schedule`` PPO trains inside their per-batch-size schedule (the environment's cap),
    and the policy is saved with that cap, which :func:`~policies.batch.make_batch_policy` applies on loading.
    ``stepwise``: the policy decides before each draft step (the environment's per-step mode). Each decision of
    the learning agent, and of a learned policy judged, costs ``decision_ms``."""
    judged_env = BatchReplayEnv(traces, profile, loads, 0.0, max_depth, rounds=10**9, slo_tpot_ms=slo_tpot_ms, decision_ms=decision_ms)
    evaluation = judge(judged_env, {f"static:{d}": FixedBatchDepth(d) for d in range(max_depth + 1)}, loads)
    schedule = best_static_schedule(evaluation, profile.batch_sizes[-1])
    cap = schedule if cap_at_schedule else None
    env = BatchReplayEnv(traces, profile, loads, switch_prob, max_depth, slo_tpot_ms=slo_tpot_ms, cap=cap, stepwise=stepwise, decision_ms=decision_ms)
    env.reset(seed=seed)
    model = new_ppo(ppo, env, seed)
    model.learn(ppo.timesteps, callback=_Bar(ppo.timesteps))
    net, layers = export_sb3(model)
    info = {
        "name": f"learned-batch:{out.name}",
        "loads": list(loads),
        "switch_prob": switch_prob,
        "timesteps": ppo.timesteps,
        "seed": seed,
        "slo_tpot_ms": slo_tpot_ms,
        "stepwise": stepwise,
        "decision_ms": decision_ms,
        **({"cap": schedule.spec} if cap else {}),
        **(metadata or {}),
    }
    save_batch_policy(out, net, layers, env.schema, profile, **info)
    policy = make_batch_policy(str(out))
    others = {
        "costmodel": CostModelBatch(profile),
        "goodput": GoodputRule(profile),
        "learned": policy,
        CAPPED: CappedBySchedule(schedule, policy),
        ORACLE: ReplayOracle(judged_env),
        ORACLE_CAPPED: ReplayOracle(judged_env, schedule),
    }
    judge(judged_env, others, loads, into=evaluation)
    for row in evaluation.values():
        for name, key in (("learned", "learned"), (CAPPED, "capped"), (ORACLE, ORACLE), (ORACLE_CAPPED, "capped oracle")):
            row[f"{key} over best static"] = row[name] / row["best static"]
    (out / "evaluation.json").write_text(json.dumps(evaluation, indent=1))
    return policy, evaluation


def worst_load_ratio(evaluation: dict) -> float:
    """The learned policy's throughput over the best static depth at its worst load (the replay judgement's)."""
    return min(row["learned over best static"] for row in evaluation.values())


def train_best_of_seeds(
    traces: TraceSet,
    profile: BatchCostProfile,
    out: Path,
    ppo: PPOConfig,
    seeds: Sequence[int],
    loads: tuple[int, ...] = (1, 2, 4, 8),
    max_depth: int = 6,
    switch_prob: float = 0.02,
    metadata: dict | None = None,
    slo_tpot_ms: float | None = None,
    cap_at_schedule: bool = False,
    stepwise: bool = False,
    decision_ms: float = DEFAULT_DECISION_MS,
) -> tuple[BatchPolicy, int, dict[int, dict]]:
    """One PPO run per seed (each kept in ``out/seed-N``); the run whose worst load comes closest to the best
    static depth in replay (:func:`worst_load_ratio`) is copied to ``out``, named after it. PPO on this
    environment varies by a few per cent from seed to seed, so choosing among seeds on the replay judgement
    (the training traces, never the test split) is part of training. Returns the chosen policy, its seed
    and every seed's judgement."""
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    judged = {}
    for seed in seeds:
        _, judged[seed] = train_batch_policy(
            traces,
            profile,
            out / f"seed-{seed}",
            ppo,
            loads,
            max_depth,
            switch_prob,
            seed,
            {"name": f"learned-batch:{out.name}", **(metadata or {})},
            slo_tpot_ms,
            cap_at_schedule,
            stepwise,
            decision_ms,
        )
    chosen = max(seeds, key=lambda seed: worst_load_ratio(judged[seed]))
    for path in (out / f"seed-{chosen}").iterdir():
        shutil.copy2(path, out / path.name)
    (out / "seeds.json").write_text(json.dumps({"chosen": chosen, "worst load ratio": {str(s): worst_load_ratio(judged[s]) for s in seeds}}, indent=1))
    return make_batch_policy(str(out)), chosen, judged


def best_static_schedule(evaluation: dict, largest: int) -> BatchSizeSchedule:
    """The per-batch-size schedule of the best static depths the judgement found, each load's depth up to the
    next load, the last one up to ``largest``."""
    loads = sorted(int(load) for load in evaluation)
    highs = [nxt - 1 for nxt in loads[1:]] + [largest]
    return BatchSizeSchedule(",".join(f"{low}-{high}={evaluation[str(low)]['best static depth']}" for low, high in zip(loads, highs)))
