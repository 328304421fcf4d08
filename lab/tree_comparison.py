"""``adaptive evaluate`` for tree configs (``env.tree: true``): draft trees against chains on the test split.

Compared, with one cost profile for all (the config's, timed with a tree mask): grid search over static
chain depth, grid search over tree (depth, V), both fitted in replay on the train and val traces; every
learned run given — a run trained on tree traces decodes trees (its size network picks V), any other
decodes chains; the chain rules of :data:`CHAIN_RULES`; the chain oracle and the per-round tree oracle. Replay on
every test trace (chain traces for chains, tree traces for trees: both exact under greedy decoding), then live, wall
clock, back to back with plain decoding; paired gains of each learned policy against its kind's grid search and
transformers' default rule.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from adaptive.decoder import SpeculativeDecoder
from adaptive.learned_policy import load_policy
from adaptive.profile import CostProfile
from adaptive.traces import TraceSet
from adaptive.tree import TreeShape
from adaptive.tree_decoder import TreeDecoder
from adaptive.tree_traces import TreeTraceSet
from adaptive.workload import LANGUAGES
from envs.factory import default_traces
from envs.replay import ReplayBackend
from envs.tree_replay import TreeReplayBackend
from lab import live_protocol
from lab.calibration import live_against_replay, modelled_table
from lab.comparison import replay_table, track_comparison
from lab.config import ExperimentConfig
from lab.environments import TREE_SIZES, decoding_engine, resolve_profile
from lab.evaluation import PromptRecord, gain_line, grid_search_splits, oracle_share, play, records_gain, static_speedups
from lab.plots import plot_speedups
from lab.report import format_table
from policies import make_policy
from policies.baselines import StaticDepth
from policies.oracle import OraclePolicy, TreeOracle

CHAIN_RULES = {"chain confidence:0.4": "confidence:0.4", "chain heuristic": "heuristic", "chain entropy:2": "entropy:2.0", "chain specdec:0.7": "specdec:0.7"}
"""The chain rules beside grid search: transformers' default (confidence 0.4), the heuristic schedule, an entropy bound
(AdaEDL's kind of rule) and SpecDec++'s stop on the shipped acceptance predictor."""


def tree_grid(
    traces: list[TreeTraceSet], profile: CostProfile, max_depth: int, decision_seconds: float, sizes: tuple[int, ...] = TREE_SIZES
) -> tuple[tuple[int, int], dict[str, float]]:
    """The static (depth, V) with the highest mean replayed throughput over ``traces``, and every pair's."""
    backends = [TreeReplayBackend(trace_set, profile, max_depth) for trace_set in traces]  # the size is set per play
    totals: dict[tuple[int, int], float] = {}
    for size in (s for s in sizes if s <= backends[0].max_size):
        for backend in backends:
            backend.size = size
            for depth, speed in static_speedups(backend, range(backend.num_prompts), max_depth, decision_seconds).items():
                totals[depth, size] = totals.get((depth, size), 0.0) + speed
    speeds = {f"{depth},{size}": totals[depth, size] / len(traces) for depth, size in sorted(totals)}
    best = max(speeds, key=lambda key: (speeds[key], -int(key.split(",")[1]), -int(key.split(",")[0])))
    depth, size = (int(x) for x in best.split(","))
    return (depth, size), speeds


def evaluate_trees(
    config: ExperimentConfig,
    learned: list[str],
    out: Path,
    live_per_language: int = 1,
    new_tokens: int = 128,
    sizes: tuple[int, ...] = TREE_SIZES,
    repeats: int = 2,
) -> dict:
    """Trees vs chains on the test split; writes ``report.md``, ``evaluation.json`` and a plot into ``out``. The
    live part keeps its finished prompts in ``out`` until then: run again into the same ``out``, it resumes."""
    out.mkdir(parents=True, exist_ok=True)
    pair = live_protocol.warm_pair(config.pair, config.dtype, decoding_engine(config)) if live_per_language else None  # loaded (and compiled) once
    profile = resolve_profile(config, out, max_verify=max(sizes) + 1, pair=pair)
    depth, seconds = config.env.max_depth, config.env.decision_seconds
    chains = {split: TraceSet.load(default_traces(split, config.pair, engine=profile.engine)) for split in ("train", "val", "test")}
    trees = {split: TreeTraceSet.load(default_traces(split, config.pair, tree=True, engine=profile.engine)) for split in ("train", "val", "test")}
    shape = trees["test"].shape
    ranked, chain_speeds = grid_search_splits({split: chains[split] for split in ("train", "val")}, profile, depth, seconds)
    chain_best = ranked[0]
    fitted: dict = {"chain_grid": chain_speeds}
    (tree_depth, tree_size), fitted["tree_grid"] = tree_grid([trees["train"], trees["val"]], profile, depth, seconds, sizes)
    fitted.update(chain_best=chain_best, tree_best={"depth": tree_depth, "size": tree_size}, shape=shape.__dict__)

    test_chain, test_tree = chains["test"], trees["test"]
    if list(test_tree.prompt_ids) != list(test_chain.prompt_ids):
        raise ValueError("the test split's tree and chain traces hold different prompts: record them along the same outputs (data/traces/README.md)")
    chain_backend = ReplayBackend(test_chain, profile, depth)
    tree_backend = TreeReplayBackend(test_tree, profile, depth, tree_size)  # one backend; its default V is set per play
    replay: dict[str, list[PromptRecord]] = {
        f"chain grid (static:{chain_best})": play(chain_backend, lambda: StaticDepth(chain_best), range(len(test_chain)), test_chain.langs, seconds),
        f"tree grid (static:{tree_depth}, V={tree_size})": play(tree_backend, lambda: StaticDepth(tree_depth), range(len(test_tree)), test_tree.langs, seconds),
    }
    for name, spec in CHAIN_RULES.items():
        replay[name] = play(chain_backend, lambda s=spec: make_policy(s, config.pair), range(len(test_chain)), test_chain.langs, seconds)
    decoders: dict[str, Callable[[], object]] = {}
    if pair is not None:
        decoders[f"chain grid (static:{chain_best})"] = lambda: SpeculativeDecoder(pair.target, pair.draft, StaticDepth(chain_best), max_depth=depth)
        decoders[f"tree grid (static:{tree_depth}, V={tree_size})"] = lambda: TreeDecoder(
            pair.target, pair.draft, StaticDepth(tree_depth), TreeShape(shape.branching, shape.width, tree_size), max_depth=depth
        )
        for name, spec in CHAIN_RULES.items():
            decoders[name] = lambda s=spec: SpeculativeDecoder(pair.target, pair.draft, make_policy(s, config.pair), max_depth=depth)
    for path in learned:
        policy = load_policy(path, pair=config.pair)
        tree = policy.metadata.get("tree")
        name = f"{'tree' if tree else 'chain'} learned ({Path(path).name})"
        if tree:
            tree_backend.size = tree["size"]
            replay[name] = play(tree_backend, lambda p=policy: p, range(len(test_tree)), test_tree.langs, seconds)
        else:  # a chain run decodes with the depth cap it was trained with
            own = ReplayBackend(test_chain, profile, policy.schema.max_depth)
            replay[name] = play(own, lambda p=policy: p, range(len(test_chain)), test_chain.langs, seconds)
        if pair is not None:
            if tree:
                tree_shape = TreeShape(shape.branching, shape.width, tree["size"])
                decoders[name] = lambda p=policy, s=tree_shape: TreeDecoder(pair.target, pair.draft, p, s, max_depth=depth)
            else:
                decoders[name] = lambda p=policy: SpeculativeDecoder(pair.target, pair.draft, p, max_depth=p.schema.max_depth)
    replay["chain oracle (replay only)"] = play(chain_backend, lambda: OraclePolicy(chain_backend), range(len(test_chain)), test_chain.langs, seconds)
    replay["tree oracle (replay only)"] = play(tree_backend, lambda: TreeOracle(tree_backend), range(len(test_tree)), test_tree.langs, seconds)
    rows, replay_data = replay_table(replay, profile.target_step_seconds, depth)
    gains = {label: records_gain(replay[name], replay[reference]) for label, (name, reference) in _pairings(list(replay)).items()}
    live, modelled, live_gains = {}, {}, {}
    if pair is not None:
        prompts, ids = live_protocol.first_prompts(pair, "test", live_per_language)
        checkpoint, identity = live_protocol.checkpoint_path(out, "test"), live_protocol.identity(pair, {"draft": pair.draft}, learned)
        measured = live_protocol.measure(pair.target, prompts, ids, decoders, new_tokens, repeats, desc="live test", checkpoint=checkpoint, identity=identity)
        live = live_protocol.summarise(measured)
        live_gains = {label: live_protocol.compare(measured, *pairing) for label, pairing in _pairings(list(measured)).items()}
        if new_tokens == test_chain.max_new_tokens:  # replay emits the traces' budget
            modelled = live_against_replay(measured, replay, test_chain, profile)
    result = {
        "fitted": fitted,
        "replay": replay_data,
        "replay_gains": gains,
        "live": live,
        "live_modelled": modelled,
        "live_gains": live_gains,
        "test_prompts": len(test_chain),
        "live_per_language": live_per_language,
        "repeats": repeats,
        "new_tokens": new_tokens,
        "profile": config.env.profile,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out / "evaluation.json").write_text(json.dumps(result, indent=1))
    (out / "report.md").write_text(_report(result, rows))

    plot_speedups(replay_data, out / "plots" / "speedup_replay.png", "replay: trees vs chains (test split)")
    if live:
        plot_speedups(live, out / "plots" / "speedup_live.png", "live: trees vs chains (test split)")
    track_comparison(config, out, rows, replay_data, live)
    live_protocol.discard_checkpoints(out)
    return result


def _pairings(names: list[str]) -> dict[str, tuple[str, str]]:
    """The comparisons an evaluation reports, label -> (configuration, reference): each learned policy against its
    kind's grid search and against transformers' default rule, and the tree grid against the chain grid."""
    grid = {kind: next(n for n in names if n.startswith(f"{kind} grid")) for kind in ("tree", "chain")}
    pairs = {f"{name} vs {kind} grid": (name, grid[kind]) for name in names for kind in grid if name.startswith(f"{kind} learned")}
    rule = next(iter(CHAIN_RULES))
    pairs |= {f"{name} vs {rule}": (name, rule) for name in names if "learned" in name and rule in names}
    return pairs | {"tree grid vs chain grid": (grid["tree"], grid["chain"])}


def _report(result: dict, rows: list[list]) -> str:
    fitted = result["fitted"]
    shape = fitted["shape"]
    best = sorted(fitted["tree_grid"].items(), key=lambda kv: -kv[1])[:5]
    lines = [
        "# Evaluation: draft trees vs chains (greedy)",
        "",
        f"Test split: {result['test_prompts']} prompts in replay (exact under greedy decoding; time from {result['profile']}); "
        f"live: first {result['live_per_language']} test prompts per language, {result['new_tokens']} new tokens, wall clock.",
        f"Tree shape k={shape['branching']}, W={shape['width']}. Grid search on train and val traces (mean): chain static:{fitted['chain_best']}; "
        f"tree static:{fitted['tree_best']['depth']} with V={fitted['tree_best']['size']} "
        f"(best five (depth,V): {', '.join(f'({k}) {v:.3f}x' for k, v in best)}).",
        "",
        "## Replay: speedup over plain decoding [95 % bootstrap over prompts]",
        "",
        format_table(["policy", *LANGUAGES, "all", "tau"], rows),
        "",
    ]
    replay = result["replay"]
    for label, gain in result["replay_gains"].items():
        lines.append(gain_line(label, gain, "replay"))
        name, reference = label.split(" vs ")
        kind = reference.split()[0]
        if reference == f"{kind} grid" and name.startswith(kind):
            grid = replay[next(n for n in replay if n.startswith(f"{kind} grid"))]["all"]["speedup"]
            oracle = replay.get(f"{kind} oracle (replay only)", {}).get("all", {}).get("speedup")
            if oracle is not None:
                share = oracle_share(replay[name]["all"]["speedup"], grid, oracle)
                myopic = ", its oracle per round" if kind == "tree" else ""
                lines.append(f"- {name} captures {share:.0%} of the {kind} oracle's gain over {kind} grid search (replay{myopic})")
    if result["live"]:
        lines += live_protocol.report(result["live"], result["repeats"])
        lines += ["", *(gain_line(label, gain, "live, paired over prompts") for label, gain in result.get("live_gains", {}).items())]
    if result["live_modelled"]:
        lines += ["", "## Modelled against live: every row of the live table, replayed on the same prompts' test traces", ""]
        lines += modelled_table(result["live_modelled"])
    return "\n".join(lines) + "\n"
