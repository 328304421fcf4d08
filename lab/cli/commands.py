"""The ``adaptive`` subcommands: each one's module and one-line summary. Only this table is read to list them
(``adaptive --help``), so the listing imports nothing heavy; a command's module is imported when it runs."""

from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "exactness": ("lab.cli.decoding", "audit correction rules: exact induced distributions and Monte Carlo"),
    "costmodel": ("lab.cli.decoding", "speedup sweep over static depth and the analytic optimum"),
    "generate": ("lab.cli.decoding", "speculative decoding of one prompt with per-round statistics"),
    "demo": ("lab.cli.decoding", "decode one test prompt per language, speculative vs plain, with speedups"),
    "profile": ("lab.cli.data", "measure draft step and verification costs of a pair on this machine"),
    "fit-acceptance": ("lab.cli.data", "fit the acceptance predictor (SpecDec++) on traces; calibration and the rule's thresholds in replay"),
    "record": ("lab.cli.data", "record replay traces of a pair on a workload split"),
    "distill-data": ("lab.cli.data", "generate the target's responses to the draft-training prompts (sharded, resumable)"),
    "chat-prompts": ("lab.cli.data", "general-chat requests for the draft pool: expanded hand-written seeds, then English turns by the target (resumable)"),
    "distill": ("lab.cli.data", "train a draft for the default target on its own responses: a standalone model or an EAGLE-3 head"),
    "train": ("lab.cli.experiments", "train draft policies with PPO from an experiment config"),
    "sweep": ("lab.cli.experiments", "train a grid of experiment configs (key values × seeds), on Ray workers or here, and compare them"),
    "evaluate": ("lab.cli.experiments", "learned policies vs grid search, cost model, heuristics, oracle on the test split"),
    "retarget": ("lab.cli.experiments", "re-evaluate a trained policy under another cost profile and re-train it briefly"),
    "loadtest": ("lab.cli.serving", "batched speculative decoding under load: latency percentiles, goodput, throughput, memory; plain batched decoding beside"),
    "train-batch": ("lab.cli.serving", "PPO for a load-aware batch policy in batched replay (greedy traces + a batched cost profile)"),
}
"""Command name -> (the module whose ``register`` adds its parser, its summary)."""


def add_command(commands, name: str):
    """The subparser of command ``name``, with its summary as help and description."""
    summary = COMMANDS[name][1]
    return commands.add_parser(name, help=summary, description=summary[0].upper() + summary[1:] + ".")
