"""Replay against live decoding of the default pair: exactness of acceptances, modelled vs measured time,
and environment steps per second.

1. For the first prompts per language of a trace file, each policy decodes live (real models, the traces'
   sampling setting) and in replay. Greedy traces: rounds whose accepted length agrees (exactness), and
   accepted tokens per round and the replay's modelled draft + verify seconds per token against the live
   measured ones (error = replay / live - 1, per policy and overall). Sampled traces (exact in
   distribution): every recorded output of each prompt replayed --repeats times against --repeats live
   generations per prompt; per policy the replay's accepted tokens per round and seconds per token, and
   whether each lies inside the live value's 95 % bootstrap interval over prompts.
2. Steps per second of the replay env and the live env (random depth actions, one torch thread), as a ratio.

Run: .venv/bin/python benchmarks/replay_vs_live.py [--traces data/traces/smollm2-135m-val.npz] [--per-language 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from adaptive import SamplingConfig, SpeculativeDecoder, load_pair
from adaptive.profile import CostProfile
from adaptive.profiling import hardware_description
from adaptive.traces import TraceSet
from adaptive.workload import LANGUAGES, chat_ids, load_prompts
from envs.env import SpecDecodeEnv
from envs.live import LiveBackend
from envs.replay import ReplayBackend
from envs.rollout import run_policy
from lab.calibration import sampled_counts
from lab.environments import quick_profile
from lab.evaluation import ratio_interval
from lab.live_protocol import pause_file, wait_while_paused
from lab.report import format_table
from policies import make_policy

POLICIES = ["static:1", "static:3", "heuristic", "confidence"]


def steps_per_second(env: SpecDecodeEnv, seconds: float, seed: int = 0) -> tuple[float, int]:
    """Random continue/stop actions for about ``seconds``; returns (steps/s, steps)."""
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, terminated, _, _ = env.step(int(rng.random() < 0.7))
        steps += 1
        if terminated:
            env.reset()
    return steps / (time.perf_counter() - start), steps


def live_generations(decoder: SpeculativeDecoder, ids: list[int], new_tokens: int, seeds: range) -> list:
    """One live generation per seed, each started only while the pause file (``runs/pause``) is absent."""
    results = []
    for seed in seeds:
        wait_while_paused(pause_file())
        results.append(decoder.generate(ids, new_tokens, seed=seed))
    return results


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    traces = TraceSet.load(args.traces)
    # live at the dtype and on the engine the traces were recorded with
    pair = load_pair(traces.metadata["pair"], traces.metadata.get("dtype", "float32"), engine=traces.metadata.get("engine", "eager"))
    if args.profile == "auto":  # this machine, now: what the live side is measured on
        profile = quick_profile(pair, traces.depth + 1)
        profile.save(Path(args.out + "-profile.json"))
        args.profile = args.out + "-profile.json"
    profile = CostProfile.load(args.profile)
    split = traces.metadata["split"]
    rows_by_id = {p["id"]: p for p in load_prompts(split)}
    chosen = []
    for lang in LANGUAGES:
        chosen += [i for i, other in enumerate(traces.langs) if other == lang][: args.per_language]
    replay = ReplayBackend(traces, profile)
    sampling = SamplingConfig(traces.metadata.get("temperature", 0.0), traces.metadata.get("top_k"), traces.metadata.get("top_p", 1.0))
    if not sampling.is_greedy:
        return run_sampled(args, traces, replay, pair, sampling)
    repeats = 1
    results = []
    for index in chosen:
        ids = chat_ids(pair.tokenizer, rows_by_id[traces.prompt_ids[index]]["prompt"])
        for spec in POLICIES:
            decoder = SpeculativeDecoder(pair.target, pair.draft, make_policy(spec), sampling, tokenizer=pair.tokenizer, max_depth=traces.depth)
            lives = live_generations(decoder, ids, traces.max_new_tokens, range(repeats))
            replays = [run_policy(replay, make_policy(spec), [index], decision_seconds=0.0)[0] for _ in range(repeats)]
            live_accepted = [r.accepted for r in lives[0].rounds]
            replay_accepted = [c.accepted for c in replays[0].cycles]
            row = {
                "prompt": traces.prompt_ids[index],
                "lang": traces.langs[index],
                "policy": spec,
                "rounds": len(live_accepted),
                "live_tokens": sum(len(r.token_ids) for r in lives),
                "replay_tokens": sum(e.tokens for e in replays),
                "live_accepted_per_round": statistics.mean(r.accepted for g in lives for r in g.rounds),
                "replay_accepted_per_round": statistics.mean(c.accepted for e in replays for c in e.cycles),
                "live_seconds": sum(r.draft_time + r.verify_time for g in lives for r in g.rounds),
                "replay_seconds": sum(c.draft_seconds + c.verify_seconds for e in replays for c in e.cycles),
            }
            if sampling.is_greedy:
                same_count = len(live_accepted) == len(replay_accepted)
                row["rounds_equal"] = sum(a == b for a, b in zip(live_accepted, replay_accepted)) if same_count else 0
                row["identical"] = live_accepted == replay_accepted
            results.append(row)
            print(
                f"{row['lang']} {spec:12s} rounds {row['rounds']:3d} accepted/round live {row['live_accepted_per_round']:.2f} "
                f"replay {row['replay_accepted_per_round']:.2f}; s/token live {row['live_seconds'] / row['live_tokens']:.4f} "
                f"replay {row['replay_seconds'] / row['replay_tokens']:.4f}",
                flush=True,
            )
    torch.set_num_threads(1)
    replay_rate, replay_steps = steps_per_second(SpecDecodeEnv(ReplayBackend(traces, profile)), args.seconds)
    live_decoder = SpeculativeDecoder(pair.target, pair.draft, make_policy("static:1"), tokenizer=pair.tokenizer, max_depth=traces.depth)
    prompts = [chat_ids(pair.tokenizer, rows_by_id[traces.prompt_ids[i]]["prompt"]) for i in chosen]
    live_rate, live_steps = steps_per_second(SpecDecodeEnv(LiveBackend(live_decoder, prompts, profile, traces.max_new_tokens)), args.seconds)
    return {
        "traces": str(args.traces),
        "sampling": sampling.describe(),
        "repeats": repeats,
        "profile": str(args.profile),
        "profile_measured_at": json.loads(Path(args.profile).read_text()).get("measured_at"),
        "hardware": hardware_description(pair.target.device),
        "rows": results,
        "replay_steps_per_second": replay_rate,
        "replay_steps": replay_steps,
        "live_steps_per_second": live_rate,
        "live_steps": live_steps,
    }


def run_sampled(args: argparse.Namespace, traces: TraceSet, replay: ReplayBackend, pair, sampling: SamplingConfig) -> dict:
    """Per distinct prompt (the first --per-language per language) and policy: --repeats live generations
    and --repeats replays of each recorded output of the prompt; round counts, accepted tokens, tokens and
    draft + verify seconds of each side."""
    rows_by_id = {p["id"]: p for p in load_prompts(traces.metadata["split"])}
    entries: dict[str, list[int]] = {}
    for i, prompt_id in enumerate(traces.prompt_ids):
        entries.setdefault(prompt_id, []).append(i)
    chosen = [pid for lang in LANGUAGES for pid in [p for p in entries if traces.langs[entries[p][0]] == lang][: args.per_language]]
    results = []
    for prompt_id in chosen:
        ids = chat_ids(pair.tokenizer, rows_by_id[prompt_id]["prompt"])
        for spec in POLICIES:
            decoder = SpeculativeDecoder(pair.target, pair.draft, make_policy(spec), sampling, tokenizer=pair.tokenizer, max_depth=traces.depth)
            lives = live_generations(decoder, ids, traces.max_new_tokens, range(args.repeats))
            replays = [e for seed in range(args.repeats) for e in run_policy(replay, make_policy(spec), entries[prompt_id], 0.0, seed=seed)]
            results.append(
                {
                    "prompt": prompt_id,
                    "lang": traces.langs[entries[prompt_id][0]],
                    "policy": spec,
                    "outputs": len(entries[prompt_id]),
                    **sampled_counts(lives, replays),
                }
            )
            print(
                f"{prompt_id} {spec}: accepted/round live {results[-1]['live_accepted'] / results[-1]['live_rounds']:.2f} "
                f"replay {results[-1]['replay_accepted'] / results[-1]['replay_rounds']:.2f}",
                flush=True,
            )
    return {
        "traces": str(args.traces),
        "sampling": sampling.describe(),
        "repeats": args.repeats,
        "profile": str(args.profile),
        "hardware": hardware_description(pair.target.device),
        "sampled_rows": results,
    }


def sampled_report(result: dict) -> str:
    rows, table = result["sampled_rows"], []
    for spec in [*POLICIES, "all"]:
        mine = [r for r in rows if spec in (r["policy"], "all")]
        cells = [spec, len({r["prompt"] for r in mine}), sum(r["outputs"] for r in mine) // max(1, len({r["policy"] for r in mine}))]
        for top, bottom in (("accepted", "rounds"), ("seconds", "tokens")):
            value, low, high = ratio_interval(mine, f"live_{top}", f"live_{bottom}")
            replayed = sum(r[f"replay_{top}"] for r in mine) / sum(r[f"replay_{bottom}"] for r in mine)
            scale = 1e3 if top == "seconds" else 1.0
            cells += [f"{value * scale:.3f} [{low * scale:.3f}, {high * scale:.3f}]", f"{replayed * scale:.3f}", "yes" if low <= replayed <= high else "NO"]
        table.append(cells)
    header = ["policy", "prompts", "recorded outputs", "live accepted/round [95 %]", "replay", "inside", "live ms/token [95 %]", "replay", "inside"]
    return "\n".join(
        [
            f"Sampled replay vs live on {result['traces']} ({result['sampling']}): {result['repeats']} live generations per prompt and "
            f"{result['repeats']} replays of each recorded output; profile {result['profile']}; time is draft + verify per emitted token; "
            "intervals: bootstrap over prompts.",
            "",
            format_table(header, table),
            "",
            f"Hardware: {result['hardware']['processor']}, torch {result['hardware']['torch']}.",
        ]
    )


def report(result: dict) -> str:
    rows = result["rows"]
    greedy = "rounds_equal" in rows[0]
    table = []
    for spec in [*POLICIES, "all"]:
        mine = [r for r in rows if spec in (r["policy"], "all")]
        per_token = [(r["replay_seconds"] / r["replay_tokens"]) / (r["live_seconds"] / r["live_tokens"]) - 1 for r in mine]
        total = (sum(r["replay_seconds"] for r in mine) / sum(r["replay_tokens"] for r in mine)) / (
            sum(r["live_seconds"] for r in mine) / sum(r["live_tokens"] for r in mine)
        ) - 1
        accepted = statistics.mean(r["replay_accepted_per_round"] for r in mine) / statistics.mean(r["live_accepted_per_round"] for r in mine) - 1
        rounds_equal = f"{sum(r['rounds_equal'] for r in mine)}/{sum(r['rounds'] for r in mine)}"
        exact = [rounds_equal, f"{sum(r['identical'] for r in mine)}/{len(mine)}"] if greedy else []
        table.append([spec, len(mine), *exact, f"{accepted:+.1%}", f"{statistics.median(per_token):+.1%}", f"{total:+.1%}"])
    header = ["policy", "runs", *(["rounds with equal acceptance", "runs identical"] if greedy else [])]
    header += ["accepted/round error", "median s/token error", "overall s/token error"]
    lines = [
        f"Replay vs live on {len(rows) // len(POLICIES)} prompts of {result['traces']} ({result['sampling']}, "
        f"{result['repeats']} run(s) per prompt and policy), profile {result['profile']} (measured {result['profile_measured_at']}). "
        "Errors are replay / live - 1; time is draft + verify seconds per emitted token.",
        "",
        format_table(header, table),
        "",
        f"Env steps per second, one torch thread, random depth actions: replay {result['replay_steps_per_second']:,.0f} "
        f"({result['replay_steps']} steps), live {result['live_steps_per_second']:,.1f} ({result['live_steps']} steps): "
        f"ratio {result['replay_steps_per_second'] / result['live_steps_per_second']:,.0f}x.",
        "",
        f"Hardware: {result['hardware']['processor']}, torch {result['hardware']['torch']}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="data/traces/smollm2-135m-val.npz")
    parser.add_argument("--profile", default="auto", help="auto (default): measure this machine first; or a profile file")
    parser.add_argument("--per-language", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="sampled traces: live generations per prompt and replays per recorded output")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the live decoding comparison")
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each steps-per-second measurement")
    parser.add_argument("--out", default="benchmarks/results/replay_vs_live")
    args = parser.parse_args()
    result = run(args)
    text = sampled_report(result) if "sampled_rows" in result else report(result)
    print(text)
    Path(args.out + ".json").write_text(json.dumps(result, indent=1))
    Path(args.out + ".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
