"""Where a draft misses the target's greedy token, per language: on positions a copy could predict, and on
positions the target is sure of.

Teacher-forced, as the training measures it: the first draft step at every response position of the
workload split's greedy outputs (the traces' fp32 outputs; the target's states from one bf16 forward), the
earlier tokens given right. A position is *copyable* when the three tokens ending where the draft stands
occurred earlier in the prompt or the output, followed by the token to predict (what a suffix-matching copy
drafter proposes, most of the time); the target is *sure* when its probability of that token is ≥ 0.9. A
draft missing many sure or copyable tokens is short of capacity or data, not facing noise. Copy-heavy
prompts come from the ``-copy`` traces, which hold them.

With ``--chat``, the hand-written general-chat test requests (``data/workload/chat-test-prompts.jsonl``, never
trained on) are measured too, on the target's greedy answers made here (bf16, 128 new tokens, lean engine), with
the draft vocabulary's coverage of the tokens the target writes (a token outside it can never be drafted).

Run: .venv/bin/python benchmarks/draft_misses.py --draft data/distill/drafts/eagle3 [--kind eagle3|standalone]
     [--split val] [--per-language 16] [--chat]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from adaptive.lean import LeanLlama
from adaptive.pair import load_target
from adaptive.traces import TraceSet
from adaptive.workload import COPY_TASKS, LANGUAGES, chat_ids, load_prompts
from lab.batched_sampling import continue_many
from lab.distill import StandaloneKind
from lab.distill_data import CHAT_TEST
from lab.distill_eagle3 import Eagle3Kind
from lab.draft_training import Sequence, TargetFeatures, workload_sequences
from lab.recording import TRACES
from lab.report import format_table

SURE = 0.9
CONTEXT = 3


def copyable(tokens: list[int], at: int) -> bool:
    """Whether the ``CONTEXT`` tokens ending at ``at`` occurred earlier followed by ``tokens[at + 1]``."""
    suffix = tokens[at - CONTEXT + 1 : at + 1]
    return any(tokens[j - CONTEXT + 1 : j + 1] == suffix and tokens[j + 1] == tokens[at + 1] for j in range(CONTEXT - 1, at))


@torch.no_grad()
def misses(kind, draft, features: TargetFeatures, sequences: list[Sequence], pad: int) -> dict[str, dict[str, list[int]]]:
    """Per language, [hits, positions] overall, on copyable positions and on positions the target is sure of."""
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    vocab = kind.vocabulary(draft)
    head = features.target.get_output_embeddings().weight
    for start in range(0, len(sequences), 8):
        chunk = sequences[start : start + 8]
        batch = features.batch(chunk, 320, pad, full_argmax=True)
        _, predictions = kind.loss(draft, batch, predict=True)
        out = features.target.model(input_ids=batch.tokens, attention_mask=batch.attention)
        sure = torch.softmax((out.last_hidden_state @ head.T).float(), dim=-1).amax(dim=-1) >= SURE
        lead = kind.lead
        for row, sequence in enumerate(chunk):
            tokens = batch.tokens[row].tolist()
            for t in batch.mask[row].nonzero()[:, 0].tolist():
                if t + lead >= len(tokens) or not batch.mask[row, t + lead]:
                    continue
                truth = int(batch.target_argmax[row, t + lead])
                hit = int(vocab[predictions[0][row, t]]) == truth
                groups = ["all"]
                if t + lead + 1 < len(tokens) and tokens[t + lead + 1] == truth and copyable(tokens, t + lead):
                    groups.append("copyable")
                if sure[row, t + lead]:
                    groups.append("sure")
                for group in groups:
                    counts[sequence.lang][group][0] += hit
                    counts[sequence.lang][group][1] += 1
    return counts


def chat_sequences(target, tokenizer, new_tokens: int = 128) -> list[Sequence]:
    """The held-out chat requests with the target's greedy answers to them."""
    rows = [json.loads(line) for line in CHAT_TEST.read_text().splitlines()]
    prompts = [chat_ids(tokenizer, row["prompt"]) for row in rows]
    answers = dict((i, out) for i, out, _ in continue_many(LeanLlama(target, "model"), prompts, max_new_tokens=new_tokens, eos=tokenizer.eos_token_id))
    return [Sequence(f"chat:{row['id']}", row["lang"], prompts[i], answers[i], "chat", i) for i, row in enumerate(rows)]


def coverage(sequences: list[Sequence], vocab: torch.Tensor) -> dict[str, list[int]]:
    """Per language, [response tokens inside the draft vocabulary, response tokens]."""
    inside = set(vocab.tolist())
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for sequence in sequences:
        counts[sequence.lang][0] += sum(token in inside for token in sequence.response)
        counts[sequence.lang][1] += len(sequence.response)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", type=Path, required=True, help="a draft folder made by adaptive distill")
    parser.add_argument("--kind", choices=["eagle3", "standalone"], default="eagle3")
    parser.add_argument("--split", choices=["val", "test"], default="val")
    parser.add_argument("--per-language", type=int, default=16)
    parser.add_argument("--chat", action="store_true", help="also the held-out general-chat requests, with vocabulary coverage")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/draft_misses.json"))
    args = parser.parse_args()
    target, tokenizer = load_target("smollm2-135m", "bfloat16")
    target.requires_grad_(False).eval()
    kind = Eagle3Kind() if args.kind == "eagle3" else StandaloneKind()
    draft = kind.load(args.draft, target).eval()
    features = TargetFeatures(target, None, kind.vocabulary(draft))
    rows = load_prompts(args.split)
    extra = {"chat": chat_sequences(target, tokenizer)} if args.chat else {}
    prompt_sets = {
        "general": (TRACES / f"smollm2-135m-{args.split}.npz", {p["id"]: p["prompt"] for p in rows}),
        "copy-heavy": (TRACES / f"smollm2-135m-{args.split}-copy.npz", {p["id"]: p["prompt"] for p in rows if p["task"] in COPY_TASKS}),
    }
    results, table, covered = {}, [], {}
    sets = {name: workload_sequences(TraceSet.load(path), prompts, tokenizer, args.per_language) for name, (path, prompts) in prompt_sets.items()}
    for name, sequences in {**sets, **extra}.items():
        covered[name] = coverage(sequences, kind.vocabulary(draft))
        counts = misses(kind, draft, features, sequences, tokenizer.eos_token_id)
        results[name] = counts
        for lang in LANGUAGES:
            inside, total = covered[name][lang]
            cells = [name, lang, f"{inside / max(1, total):.3f}"]
            for group in ("all", "copyable", "sure"):
                hits, total = counts[lang][group]
                share = total / max(1, counts[lang]["all"][1])
                cells.append(f"{hits / max(1, total):.3f}" + ("" if group == "all" else f" ({share:.0%})"))
            table.append(cells)
    print(
        f"Draft {args.draft} ({args.kind}), first step, teacher-forced, {args.split} split, first {args.per_language} prompts per language of each set"
        + (f", and the {len(extra['chat'])} held-out chat requests (greedy answers made here)" if extra else "")
    )
    print("accuracy (share of positions): copyable = the last 3 tokens seen earlier followed by the truth; sure = target p >= 0.9\n")
    print(format_table(["prompts", "lang", "vocabulary coverage", "accuracy", "copyable", "sure"], table))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"draft": str(args.draft), "kind": args.kind, "split": args.split, "counts": results, "coverage": covered}, indent=1))


if __name__ == "__main__":
    main()
