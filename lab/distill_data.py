"""Self-distillation data: the target's own responses to the draft-training prompt pool, in shards.

Generation is the expensive part of building a draft (hours on a 2-core CPU), so it is sharded and
resumable: every ``shard_size`` prompts are written to their own JSONL file (``greedy-00012.jsonl`` or
``t0.7-00012.jsonl``), and a rerun skips every prompt id already present in a complete shard. Prompts are
shuffled once with a fixed seed (languages and tasks mixed in every shard), then sorted by length inside a
shard so that batches carry little padding. The target's hidden states are not stored here: training
recomputes them with one teacher-forced forward per sequence, the same multi-token forward that
verification runs at decoding time.

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

from adaptive.models import smollm2_folder
from adaptive.workload import chat_ids

log = logging.getLogger(__name__)

POOL = Path(__file__).resolve().parents[1] / "data" / "workload" / "draft-prompts.jsonl"
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


def generate_batch(model, tokenizer, encoded: list[list[int]], max_new_tokens: int, temperature: float) -> list[list[int]]:
    """Responses (ids, ending with EOS when the model stopped) for a left-padded batch of prompts."""
    eos = tokenizer.eos_token_id
    width = max(map(len, encoded))
    ids = torch.tensor([[eos] * (width - len(e)) + e for e in encoded])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {"do_sample": False}
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=eos, **sampling)
    responses = []
    for row in out[:, width:].tolist():
        responses.append(row[: row.index(eos) + 1] if eos in row else row)
    return responses


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
    tokenizer = AutoTokenizer.from_pretrained(smollm2_folder())
    model = AutoModelForCausalLM.from_pretrained(smollm2_folder(), dtype=dtype).eval()
    first_shard = len(list(folder.glob(f"{prefix}-*.jsonl")))
    bar = tqdm(total=len(todo), desc=f"{prefix} responses", unit="prompt")
    for index, start in enumerate(range(0, len(todo), shard_size)):
        shard = sorted(todo[start : start + shard_size], key=lambda p: len(p["prompt"]))
        encoded = [chat_ids(tokenizer, p["prompt"]) for p in shard]
        path = folder / f"{prefix}-{first_shard + index:05d}.jsonl"
        partial = path.with_suffix(".partial")
        began, tokens = time.perf_counter(), 0
        with partial.open("w") as out:
            for b in range(0, len(shard), batch_size):
                torch.manual_seed(seed * 1_000_003 + first_shard + index * 1000 + b)
                responses = generate_batch(model, tokenizer, encoded[b : b + batch_size], max_new_tokens, temperature)
                for prompt, ids, response in zip(shard[b : b + batch_size], encoded[b : b + batch_size], responses):
                    out.write(json.dumps({"id": prompt["id"], "lang": prompt["lang"], "task": prompt["task"], "prompt_ids": ids, "response": response}) + "\n")
                    tokens += len(response)
                bar.update(len(responses))
        partial.replace(path)
        log.info("%s: %d prompts, %d response tokens, %.0f tok/s", path.name, len(shard), tokens, tokens / (time.perf_counter() - began))
