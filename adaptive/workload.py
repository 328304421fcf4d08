"""The multilingual prompt workload shipped in ``data/workload/prompts.jsonl`` (built by
``scripts/build_workload.py``): Italian, English, Chinese and Spanish prompts of eight task types — four
general ones and four copy-heavy ones (:data:`COPY_TASKS`, whose answers copy spans of the prompt) — split
train / val / test. The test split is for final evaluation only."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from adaptive.shipped import shipped_root

WORKLOAD = shipped_root() / "data" / "workload" / "prompts.jsonl"
LANGUAGES = ("it", "en", "zh", "es")
SPLITS = ("train", "val", "test")
COPY_TASKS = ("fix", "comment", "passage", "keep-names")
"""Fix the typos in a passage; comment code; answer from a passage; translate keeping commands and names."""
TASKS = ("question", "continuation", "code", "translation", *COPY_TASKS)


def load_prompts(split: str, lang: str | None = None, task: str | None = None, path: Path = WORKLOAD) -> list[dict]:
    """Prompts of one split, optionally filtered by language and task, in file order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if lang is not None and lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    if task is not None and task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; build it with `python scripts/build_workload.py`")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [r for r in rows if r["split"] == split and lang in (None, r["lang"]) and task in (None, r["task"])]


def interleave_tasks(prompts: list[dict], order: Sequence[str] | None = None) -> list[dict]:
    """``prompts`` reordered so that each language's task types take turns (its first prompt of each task,
    then its second of each, ...): the first N per language then cover every task type. Within a turn the
    tasks come in ``order`` (default: where each first appears in ``prompts``)."""
    rank: Counter[tuple[str, str]] = Counter()
    keyed = []
    for index, prompt in enumerate(prompts):
        task = prompt["task"]
        keyed.append((rank[(prompt["lang"], task)], order.index(task) if order else 0, index, prompt))
        rank[(prompt["lang"], task)] += 1
    return [prompt for *_, prompt in sorted(keyed, key=lambda item: item[:3])]


def first_per_language(langs: list[str], per_language: int) -> list[int]:
    """Indices of the first ``per_language`` items of each language, in their original order."""
    seen: Counter[str] = Counter()
    kept = []
    for index, lang in enumerate(langs):
        seen[lang] += 1
        if seen[lang] <= per_language:
            kept.append(index)
    return kept


def chat_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a one-turn chat request, ready for the assistant's answer."""
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(encoded["input_ids"])
