"""Tree replay against live tree decoding of the default pair: are the replayed rounds the live ones?

For the first test prompts per language, each tree configuration (static depth and V, or a learned tree
run) decodes live with :class:`adaptive.tree_decoder.TreeDecoder` and in replay on the shipped test tree
traces. Reported per configuration: rounds whose (levels, nodes verified, accepted, emitted) agree, and the
replay's modelled seconds per token against the live measured ones (error = replay / live - 1).

Run: .venv/bin/python benchmarks/tree_replay_vs_live.py [--per-language 1] [--policy runs/tree-latest]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from adaptive import load_pair
from adaptive.profile import CostProfile
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.tree_traces import TreeTraceSet
from adaptive.workload import chat_ids, first_per_language, load_prompts
from envs.rollout import run_policy
from envs.tree_replay import TreeReplayBackend
from lab.live_protocol import pause_file, wait_while_paused
from lab.report import format_table
from policies import make_policy

CONFIGS = [("static:1", 2), ("static:2", 2), ("static:3", 8)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", default="data/traces/smollm2-135m-test-tree.npz")
    parser.add_argument("--profile", default="profiles/smollm2-135m-tree.json")
    parser.add_argument("--per-language", type=int, default=1)
    parser.add_argument("--policy", action="append", default=[], help="learned tree run (its size network picks V)")
    parser.add_argument("--out", default="benchmarks/results/tree_replay_vs_live")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    traces, profile = TreeTraceSet.load(args.traces), CostProfile.load(args.profile)
    pair = load_pair(traces.metadata["pair"], traces.metadata.get("dtype", "float32"))  # live at the dtype the traces were recorded at
    shape, depth = traces.shape, traces.max_depth
    rows_by_id = {p["id"]: p for p in load_prompts(traces.metadata["split"])}
    chosen = first_per_language(traces.langs, args.per_language)
    configs = [(spec, size) for spec, size in CONFIGS] + [(run, shape.size) for run in args.policy]
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
        name = spec if spec in dict(CONFIGS) else f"learned ({Path(spec).name})"
        name = f"{name} V={size}" if spec in dict(CONFIGS) else name
        table.append([name, f"{same}/{total}", f"{modelled / measured - 1:+.1%}"])
        report.append({"config": name, "rounds_equal": same, "rounds": total, "time_error": modelled / measured - 1, "tokens": tokens})
    header = (
        f"tree replay vs live, {len(chosen)} test prompts ({args.per_language} per language), k={shape.branching} W={shape.width}, "
        f"{traces.max_new_tokens} new tokens, profile {args.profile}"
    )
    text = f"{header}\n\n{format_table(['config', 'rounds equal', 'modelled / measured time - 1'], table)}\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.md").write_text(text)
    Path(f"{args.out}.json").write_text(json.dumps({"header": header, "rows": report}, indent=1))


if __name__ == "__main__":
    main()
