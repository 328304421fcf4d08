"""Self-distillation data: the target's own responses to the draft-training prompt pool, in shards.

Generation is the expensive part of building a draft (hours on a 2-core CPU), so it is sharded and resumable: every
``shard_size`` prompts are written to their own JSONL file (``greedy-00012.jsonl`` or ``t0.7-00012.jsonl``), and a
rerun skips every prompt id already present in a complete shard. Prompts are shuffled once with a fixed seed
(languages and tasks mixed in every shard), then sorted by length inside a shard so that batches carry little
padding. Since 2026-12-06 responses are generated on the lean engine with continuous batching
(:mod:`lab.batched_sampling`, ~2.5x transformers' ``generate`` here), seeded per shard; the earlier shards came from
``generate`` (seeded per batch of 64), the same bf16 weights and the same sampling. The target's hidden states are
not stored here: training recomputes them with one teacher-forced forward per sequence, the same multi-token forward
that verification runs at decoding time.

Run in the background: ``nohup .venv/bin/adaptive distill-data --temperature 0 &`` (then ``--temperature 0.7``).
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from adaptive.lean import LeanLlama
from adaptive.models import smollm2_folder
from adaptive.workload import chat_ids
from lab.background import yield_to_measurements
from lab.batched_sampling import continue_many

log = logging.getLogger(__name__)

POOL = Path(__file__).resolve().parents[1] / "data" / "workload" / "draft-prompts.jsonl"
CHAT_POOL = POOL.with_name("draft-chat-prompts.jsonl")
"""General-chat user turns written by the target (``adaptive chat-prompts``), the pool's second part."""
CHAT_TEST = POOL.with_name("chat-test-prompts.jsonl")
"""Hand-written general-chat requests kept out of every pool: the draft's chat test."""
SHARDS = Path(__file__).resolve().parents[1] / "data" / "distill" / "smollm2-135m"
"""Committed shards (token ids only, ~0.55 MB per 512 prompts): hours of generation survive any one machine."""


def shard_prefix(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"t{temperature:g}"


def done_ids(folder: Path, prefix: str) -> set[str]:
    """Prompt ids in the complete shards of one kind (a shard is complete once renamed from .partial)."""
    ids: set[str] = set()
    for shard in sorted(folder.glob(f"{prefix}-*.jsonl")):
        ids.update(json.loads(line)["id"] for line in shard.read_text().splitlines())
    return ids


def load_target_for_generation(dtype: torch.dtype):
    """The default target (eager transformers, for batched ``generate``) and its tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder())
    return AutoModelForCausalLM.from_pretrained(smollm2_folder(), dtype=dtype).eval(), tokenizer


def generate_shards(
    prompts: list[dict], folder: Path, *, temperature: float, dtype: torch.dtype, batch_size: int, shard_size: int, max_new_tokens: int, seed: int
) -> None:
    """Write the target's responses to every prompt not yet done, shard by shard."""
    folder.mkdir(parents=True, exist_ok=True)
    prefix = shard_prefix(temperature)
    order = list(prompts)
    random.Random(seed).shuffle(order)
    done = done_ids(folder, prefix) & {p["id"] for p in prompts}
    todo = [p for p in order if p["id"] not in done]
    log.info("%d of %d prompts done; %d to go", len(done), len(order), len(todo))
    model, tokenizer = load_target_for_generation(dtype)
    engine = LeanLlama(model, "model")
    first_shard = len(list(folder.glob(f"{prefix}-*.jsonl")))
    bar = tqdm(total=len(todo), desc=f"{prefix} responses", unit="prompt")
    for index, start in enumerate(range(0, len(todo), shard_size)):
        shard = sorted(todo[start : start + shard_size], key=lambda p: len(p["prompt"]))
        encoded = [chat_ids(tokenizer, p["prompt"]) for p in shard]
        path = folder / f"{prefix}-{first_shard + index:05d}.jsonl"
        partial = path.with_suffix(".partial")
        began, tokens = time.perf_counter(), 0
        generator = torch.Generator().manual_seed(seed * 1_000_003 + first_shard + index)
        with partial.open("w") as out:
            results = continue_many(
                engine,
                encoded,
                max_new_tokens=max_new_tokens,
                eos=tokenizer.eos_token_id,
                batch_size=batch_size,
                temperature=temperature,
                generator=generator,
                between_steps=yield_to_measurements,
            )
            for i, response, _ in results:
                prompt = shard[i]
                out.write(
                    json.dumps({"id": prompt["id"], "lang": prompt["lang"], "task": prompt["task"], "prompt_ids": encoded[i], "response": response}) + "\n"
                )
                tokens += len(response)
                bar.update(1)
        partial.replace(path)
        log.info("%s: %d prompts, %d response tokens, %.0f tok/s", path.name, len(shard), tokens, tokens / (time.perf_counter() - began))
