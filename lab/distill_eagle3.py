"""Training an EAGLE-3 draft head on the target's own responses (``adaptive distill --kind eagle3``).

Data: the shards :mod:`lab.distill_data` writes (prompt ids + the target's greedy and T = 0.7 responses to
the draft-training prompt pool, disjoint from every policy workload prompt). About 2 % of the prompts, by
a hash of their id, are held out to measure the head (never trained on, never the policy's val split).

Each batch needs the target's three aux hidden states and its distribution: from one teacher-forced target
forward (the multi-token forward verification runs at decoding time), or, once a sequence has been seen,
from the feature cache on local disk (:mod:`lab.feature_cache`). Then the head's training-time test:
``ttt_steps`` unrolled draft steps at every position (:meth:`~adaptive.eagle3.Eagle3Head.unrolled`), loss
Σ_k decay^k · CE(target distribution over the draft vocabulary, renormalised; head), on response tokens.
The draft vocabulary is the ``draft_vocab_size`` most frequent target tokens of the training responses.

Resumable: ``out/checkpoint/`` holds the head (safetensors), the optimiser state (``torch.load`` with
``weights_only=True``) and ``state.json``; a rerun with the same ``out`` continues from it. Every
``checkpoint_every`` steps the held-out accuracy per draft position is logged to ``out/log.jsonl`` and the
head saved to ``out/`` in the public EAGLE-3 layout.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from adaptive.eagle3 import Eagle3Config, Eagle3Head, load_head, save_head
from adaptive.precision import bf16_matmuls
from lab.feature_cache import FeatureCache, cache_folder

log = logging.getLogger(__name__)


@dataclass
class HeadTrainingConfig:
    """Settings of one head-training run."""

    draft_vocab_size: int = 8192
    steps: int = 4000
    """Optimiser steps."""
    batch_size: int = 8
    """Sequences per step."""
    max_length: int = 320
    """Prompt + response tokens per sequence (longer ones are cut)."""
    learning_rate: float = 5e-4
    warmup_steps: int = 100
    ttt_steps: int = 7
    """Draft steps unrolled in training (training-time test)."""
    decay: float = 0.8
    """Loss weight of step k: decay^k."""
    checkpoint_every: int = 200
    heldout_percent: int = 2
    heldout_sequences: int = 64
    """Held-out sequences measured at each checkpoint."""
    seed: int = 0


@dataclass(frozen=True)
class Sequence:
    """One training example: the chat prompt's ids and the target's response ids."""

    id: str
    lang: str
    prompt: list[int]
    response: list[int]
    shard: str
    """The shard file it came from, and its row there (its place in the feature cache)."""
    row: int


def read_shards(folder: Path) -> list[Sequence]:
    """Every complete shard's rows (``*.jsonl``; ``.partial`` shards are still being written)."""
    rows = []
    for shard in sorted(folder.glob("*.jsonl")):
        for index, line in enumerate(shard.read_text().splitlines()):
            row = json.loads(line)
            rows.append(Sequence(f"{shard.name.split('-')[0]}:{row['id']}", row["lang"], row["prompt_ids"], row["response"], shard.name, index))
    if not rows:
        raise ValueError(f"no response shards in {folder}; generate them with `python -m lab.distill_data`")
    return rows


def held_out(sequence_id: str, percent: int) -> bool:
    """True for the ``percent`` % of prompts (by a hash of the prompt id, both kinds of response alike) kept for measuring."""
    prompt = sequence_id.split(":", 1)[1]
    return int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % 100 < percent


def draft_vocabulary(sequences: list[Sequence], size: int, always: list[int]) -> torch.Tensor:
    """The head's draft vocabulary, sorted: ``always``, then the most frequent response tokens, then (when
    the responses hold fewer distinct tokens) the most frequent prompt tokens, which responses often copy."""
    chosen = dict.fromkeys(always)
    for counts in (Counter(t for s in sequences for t in s.response), Counter(t for s in sequences for t in s.prompt)):
        for token, _ in counts.most_common():
            if len(chosen) >= size:
                break
            chosen.setdefault(token)
    if len(chosen) < size:
        raise ValueError(f"the data holds only {len(chosen)} distinct tokens, fewer than draft_vocab_size={size}")
    return torch.tensor(sorted(chosen))


def batch_tensors(batch: list[Sequence], max_length: int, pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids ``[B, T]``, attention mask, and the loss mask of positions whose next token is a
    response token (the target's prediction there is what the head learns)."""
    ids = [(s.prompt + s.response)[:max_length] for s in batch]
    width = max(map(len, ids))
    tokens = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
    attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    predicts_response = torch.zeros_like(attention, dtype=torch.bool)
    for row, (s, x) in enumerate(zip(batch, ids)):
        predicts_response[row, len(s.prompt) - 1 : len(x) - 1] = True
    return tokens, attention, predicts_response


@torch.no_grad()
def target_states(target, tokens: torch.Tensor, attention: torch.Tensor, layer_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's aux states ``[B, T, 3H]`` and final (normed) states ``[B, T, H]``, in its dtype, from one
    teacher-forced forward (the multi-token forward verification runs at decoding time)."""
    out = target.model(input_ids=tokens, attention_mask=attention, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layer_ids], dim=-1), out.last_hidden_state


@torch.no_grad()
def draft_log_probs(final: torch.Tensor, output_rows: torch.Tensor) -> torch.Tensor:
    """The target's log-probabilities over the draft vocabulary ``[B, T, Vd]`` (``output_rows``: the target's
    output-layer rows of the draft vocabulary, renormalised over them)."""
    return torch.log_softmax((final @ output_rows.T).float(), dim=-1)


@torch.no_grad()
def target_features(
    target, tokens: torch.Tensor, attention: torch.Tensor, layer_ids, vocab_rows: torch.Tensor, full_argmax: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(aux states ``[B, T, 3H]`` in float32, log-probabilities over the draft vocabulary ``[B, T, Vd]``, and
    with ``full_argmax`` the target's greedy token over its whole vocabulary ``[B, T]``)."""
    aux, final = target_states(target, tokens, attention, layer_ids)
    head = target.get_output_embeddings().weight
    argmax = (final @ head.T).argmax(dim=-1) if full_argmax else None
    return aux.float(), draft_log_probs(final, head[vocab_rows]), argmax


def unrolled_loss(head: Eagle3Head, tokens, aux, target_log, mask, ttt_steps: int, decay: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Σ_k decay^k · soft cross-entropy at step k (base t learns the target's distribution at t + k + 1),
    averaged over response positions; also each step's arg-max draft ids ``[B, T]``."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=aux.device.type == "cpu" and bf16_matmuls()):
        outputs = head.unrolled(tokens, aux, ttt_steps)
        total, predictions = 0.0, []
        for step, states in enumerate(outputs):
            shift = step + 1
            valid = torch.nn.functional.pad(mask[:, shift:], (0, shift), value=False)
            logits = head.draft_logits(states[valid]).float()  # the output layer only where a loss is taken
            teacher = target_log[:, shift:][valid[:, : valid.shape[1] - shift]]
            ce = -(teacher.exp() * torch.log_softmax(logits, dim=-1)).sum(-1)
            total = total + decay**step * ce.sum() / max(1, int(valid.sum()))
            predicted = torch.zeros(valid.shape, dtype=torch.long, device=valid.device)
            predicted[valid] = logits.argmax(-1)
            predictions.append(predicted)
    return total, predictions


@torch.no_grad()
def heldout_accuracy(head: Eagle3Head, target, sequences: list[Sequence], config: HeadTrainingConfig, vocab: torch.Tensor, pad: int) -> dict:
    """Per draft position k: how often the head's arg-max equals the target's greedy token (greedy
    acceptance of step k given the earlier steps right), per language; and τ at depth 4 (1 + mean accepted)."""
    head.eval()
    hits: dict[str, list[list[int]]] = {}
    bases = accepted = 0
    losses = []
    for start in range(0, len(sequences), config.batch_size):
        batch = sequences[start : start + config.batch_size]
        tokens, attention, mask = batch_tensors(batch, config.max_length, pad)
        aux, target_log, argmax = target_features(target, tokens, attention, head.config.layer_ids, vocab, full_argmax=True)
        loss, predictions = unrolled_loss(head, tokens, aux, target_log, mask, config.ttt_steps, config.decay)
        losses.append(float(loss))
        run = torch.ones_like(mask)
        for step, predicted in enumerate(predictions):
            shift = step + 1
            truth = torch.nn.functional.pad(argmax[:, shift:], (0, shift), value=-1)
            valid = torch.nn.functional.pad(mask[:, shift:], (0, shift), value=False) & mask
            correct = (vocab[predicted] == truth) & valid
            for row, s in enumerate(batch):
                lang_hits = hits.setdefault(s.lang, [[0, 0] for _ in range(config.ttt_steps)])
                lang_hits[step][0] += int(correct[row].sum())
                lang_hits[step][1] += int(valid[row].sum())
            run = run & (correct | ~valid)
            if step < 4:
                accepted += int((run & valid).sum())
        bases += int(mask.sum())
    head.train()
    per_lang = {lang: [h / max(1, n) for h, n in steps] for lang, steps in hits.items()}
    overall = [sum(hits[lang][k][0] for lang in hits) / max(1, sum(hits[lang][k][1] for lang in hits)) for k in range(config.ttt_steps)]
    return {"heldout_loss": sum(losses) / max(1, len(losses)), "accuracy": overall, "per_language": per_lang, "tau_depth4": 1 + accepted / max(1, bases)}


def _epoch(train_set: list[Sequence], rng: random.Random, batch_size: int, pool: int = 64) -> list[int]:
    """One pass over the data in random order, sequences of similar length batched together (little padding):
    shuffle, sort each run of ``pool`` batches by length, then shuffle the batches."""
    order = list(range(len(train_set)))
    rng.shuffle(order)
    chunk = pool * batch_size
    batches = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: len(train_set[i].prompt) + len(train_set[i].response))
        batches += [part[b : b + batch_size] for b in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return [i for batch in batches for i in batch]


def _schedule(step: int, config: HeadTrainingConfig) -> float:
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train_head(target, tokenizer, data: Path, out: Path, config: HeadTrainingConfig, features: Path | None = None) -> dict:
    """Train (or continue training) a head into ``out``; returns the last held-out measurement. ``features``:
    a root folder for the target's features on local disk (:mod:`lab.feature_cache`), None to recompute them."""
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "checkpoint"
    sequences = read_shards(data)
    heldout = [s for s in sequences if held_out(s.id, config.heldout_percent)][: config.heldout_sequences]
    train_set = [s for s in sequences if not held_out(s.id, config.heldout_percent)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    target.requires_grad_(False).eval()
    if (checkpoint / "state.json").is_file():
        state = json.loads((checkpoint / "state.json").read_text())
        head = load_head(checkpoint, target, torch.float32).train()
        vocab = head.target_ids.cpu()
        log.info("resuming at step %d", state["step"])
    else:
        state = {"step": 0, "config": asdict(config), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        torch.manual_seed(config.seed)
        vocab = draft_vocabulary(train_set, config.draft_vocab_size, list(tokenizer.all_special_ids))
        head_config = Eagle3Config.for_target(target.config, config.draft_vocab_size)
        head = Eagle3Head(head_config, target.get_input_embeddings()).float().train()
        head.set_vocabulary(vocab)
    output_rows = target.get_output_embeddings().weight[vocab.to(target.device)]
    cache = None
    if features is not None:
        folder = cache_folder(features, data, target.dtype, head.config.layer_ids, config.max_length)
        lengths: dict[str, list[int]] = {}
        for s in sequences:
            lengths.setdefault(s.shard, []).append(min(config.max_length, len(s.prompt) + len(s.response)))
        cache = FeatureCache(folder, data, lengths, (3 * target.config.hidden_size, target.config.hidden_size), target.dtype)
        log.info("feature cache %s: %.0f %% filled", folder, 100 * cache.filled_share())
    optimiser = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=config.learning_rate, weight_decay=0.0)
    if (checkpoint / "optimiser.pt").is_file():
        optimiser.load_state_dict(torch.load(checkpoint / "optimiser.pt", weights_only=True))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: _schedule(s, config), last_epoch=state["step"] - 1)
    rng = random.Random(config.seed)
    order: list[int] = []
    for _ in range(state["step"] * config.batch_size // max(1, len(train_set)) + 1):  # replay the data order up to here
        order += _epoch(train_set, rng, config.batch_size)
    cursor = state["step"] * config.batch_size
    measured: dict = {}
    if state["step"] == 0:  # the untrained head, for comparison
        _log(out, {"step": 0, **heldout_accuracy(head, target, heldout, config, vocab, pad), "train_sequences": len(train_set)})
    with tqdm(total=config.steps, initial=state["step"], desc="eagle3 head", unit="step") as bar:
        while state["step"] < config.steps:
            while cursor + config.batch_size > len(order):
                order += _epoch(train_set, rng, config.batch_size)
            batch = [train_set[i] for i in order[cursor : cursor + config.batch_size]]
            cursor += config.batch_size
            tokens, attention, mask = batch_tensors(batch, config.max_length, pad)
            aux, final = _states(target, cache, batch, tokens, attention, head.config.layer_ids)
            loss, _ = unrolled_loss(head, tokens, aux.float(), draft_log_probs(final, output_rows), mask, config.ttt_steps, config.decay)
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            optimiser.step()
            scheduler.step()
            state["step"] += 1
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if state["step"] % config.checkpoint_every == 0 or state["step"] == config.steps:
                measured = heldout_accuracy(head, target, heldout, config, vocab, pad)
                _log(out, {"step": state["step"], "loss": loss.item(), "lr": scheduler.get_last_lr()[0], **measured, "train_sequences": len(train_set)})
                if cache is not None:
                    cache.flush()
                _checkpoint(head, optimiser, state, checkpoint)
                save_head(head, out, {"step": state["step"], "train_sequences": len(train_set), "heldout_accuracy": measured["accuracy"]})
                log.info("step %d: loss %.3f, held-out accuracy per position %s, tau@4 %.2f", state["step"], loss.item(),
                         [round(a, 3) for a in measured["accuracy"]], measured["tau_depth4"])
    return measured


def _states(target, cache: FeatureCache | None, batch: list[Sequence], tokens, attention, layer_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's aux and final states: from the cache when it holds every sequence, else from the target
    (and then stored)."""
    keys = [(s.shard, s.row) for s in batch]
    if cache is not None and all(cache.has(*key) for key in keys):
        return cache.read(keys, tokens.shape[1])
    aux, final = target_states(target, tokens, attention, layer_ids)
    if cache is not None:
        cache.write(keys, aux, final)
    return aux, final


def _log(out: Path, entry: dict) -> None:
    with (out / "log.jsonl").open("a") as handle:
        handle.write(json.dumps({**entry, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")


def _checkpoint(head: Eagle3Head, optimiser, state: dict, folder: Path) -> None:
    """Head, optimiser and step, written to a fresh folder and swapped in (a kill leaves the previous one)."""
    staging = folder.with_name(folder.name + ".partial")
    save_head(head, staging)
    torch.save(optimiser.state_dict(), staging / "optimiser.pt")
    (staging / "state.json").write_text(json.dumps(state))
    if folder.exists():
        old = folder.with_name(folder.name + ".old")
        folder.replace(old)
        staging.replace(folder)
        for path in old.iterdir():
            path.unlink()
        old.rmdir()
    else:
        staging.replace(folder)
