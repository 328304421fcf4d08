"""Wall-clock speedup of a pair on the test split, per language, side by side in one run.

Compared, on the same prompts (chat format), the same number of new tokens and the same dtype: plain target
decoding; our decoder with static γ = 1..8, each baseline policy and any learned policy given by path;
transformers `generate(assistant_model=…)` with its heuristic schedule and with its default confidence
threshold (0.4), with every draft of the run that is a transformers model (an EAGLE-3 head is not); with --tree,
each policy also with draft trees of each shape given (greedy and sampled); with --generate-route, each
policy also through transformers' own generate() (custom_generate=adaptive.integrations.transformers.generate). For every prompt all
configurations run back to back (interleaved), so machine noise spreads over all of them. Reported per
language: tokens/s (total emitted tokens / total time), speedup over plain, mean tokens per round τ (ours),
the per-token acceptance α = accepted / (accepted + rejections) (ours), and whether greedy outputs equal
plain greedy; at bfloat16 every greedy divergence is checked to be a near-tie (:mod:`adaptive.divergence`).

Run: .venv/bin/python benchmarks/pair_speedup.py [--per-language 3] [--repeats 2] [--temperatures 0,0.7] [--dtype auto]
     [--draft DIR] [--also-draft NAME=DIR ...] [--policies static:1,...,runs/NAME/policy.json] [--task TASK|copy-heavy|every] [--copy]
     [--tree K,W,V ...] [--generate-route]
(--draft: a draft folder for the pair's target, e.g. an EAGLE-3 head, instead of the pair's draft; --also-draft: every
policy also with this draft, in the same interleaved run — "POLICY [NAME]" — to compare drafts; --copy: a copy
drafter beside the draft for every policy, so policies with a source — static:G:copy, static:G:copy+model,
suffix — can use it, plus transformers' prompt-lookup rule as a drafter of its own, drafting to its cap of 10; --tree:
a tree round counts as a rejection when its accepted path stops short of the tree's depth.)
Every finished prompt is kept in OUT.SAMPLING.partial.jsonl until the report is written: a killed run, started again
with the same arguments on the same kind of machine, resumes there (another machine or other arguments: refused).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from transformers import PreTrainedModel

from adaptive import SamplingConfig, SpeculativeDecoder, load_pair
from adaptive.copy_draft import CopyDraft, PromptLookupDraft
from adaptive.divergence import first_divergence
from adaptive.generation import GenerationResult
from adaptive.integrations.transformers import generate as route_generate
from adaptive.models import smollm2_folder
from adaptive.pair import load_draft_for, load_pair_from_paths
from adaptive.profiling import hardware_description
from adaptive.tree_decoder import TreeDecoder
from adaptive.workload import COPY_TASKS, LANGUAGES, TASKS
from lab import live_protocol
from lab.cli.common import tree_shape
from lab.report import format_table
from policies import StaticDepth, make_policy

POLICIES = [f"static:{g}" for g in range(1, 9)] + ["heuristic", "confidence", "entropy", "costmodel"]
PROMPT_LOOKUP = "prompt lookup (transformers' rule, static:10)"
HF_MODES = {
    "transformers heuristic": {"num_assistant_tokens": 5, "num_assistant_tokens_schedule": "heuristic", "assistant_confidence_threshold": 0.0},
    "transformers confidence 0.4": {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.4},
}


class Assisted:
    """transformers' ``generate(assistant_model=draft)`` in one of its modes, as a decoder the live protocol runs."""

    def __init__(self, pair, draft: PreTrainedModel, mode: dict, sampling: SamplingConfig) -> None:
        self.pair, self.draft, self.mode, self.sampling = pair, draft, mode, sampling

    def generate(self, ids: list[int], new_tokens: int, seed: int = 0) -> GenerationResult:
        for key, value in self.mode.items():
            setattr(self.draft.generation_config, key, value)
        torch.manual_seed(seed)
        sampled = {"do_sample": True, "temperature": self.sampling.temperature, "top_k": None}
        start = time.perf_counter()
        out = self.pair.target.generate(
            torch.tensor([ids]),
            assistant_model=self.draft,
            max_new_tokens=new_tokens,
            pad_token_id=self.pair.tokenizer.eos_token_id,
            **({"do_sample": False} if self.sampling.is_greedy else sampled),
        )
        seconds = time.perf_counter() - start
        return GenerationResult(ids, out[0, len(ids) :].tolist(), [], 0.0, seconds, "length", first_token_time=math.nan)


class GenerateRoute:
    """transformers' ``generate()`` running our decoding loop (``custom_generate``) with a policy and the pair's
    draft, as a decoder the live protocol runs."""

    def __init__(self, pair, spec: str, sampling: SamplingConfig) -> None:
        self.pair, self.policy, self.sampling = pair, make_policy(spec), sampling

    def generate(self, ids: list[int], new_tokens: int, seed: int = 0) -> GenerationResult:
        torch.manual_seed(seed)
        sampled = {"do_sample": True, "temperature": self.sampling.temperature, "top_k": None}
        start = time.perf_counter()
        out = self.pair.target.generate(
            torch.tensor([ids]),
            custom_generate=route_generate,
            draft=self.pair.draft,
            policy=self.policy,
            max_new_tokens=new_tokens,
            pad_token_id=self.pair.tokenizer.eos_token_id,
            **({"do_sample": False} if self.sampling.is_greedy else sampled),
        )
        seconds = time.perf_counter() - start
        return GenerationResult(ids, out[0, len(ids) :].tolist(), [], 0.0, seconds, "length", first_token_time=math.nan)


def run(args: argparse.Namespace) -> dict:
    pair = load_pair_from_paths(smollm2_folder(), args.draft, args.dtype) if args.draft else load_pair(args.pair, args.dtype)
    tasks = {"copy-heavy": COPY_TASKS, "every": TASKS, None: None}.get(args.task, (args.task,))
    prompts, ids = live_protocol.first_prompts(pair, args.split, args.per_language, tasks)
    copy = CopyDraft() if args.copy else None
    extra = {name: load_draft_for(pair.target, folder, pair.tokenizer, args.dtype) for name, folder in args.also_draft}
    drafts = {"": pair.draft} | {f" [{name}]": draft for name, draft in extra.items()}
    """Every draft of the run by the suffix its configurations carry ("" for the pair's own)."""
    hf_drafts = {suffix: draft for suffix, draft in drafts.items() if isinstance(draft, PreTrainedModel)}
    if args.transformers and not hf_drafts:
        print(f"transformers' assisted generation needs a transformers draft; {type(pair.draft).__name__} is not: skipped")
    report = {
        "pair": pair.name,
        "hardware": hardware_description(pair.target.device),
        "dtype": str(pair.target.dtype),
        "new_tokens": args.new_tokens,
        "split": args.split,
        "per_language": args.per_language,
        "repeats": args.repeats,
        "draft": type(pair.draft).__name__,
        "also_drafts": {name: f"{type(draft).__name__} from {folder}" for (name, folder), draft in zip(args.also_draft, extra.values())},
        "task": args.task or "all",
        "copy": args.copy,
        "trees": [f"{shape.branching},{shape.width},{shape.size}" for shape in args.tree],
        "runs": {},
    }
    identity = live_protocol.identity(pair, drafts, args.policies)
    for temperature in args.temperatures:
        sampling = SamplingConfig(temperature)
        decoders = {
            f"{spec}{suffix}": (
                lambda spec=spec, draft=draft, sampling=sampling: SpeculativeDecoder(
                    pair.target, draft, make_policy(spec), sampling, tokenizer=pair.tokenizer, copy=copy
                )
            )
            for suffix, draft in drafts.items()
            for spec in args.policies
        }
        decoders.update(
            {
                f"{spec}, tree {shape.branching},{shape.width},{shape.size}{suffix}": (
                    lambda spec=spec, draft=draft, shape=shape, sampling=sampling: TreeDecoder(
                        pair.target, draft, make_policy(spec), shape, sampling, tokenizer=pair.tokenizer
                    )
                )
                for shape in args.tree
                for suffix, draft in drafts.items()
                for spec in args.policies
            }
        )
        if args.copy:
            decoders[PROMPT_LOOKUP] = lambda sampling=sampling: SpeculativeDecoder(
                pair.target, PromptLookupDraft(), StaticDepth(10), sampling, tokenizer=pair.tokenizer
            )
        if args.generate_route:
            decoders.update({f"generate() + {spec}": (lambda spec=spec, sampling=sampling: GenerateRoute(pair, spec, sampling)) for spec in args.policies})
        if args.transformers:
            decoders.update(
                {
                    f"{name}{suffix}": (lambda draft=draft, mode=mode, sampling=sampling: Assisted(pair, draft, mode, sampling))
                    for suffix, draft in hf_drafts.items()
                    for name, mode in HF_MODES.items()
                }
            )
        live = live_protocol.measure(
            pair.target,
            prompts,
            ids,
            decoders,
            args.new_tokens,
            args.repeats,
            sampling.describe(),
            sampling,
            args.seed,
            checkpoint=partial_path(args.out, sampling),
            identity=identity,
        )
        if sampling.is_greedy:
            for name, rows in live.items():
                for row, plain, prompt_ids in zip(rows, live[live_protocol.PLAIN], ids, strict=True):
                    divergence = first_divergence(pair.target, prompt_ids, plain["token_ids"], row["token_ids"]) if name != live_protocol.PLAIN else None
                    row["near_tie"] = None if divergence is None else divergence.near_tie
        report["runs"][sampling.describe()] = live
    return report


def partial_path(out: Path, sampling: SamplingConfig) -> Path:
    """Where the run with ``sampling`` keeps each finished prompt until the report is written (commit it to carry
    a long run into another session on the same kind of machine; a rerun resumes from it)."""
    return out.with_name(f"{out.name}.{sampling.describe().replace(' ', '_')}.partial.jsonl")


def summarise(report: dict) -> str:
    lines = []
    for sampling, live in report["runs"].items():
        summary = live_protocol.summarise(live)
        greedy = sampling == "greedy"
        header = ["config", *(f"{lang} tok/s (x)" for lang in LANGUAGES), "all tok/s (x) [95 %]", "tau (all)", *(f"alpha {lang}" for lang in LANGUAGES)]
        table = []
        for config, rows in live.items():
            data = summary[config]
            cells = [config, *(f"{data[lang]['tokens_per_second']:.1f} ({data[lang]['speedup']:.2f}x)" for lang in LANGUAGES)]
            d = data["all"]
            cells.append(
                f"{d['tokens_per_second']:.1f} ({d['speedup']:.2f}x) [{d['low']:.2f}, {d['high']:.2f}]"
                + (" n.s." if d["verdict"] == "not significant" and config != live_protocol.PLAIN else "")
            )
            cells.append(f"{d['tau']:.2f}" if sum(r["rounds"] for r in rows) and config != live_protocol.PLAIN else "-")
            for lang in LANGUAGES:
                mine = [r for r in rows if r["lang"] == lang]
                seen = sum(r["accepted"] + r["rejections"] for r in mine)
                cells.append(f"{sum(r['accepted'] for r in mine) / seen:.2f}" if seen else "-")
            if greedy:
                cells.append("yes" if d["identical"] else "NO")
            table.append(cells)
        lines.append(
            f"**{sampling}**, {report['per_language']} {report['split']} prompts per language (tasks: {report.get('task', 'all')}), "
            f"{report['new_tokens']} new tokens{', a copy drafter beside the draft' if report.get('copy') else ''}, "
            f"each configuration {report['repeats']}x per prompt in rotating order (medians); speedup over plain in parentheses\n"
        )
        lines.append(format_table(header + (["= plain"] if greedy else []), table))
        lines.append("")
        lines += learned_against_static(live, summary)
        diverged = [r for rows in live.values() for r in rows if r.get("near_tie") is not None]
        if greedy and diverged:
            runs = sum(len(rows) for name, rows in live.items() if name != live_protocol.PLAIN)
            lines.append(
                f"Greedy outputs diverging from plain greedy: {len(diverged)} of {runs} runs; at a near-tie: "
                f"{sum(r['near_tie'] for r in diverged)} (adaptive.divergence: the target's gap between the two tokens within 4 ulps "
                "under both a 1-token and a k-token forward).\n"
            )
    hw = report["hardware"]
    lines.append(
        f"Hardware: {hw['processor']}, {hw['torch_threads']} torch threads, torch {hw['torch']}; pair {report['pair']}, "
        f"draft {report['draft']}, {report['dtype']}." + "".join(f" [{name}]: {what}." for name, what in report.get("also_drafts", {}).items())
    )
    return "\n".join(lines)


def learned_against_static(live: dict[str, list[dict]], summary: dict) -> list[str]:
    """Each learned policy (a config naming a policy folder) against every static depth of the run, paired over
    prompts, the best static depth (highest rate over all languages) first; no lines without both."""
    statics = sorted((name for name in live if name.startswith("static:") and name.count(":") == 1), key=lambda n: -summary[n]["all"]["tokens_per_second"])
    learned = [name for name in live if "/" in name]
    lines = []
    for name in learned if statics else []:
        parts = []
        for static in statics:
            c = live_protocol.compare(live, name, static)
            parts.append(f"`{static}`{' (best static)' if static == statics[0] else ''} {c['ratio']:.3f}x [{c['low']:.3f}, {c['high']:.3f}] ({c['verdict']})")
        lines.append(f"`{name}` against each static depth, paired over prompts [95 %]: " + "; ".join(parts) + ".\n")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="smollm2-135m")
    parser.add_argument("--split", default="test")
    parser.add_argument("--dtype", default="auto", help="auto (default: bfloat16 where the CPU multiplies it natively), float32 or bfloat16")
    parser.add_argument("--draft", help="a draft folder for the pair's target (e.g. an EAGLE-3 head) instead of the pair's draft")
    parser.add_argument(
        "--also-draft",
        action="append",
        default=[],
        type=lambda s: tuple(s.split("=", 1)) if "=" in s else parser.error(f"--also-draft takes NAME=DIR, got {s!r}"),
        metavar="NAME=DIR",
        help="every policy also with this draft folder, in the same run (repeatable)",
    )
    parser.add_argument("--per-language", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration per prompt, rotating order; medians")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.7])
    parser.add_argument("--policies", type=lambda s: s.split(","), default=POLICIES, help="policy specs or learned policy paths, comma-separated")
    parser.add_argument("--no-transformers", dest="transformers", action="store_false")
    parser.add_argument(
        "--generate-route",
        action="store_true",
        help="also each policy through transformers' generate(custom_generate=adaptive.integrations.transformers.generate)",
    )
    parser.add_argument(
        "--task",
        choices=[*TASKS, "copy-heavy", "every"],
        help="only this task type (copy-heavy: the four whose answers copy the prompt; every: all eight by turns, 8 prompts per language cover each once)",
    )
    parser.add_argument(
        "--tree",
        type=tree_shape,
        action="append",
        default=[],
        metavar="K,W,V",
        help="every policy also with draft trees of this shape (branching, width, verified nodes; repeatable); not with --copy",
    )
    parser.add_argument("--copy", action="store_true", help="a copy drafter beside the draft (for source-aware policies) and transformers' prompt lookup")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pair_speedup"))
    args = parser.parse_args()
    if args.tree and args.copy:
        parser.error("--tree drafts with the model only; it cannot be combined with --copy")
    report = run(args)
    table = summarise(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    kept = {
        **report,
        "runs": {sampling: {name: [live_protocol.kept_row(r) for r in rows] for name, rows in live.items()} for sampling, live in report["runs"].items()},
    }
    args.out.with_name(args.out.name + ".json").write_text(json.dumps(kept))  # one line, under 1 MB; not with_suffix: OUT may hold a dot (pair_speedup_t0.7)
    args.out.with_name(args.out.name + ".md").write_text(table + "\n")
    for temperature in args.temperatures:
        partial_path(args.out, SamplingConfig(temperature)).unlink()
    print(table)


if __name__ == "__main__":
    main()
