"""Commands that train and judge policies: ``train``, ``evaluate``, ``retarget``."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from lab.cli.commands import add_command
from lab.cli.common import add_worker_arguments
from lab.comparison import evaluate
from lab.config import load_config
from lab.copy_comparison import evaluate_sources
from lab.report import format_table
from lab.retarget import retarget
from lab.runs import check_output_folder, finished_run_name, latest_runs, link_latest, new_run_folder, stamped
from lab.sweep import parse_assignment, report, run_sweep
from lab.training import resume, train
from lab.tree_comparison import evaluate_trees

PROFILE_HELP = (
    "cost profile for every replay number: auto measures a short one of the pair on this machine first (under a minute) "
    "and keeps it in the output folder; a file reproduces numbers measured elsewhere (default: the config's env.profile)"
)


def cmd_train(args: argparse.Namespace) -> int:
    """Train depth (and size) policies with PPO as an experiment config says; or resume a killed run."""
    if bool(args.config) == bool(args.resume):
        raise ValueError("give either a CONFIG file or --resume RUN_DIR")
    if args.resume:
        folder = Path(args.resume).resolve()  # runs/NAME-latest works too
        final = resume(folder)
        name = load_config(folder / "config.yaml").name
    else:
        config = load_config(args.config)
        if args.profile:
            config.env.profile = args.profile
            config.validate()
        folder, name = new_run_folder(args.runs, config.name), config.name
        print(f"run folder: {folder}   (killed? continue with: adaptive train --resume {folder})")
        try:
            final = train(config, folder)
        except ValueError:
            if not (folder / "state.json").exists():  # refused before training began: leave nothing behind
                shutil.rmtree(folder, ignore_errors=True)
            raise
    print(f"{link_latest(folder.parent, name, folder)} now points to this run")
    evaluation = json.loads((folder / "evaluation.json").read_text())
    rows = [[name, f"{v['speedup']:.3f}x", v["tokens"], f"{v['seconds']:.2f}"] for name, v in evaluation.items()]
    print(format_table(["policy (evaluation env)", "speedup over plain", "tokens", "modelled seconds"], rows))
    print(f"policy: {final}   use it: adaptive generate --policy {folder} ...   plots: {folder / 'plots'}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Train a grid of configs (values of some keys × seeds), on Ray workers or here, and compare the runs."""
    assignments = [parse_assignment(text) for text in args.set or []]
    seeds = [int(x) for x in args.seeds.split(",")]
    base = load_config(args.config)  # the base config must be valid on its own
    out = Path(args.out or stamped(args.runs, f"{base.name}-sweep"))
    print(f"sweep folder: {out}")
    comparison = run_sweep(args.config, assignments, seeds, out, args.workers, args.address)
    print(report(comparison))
    print(f"sweep.json, report.md and sweep.png in {out}; each run in {out}/RUN")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Compare learned policies with grid search, the cost model, heuristics and the oracle on the test split."""
    config = load_config(args.config)
    if args.profile:
        config.env.profile = args.profile
    learned = args.policy or latest_runs(args.runs, config.name)
    if args.live_per_language == 0 and (args.grid_live_per_language or args.calibration_per_language):
        print("--live-per-language 0: replay only (no grid search live check, no calibration)")
        args.grid_live_per_language = args.calibration_per_language = 0
    out = check_output_folder(args.out or stamped("evaluations", config.name), "--out")
    if config.env.tree:
        evaluate_trees(config, learned, out, args.live_per_language, args.max_new_tokens, repeats=args.repeats)
    elif config.env.copy:
        evaluate_sources(config, learned, out, args.live_per_language, args.max_new_tokens, args.repeats)
    else:
        evaluate(config, learned, out, args.live_per_language, args.max_new_tokens, args.grid_live_per_language, args.repeats, args.calibration_per_language)
    print((out / "report.md").read_text())
    print(f"report, evaluation.json and plots in {out}")
    return 0


def cmd_retarget(args: argparse.Namespace) -> int:
    """Evaluate a trained policy under another cost profile and re-train it briefly from its checkpoints."""
    run = Path(args.run)
    out = Path(args.out or stamped(args.runs, f"{finished_run_name(run)}-retarget"))
    print(f"re-training into {out}")
    result = retarget(run, args.profile, args.timesteps, out)
    rows = [
        ["old policy, old profile", f"{result['old_policy_on_old_profile']:.3f}x"],
        ["old policy, new profile", f"{result['old_policy']:.3f}x"],
        [f"re-trained ({args.timesteps} steps), new profile", f"{result['retrained_policy']:.3f}x"],
        [f"best static ({result['best_static']['policy']}), new profile", f"{result['best_static']['speedup']:.3f}x"],
        ["oracle, new profile", f"{result['oracle']:.3f}x"],
    ]
    print(f"replay on the val traces; new profile {args.profile} (old: {result['old_profile']})")
    print(format_table(["policy", "speedup over plain"], rows))
    print(f"re-training gain {result['retraining_gain']:+.1%}; written to {out / 'retarget.json'}; use it: --policy {out}")
    return 0


def register(commands) -> None:
    """Add this module's subcommands to the ``adaptive`` parser."""
    trn = add_command(commands, "train")
    trn.add_argument("config", nargs="?", help="experiment YAML, e.g. experiments/quickstart.yaml")
    trn.add_argument("--runs", default="runs", help="folder for run folders (default runs/); RUNS/NAME-latest links the newest")
    trn.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its last checkpoint")
    trn.add_argument("--profile", help=PROFILE_HELP)
    trn.set_defaults(func=cmd_train)

    swp = add_command(commands, "sweep")
    swp.add_argument("config", help="the base experiment YAML")
    swp.add_argument("--set", action="append", metavar="KEY=V1,V2", help="a config key and its values (repeatable; dotted keys, e.g. env.max_depth=4,8)")
    swp.add_argument("--seeds", default="0", help="comma-separated seeds, each grid point trained once per seed (default 0)")
    swp.add_argument("--runs", default="runs", help="parent of the sweep folder (default runs/)")
    swp.add_argument("--out", help="sweep folder (default RUNS/NAME-sweep-DATE)")
    add_worker_arguments(swp, "training runs")
    swp.set_defaults(func=cmd_sweep)

    ev = add_command(commands, "evaluate")
    ev.add_argument("config", help="the experiment YAML the policies were trained with")
    ev.add_argument(
        "--policy",
        action="append",
        help="learned policy run folder (repeatable; default RUNS/NAME-latest); with a tree config, runs trained on chains decode chains; "
        "with a copy config (env.copy), runs trained without the copy drafter decode without it",
    )
    ev.add_argument("--runs", default="runs")
    ev.add_argument("--profile", help=PROFILE_HELP)
    ev.add_argument("--live-per-language", type=int, default=2, help="test prompts per language decoded live (0: replay only)")
    ev.add_argument(
        "--grid-live-per-language",
        type=int,
        default=1,
        help="val prompts per language on which grid search's 3 best depths are decoded live; one replaces the replay "
        "choice only when faster with a 95 %% interval above 1 (0: replay only)",
    )
    ev.add_argument("--repeats", type=int, default=2, help="live: runs of each configuration per prompt, back to back in rotating order; medians (default 2)")
    ev.add_argument(
        "--calibration-per-language",
        type=int,
        default=1,
        help="val prompts per language decoded live to check replay's modelled time against this machine (0: skip)",
    )
    ev.add_argument("--max-new-tokens", type=int, default=128)
    ev.add_argument("--out", help="report folder (default evaluations/NAME-DATE); run again into the same folder, a killed evaluation resumes its live parts")
    ev.set_defaults(func=cmd_evaluate)

    ret = add_command(commands, "retarget")
    ret.add_argument("run", help="training run folder, e.g. runs/quickstart-latest")
    ret.add_argument(
        "--profile",
        default="auto",
        help="the new cost profile: a file (adaptive profile --out FILE) or auto (default): this machine, measured now into the new run folder",
    )
    ret.add_argument("--timesteps", type=int, default=10_000, help="re-training steps per phase (default 10000)")
    ret.add_argument("--runs", default="runs")
    ret.add_argument("--out", help="run folder of the re-trained policy (default RUNS/NAME-retarget-DATE)")
    ret.set_defaults(func=cmd_retarget)
