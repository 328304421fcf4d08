"""Tree replay against live tree decoding of the default pair: are the replayed rounds the live ones?

For the first test prompts per language, each tree configuration (static depth and V, or a learned tree
run) decodes live with :class:`adaptive.tree_decoder.TreeDecoder` and in replay on the tree traces.

- Greedy traces: per configuration, rounds whose (levels, nodes verified, accepted, emitted) agree, and the
  replay's modelled seconds per token against the live measured ones (error = replay / live - 1).
- Sampled traces (trees recorded along outputs sampled from the target, ``adaptive record --tree K,W,V --outputs
  PAIR-SPLIT-tT.npz``; exact in distribution): per distinct prompt, --repeats live generations at the traces'
  sampling setting against the replay of every recorded output; per configuration the accepted tokens per round and
  draft + verify milliseconds per token of both, and whether replay lies inside live's 95 % bootstrap interval over
  prompts.

Run: .venv/bin/python benchmarks/tree_replay_vs_live.py [--traces FILE] [--per-language 1] [--policy runs/tree-latest]
     [--profile PROFILE|auto]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from adaptive import SamplingConfig, load_pair
from adaptive.profile import CostProfile
from adaptive.profiling import hardware_description
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.tree_traces import TreeTraceSet
from adaptive.workload import chat_ids, first_per_language, load_prompts
from envs.rollout import run_policy
from envs.tree_replay import TreeReplayBackend
from lab.calibration import sampled_counts
from lab.environments import TREE_SIZES, quick_profile
from lab.evaluation import ratio_interval
from lab.live_protocol import pause_file, wait_while_paused
from lab.report import format_table
from policies import make_policy

CONFIGS = [("static:1", 2), ("static:2", 2), ("static:3", 8)]


def config_name(spec: str, size: int) -> str:
    return f"{spec} V={size}" if spec in dict(CONFIGS) else f"learned ({Path(spec).name})"


def greedy(args: argparse.Namespace, traces: TreeTraceSet, profile: CostProfile, pair, configs: list[tuple[str, int]]) -> tuple[str, dict]:
    """Round-by-round agreement and modelled against measured time, one live generation per prompt."""
    shape, depth = traces.shape, traces.max_depth
    rows_by_id = {p["id"]: p for p in load_prompts(traces.metadata["split"])}
    chosen = first_per_language(traces.langs, args.per_language)
    table, report = [], []
    for spec, size in configs:
        backend = TreeReplayBackend(traces, profile, depth, size)
        same = total = 0
        modelled = measured = tokens = 0.0
        for index in chosen:
            ids = chat_ids(pair.tokenizer, rows_by_id[traces.prompt_ids[index]]["prompt"])
            decoder = TreeDecoder(pair.target, pair.draft, make_policy(spec), TreeShape(shape.branching, shape.width, size), max_depth=depth)
            wait_while_paused(pause_file())  # while runs/pause exists, other work has the machine
            live = decoder.generate(ids, traces.max_new_tokens)
            (episode,) = run_policy(backend, make_policy(spec), [index], 0.0)
            live_rounds = [(r.drafted, r.verified, r.accepted, r.emitted) for r in live.rounds]
            replay_rounds = [(c.drafted, c.verified, c.accepted, c.emitted) for c in episode.cycles]
            same += sum(a == b for a, b in zip(live_rounds, replay_rounds))
            total += max(len(live_rounds), len(replay_rounds))
            modelled += episode.seconds
            measured += sum(r.draft_time + r.verify_time for r in live.rounds)
            tokens += len(live.token_ids)
        name = config_name(spec, size)
        table.append([name, f"{same}/{total}", f"{modelled / measured - 1:+.1%}"])
        report.append({"config": name, "rounds_equal": same, "rounds": total, "time_error": modelled / measured - 1, "tokens": tokens})
    header = (
        f"tree replay vs live, {len(chosen)} test prompts ({args.per_language} per language), k={shape.branching} W={shape.width}, "
        f"{traces.max_new_tokens} new tokens, profile {args.profile}"
    )
    return f"{header}\n\n{format_table(['config', 'rounds equal', 'modelled / measured time - 1'], table)}\n", {"header": header, "rows": report}


def sampled(args: argparse.Namespace, traces: TreeTraceSet, profile: CostProfile, pair, configs: list[tuple[str, int]]) -> tuple[str, dict]:
    """Live sampled tree decoding against the replay of the recorded sampled outputs, per prompt, with intervals."""
    shape, depth = traces.shape, traces.max_depth
    sampling = SamplingConfig(traces.temperature, traces.metadata.get("top_k"), traces.metadata.get("top_p", 1.0))
    rows_by_id = {p["id"]: p for p in load_prompts(traces.metadata["split"])}
    entries: dict[str, list[int]] = {}
    for i, prompt_id in enumerate(traces.prompt_ids):
        entries.setdefault(prompt_id, []).append(i)
    firsts = [indices[0] for indices in entries.values()]
    chosen = [traces.prompt_ids[firsts[k]] for k in first_per_language([traces.langs[i] for i in firsts], args.per_language)]
    table, rows = [], []
    for spec, size in configs:
        backend = TreeReplayBackend(traces, profile, depth, size)
        tree_shape = TreeShape(shape.branching, shape.width, size)
        mine = []
        for prompt_id in chosen:
            ids = chat_ids(pair.tokenizer, rows_by_id[prompt_id]["prompt"])
            decoder = TreeDecoder(pair.target, pair.draft, make_policy(spec), tree_shape, sampling, max_depth=depth)
            lives = []
            for seed in range(args.repeats):
                wait_while_paused(pause_file())
                lives.append(decoder.generate(ids, traces.max_new_tokens, seed=seed))
            replays = run_policy(backend, make_policy(spec), entries[prompt_id], 0.0)
            mine.append(
                {
                    "config": config_name(spec, size),
                    "prompt": prompt_id,
                    "outputs": len(entries[prompt_id]),
                    **sampled_counts(lives, replays),
                }
            )
        cells = [config_name(spec, size), len(mine), sum(r["outputs"] for r in mine)]
        for top, bottom, scale in (("accepted", "rounds", 1.0), ("seconds", "tokens", 1e3)):
            value, low, high = ratio_interval(mine, f"live_{top}", f"live_{bottom}")
            replayed = sum(r[f"replay_{top}"] for r in mine) / sum(r[f"replay_{bottom}"] for r in mine)
            cells += [f"{value * scale:.3f} [{low * scale:.3f}, {high * scale:.3f}]", f"{replayed * scale:.3f}", "yes" if low <= replayed <= high else "NO"]
        table.append(cells)
        rows += mine
    header = (
        f"Sampled tree replay vs live on {args.traces} ({sampling.describe()}, k={shape.branching} W={shape.width}, up to {depth} levels): "
        f"{args.repeats} live generations per prompt against the replay of each recorded output; profile {args.profile}; time is "
        "draft + verify per emitted token; intervals: bootstrap over prompts."
    )
    columns = ["config", "prompts", "recorded outputs", "live accepted/round [95 %]", "replay", "inside", "live ms/token [95 %]", "replay", "inside"]
    return f"{header}\n\n{format_table(columns, table)}\n", {"header": header, "sampling": sampling.describe(), "repeats": args.repeats, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default="data/traces/smollm2-135m-test-tree.npz")
    parser.add_argument("--profile", default="profiles/smollm2-135m-tree.json", help="a tree profile, or auto (measured here first)")
    parser.add_argument("--per-language", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="sampled traces: live generations per prompt")
    parser.add_argument("--policy", action="append", default=[], help="learned tree run (its size network picks V)")
    parser.add_argument("--out", default="benchmarks/results/tree_replay_vs_live")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    traces = TreeTraceSet.load(args.traces)
    # live at the dtype and on the engine the traces were recorded with
    pair = load_pair(traces.metadata["pair"], traces.metadata.get("dtype", "float32"), engine=traces.metadata.get("engine", "eager"))
    if args.profile == "auto":
        profile = quick_profile(pair, (max(TREE_SIZES) if args.policy else max(size for _, size in CONFIGS)) + 1, tree_mask=True)
        profile.save(Path(args.out + "-profile.json"))
        args.profile = args.out + "-profile.json"
    profile = CostProfile.load(args.profile)
    configs = [*CONFIGS, *((run, traces.shape.size) for run in args.policy)]
    text, result = (sampled if traces.temperature > 0 else greedy)(args, traces, profile, pair, configs)
    text += f"\nHardware: {hardware_description(pair.target.device)['processor']}.\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.md").write_text(text)
    Path(f"{args.out}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
