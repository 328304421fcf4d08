"""Training a load-aware batch policy with PPO in batched replay (``adaptive train-batch``), and judging it
there against the static depths, the best static depth per load (the per-batch-size schedule), the batch
cost model and SmartSpec's goodput rule, at each load of its training range — on throughput, or with a
latency target on goodput (:class:`~envs.batch_replay.BatchReplayEnv`'s ``slo_tpot_ms``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from stable_baselines3.common.callbacks import BaseCallback
from tqdm import tqdm

from adaptive.batch_profile import BatchCostProfile
from adaptive.learned_batch_policy import LearnedBatchPolicy, load_batch_policy, save_batch_policy
from adaptive.policy import BatchPolicy
from adaptive.traces import TraceSet
from envs.batch_replay import BatchReplayEnv
from lab.config import PPOConfig
from lab.ppo import export_sb3, new_ppo
from policies.batch import CostModelBatch, FixedBatchDepth, GoodputRule


class _Bar(BaseCallback):
    def __init__(self, total: int) -> None:
        super().__init__()
        self.bar = tqdm(total=total, desc="batch policy", unit="step")

    def _on_step(self) -> bool:
        self.bar.update(1)
        return True

    def _on_training_end(self) -> None:
        self.bar.close()


def replay_rate(env: BatchReplayEnv, policy: BatchPolicy, load: int, rounds: int, seed: int) -> float:
    """Throughput of ``policy`` over plain batched decoding at a fixed ``load``: Σ emitted / Σ seconds of
    ``rounds`` rounds, over the plain rate B / step time at the batch sizes met; with the environment's
    latency target, goodput (Σ counted instead of Σ emitted) over the same plain rate."""
    saved = env.switch_prob
    env.switch_prob = 0.0
    env.reset(seed=seed, options={"load": load})
    emitted = counted = seconds = plain = 0.0
    for _ in range(rounds):
        _, _, _, _, info = env.step(policy.depth(env.state()))
        emitted += info["emitted"]
        counted += info["counted"]
        seconds += info["seconds"]
        plain += info["emitted"] * info["plain_seconds_per_token"]
    env.switch_prob = saved
    return counted / emitted * plain / seconds


def judge(env: BatchReplayEnv, policies: dict[str, BatchPolicy], loads: tuple[int, ...], rounds: int = 2000, seed: int = 1) -> dict:
    """Per load, each policy's replayed throughput (goodput, with a latency target) over plain; adds ``best
    static`` (the per-load grid: the per-batch-size schedule) and its depth."""
    table: dict = {}
    for load in loads:
        row = {name: replay_rate(env, policy, load, rounds, seed) for name, policy in policies.items()}
        statics = {d: row[f"static:{d}"] for d in range(env.max_depth + 1) if f"static:{d}" in row}
        best = max(statics, key=statics.get)
        row["best static"], row["best static depth"] = statics[best], best
        table[str(load)] = row
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
) -> tuple[LearnedBatchPolicy, dict]:
    """PPO on :class:`BatchReplayEnv` (reward: throughput, or goodput under ``slo_tpot_ms``); saves the policy
    in ``out`` and its replay judgement in ``out/evaluation.json``; returns both."""
    env = BatchReplayEnv(traces, profile, loads, switch_prob, max_depth, slo_tpot_ms=slo_tpot_ms)
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
        **(metadata or {}),
    }
    save_batch_policy(out, net, layers, env.schema, profile, **info)
    policy = load_batch_policy(out)
    judged_env = BatchReplayEnv(traces, profile, loads, 0.0, max_depth, rounds=10**9, slo_tpot_ms=slo_tpot_ms)
    policies: dict[str, BatchPolicy] = {f"static:{d}": FixedBatchDepth(d) for d in range(max_depth + 1)}
    policies.update({"costmodel": CostModelBatch(profile), "goodput": GoodputRule(profile), "learned": policy})
    evaluation = judge(judged_env, policies, loads)
    for row in evaluation.values():
        row["learned over best static"] = row["learned"] / row["best static"]
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
) -> tuple[LearnedBatchPolicy, int, dict[int, dict]]:
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
        )
    chosen = max(seeds, key=lambda seed: worst_load_ratio(judged[seed]))
    for path in (out / f"seed-{chosen}").iterdir():
        shutil.copy2(path, out / path.name)
    (out / "seeds.json").write_text(json.dumps({"chosen": chosen, "worst load ratio": {str(s): worst_load_ratio(judged[s]) for s in seeds}}, indent=1))
    return load_batch_policy(out), chosen, judged


def schedule_spec(evaluation: dict, largest: int) -> str:
    """The per-batch-size schedule of the best static depths the judgement found (``schedule:`` spec), each
    load's depth up to the next load, the last one up to ``largest``."""
    loads = sorted(int(load) for load in evaluation)
    highs = [nxt - 1 for nxt in loads[1:]] + [largest]
    return "schedule:" + ",".join(f"{low}-{high}={evaluation[str(low)]['best static depth']}" for low, high in zip(loads, highs))
