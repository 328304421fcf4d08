"""Training a draft on the target's own responses: what every kind of draft shares.

Data: the shards :mod:`lab.distill_data` writes (prompt ids + the target's greedy and T = 0.7 responses to
the draft-training prompt pool, disjoint from every policy workload prompt). About 2 % of the prompts, by
a hash of their id, are held out to measure the draft (never trained on, never the policy's val split).

Each batch needs the target's three aux hidden states (for a head) and its distribution over the draft
vocabulary: from one teacher-forced target forward (the multi-token forward verification runs at decoding
time), or, once a sequence has been seen, from the feature cache on local disk (:mod:`lab.feature_cache`).
A :class:`DraftKind` (:mod:`lab.distill_eagle3`, :mod:`lab.distill`) builds the draft, computes its loss on
response positions and its predictions; this module runs the loop.

Resumable: ``out/checkpoint/`` holds the draft, the optimiser state (``torch.load`` with
``weights_only=True``) and ``state.json``; a rerun with the same ``out`` continues from it (shards added
since join the data). Every ``checkpoint_every`` steps the held-out accuracy per draft position is logged
to ``out/log.jsonl`` and the draft saved to ``out/`` with its ``state.json``. Those few files are small
enough to commit, so a run also continues on another machine (a fresh clone) from ``out/`` alone: the
draft and step are kept, the optimiser's moments are not (a few times the draft's size), so they start
afresh under a new warm-up of ``warmup_steps``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from adaptive.eagle3 import default_layer_ids
from adaptive.traces import TraceSet
from adaptive.workload import chat_ids, first_per_language
from lab.background import yield_to_measurements
from lab.draft_card import model_card
from lab.feature_cache import FeatureCache, cache_folder

log = logging.getLogger(__name__)


@dataclass
class TrainingConfig:
    """Settings of one draft-training run (the kind's own settings live in its :class:`DraftKind`)."""

    draft_vocab_size: int = 8192
    steps: int = 4000
    """Optimiser steps."""
    batch_size: int = 8
    """Sequences per step."""
    max_length: int = 320
    """Prompt + response tokens per sequence (longer ones are cut)."""
    learning_rate: float = 5e-4
    warmup_steps: int = 100
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


@dataclass
class Batch:
    """Right-padded ids ``[B, T]``, attention mask, the loss mask of positions whose next token is a response
    token, the target's aux states ``[B, T, 3H]`` (float32), its log-probabilities over the draft vocabulary
    ``[B, T, Vd]`` and, for measuring, its greedy token over its whole vocabulary ``[B, T]``."""

    tokens: torch.Tensor
    attention: torch.Tensor
    mask: torch.Tensor
    aux: torch.Tensor
    target_log: torch.Tensor
    target_argmax: torch.Tensor | None = None


class DraftKind(ABC):
    """What a kind of draft brings to training."""

    name: str
    steps_predicted: int
    """Draft positions :meth:`predictions` returns (an unrolled head: several; a chain draft measured
    teacher-forced: one)."""
    lead: int
    """How far ahead of its base position a draft's first step predicts, in target rows: a standalone draft
    at t predicts the token after t (the target's row t: 0); a head at t reads the target's state at t and
    the token after it, so it predicts the one after that (row t + 1: 1). Step k is judged at row t + k + lead."""

    @abstractmethod
    def build(self, target, vocab: torch.Tensor) -> nn.Module:
        """A new draft for ``target`` over the draft vocabulary ``vocab`` (target ids), trainable in float32."""

    @abstractmethod
    def load(self, folder: Path, target) -> nn.Module:
        """A saved draft, trainable in float32."""

    @abstractmethod
    def save(self, draft: nn.Module, folder: Path, metadata: dict) -> None:
        """Write the draft in its public layout."""

    @abstractmethod
    def describe(self, draft: nn.Module) -> str:
        """A paragraph for the model card: what the draft is."""

    @abstractmethod
    def vocabulary(self, draft: nn.Module) -> torch.Tensor:
        """The target ids of the draft vocabulary, in draft-id order."""

    @abstractmethod
    def loss(self, draft: nn.Module, batch: Batch, predict: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The training loss on response positions; with ``predict``, also per draft position k the draft's
        arg-max (draft ids) ``[B, T]`` for the token at t + k + 1 (none otherwise)."""


def read_shards(folder: Path) -> list[Sequence]:
    """Every complete shard's rows (``*.jsonl``; ``.partial`` shards are still being written)."""
    rows = []
    for shard in sorted(folder.glob("*.jsonl")):
        for index, line in enumerate(shard.read_text().splitlines()):
            row = json.loads(line)
            rows.append(Sequence(f"{shard.name.split('-')[0]}:{row['id']}", row["lang"], row["prompt_ids"], row["response"], shard.name, index))
    if not rows:
        raise ValueError(f"no response shards in {folder}; generate them with `adaptive distill-data`")
    return rows


def data_summary(train_set: list[Sequence], heldout: list[Sequence]) -> dict:
    """Sequences and response tokens per kind of shard (greedy, t0.7, ...) and language, for the model card."""
    sequences, tokens = Counter(), Counter()
    for s in train_set:
        key = (s.shard.split("-")[0], s.lang)
        sequences[key] += 1
        tokens[key] += len(s.response)
    rows = [{"shards": kind, "lang": lang, "sequences": sequences[kind, lang], "response_tokens": tokens[kind, lang]} for kind, lang in sorted(sequences)]
    return {"rows": rows, "heldout_sequences": len(heldout)}


def held_out(sequence_id: str, percent: int) -> bool:
    """True for the ``percent`` % of prompts (by a hash of the prompt id, both kinds of response alike) kept for measuring."""
    prompt = sequence_id.split(":", 1)[1]
    return int(hashlib.sha256(prompt.encode()).hexdigest(), 16) % 100 < percent


def workload_sequences(traces: TraceSet, prompts: dict[str, str], tokenizer, per_language: int) -> list[Sequence]:
    """The first ``per_language`` prompts of each language of a workload split's traces that are among
    ``prompts`` (id to text), as sequences to measure a draft on: the chat prompt's ids and the target's greedy
    output the traces hold."""
    chosen = [i for i, name in enumerate(traces.prompt_ids) if name in prompts]
    sequences = []
    for i in (chosen[j] for j in first_per_language([traces.langs[i] for i in chosen], per_language)):
        output = traces.outputs[traces.offsets[i] : traces.offsets[i + 1]].tolist()
        name = traces.prompt_ids[i]
        sequences.append(Sequence(f"workload:{name}", traces.langs[i], chat_ids(tokenizer, prompts[name]), output, "workload", i))
    return sequences


def draft_vocabulary(sequences: list[Sequence], size: int, always: list[int]) -> torch.Tensor:
    """The draft vocabulary, sorted: ``always``, then the most frequent response tokens, then (when the
    responses hold fewer distinct tokens) the most frequent prompt tokens, which responses often copy."""
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
    response token (the target's prediction there is what the draft learns)."""
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


CHUNK_ROWS = 512
"""Rows of logits the fused output layer and cross-entropy hold at once."""


class LinearSoftCrossEntropy(torch.autograd.Function):
    """Σ over rows of the soft cross-entropy logsumexp(z) − p·z of the logits z = h Wᵀ against a distribution
    p per row (Σ p = 1; float32), and (``predict``) the arg-max draft id of each row. The output layer and the loss run
    together, ``CHUNK_ROWS`` rows at a time, and the gradients (softmax(z) − p, back through W) are taken in
    the same pass: no ``[N, V]`` array is ever stored. Unfused, autograd stored several and a training step
    spent most of its time allocating and filling them."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, teacher: torch.Tensor, predict: bool) -> tuple[torch.Tensor, torch.Tensor]:
        autocast = torch.is_autocast_enabled("cpu") and hidden.dtype == torch.float32
        compute = torch.get_autocast_dtype("cpu") if autocast else hidden.dtype  # the matmuls' dtype, as autocast would pick
        h, w = hidden.to(compute), weight.to(compute)
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if grads else None
        grad_weight = torch.zeros(weight.shape, dtype=teacher.dtype, device=weight.device) if grads else None
        total = torch.zeros((), dtype=teacher.dtype, device=hidden.device)
        argmax = torch.empty(hidden.shape[0] if predict else 0, dtype=torch.long, device=hidden.device)
        for start in range(0, hidden.shape[0], CHUNK_ROWS):
            rows = slice(start, start + CHUNK_ROWS)
            z = (h[rows] @ w.T).to(teacher.dtype)
            lse = torch.logsumexp(z, dim=-1)
            total += lse.sum() - torch.dot(teacher[rows].flatten(), z.flatten())
            if predict:
                argmax[rows] = z.argmax(-1)
            if grads:
                gradient = z.sub_(lse[:, None]).exp_().sub_(teacher[rows]).to(compute)
                grad_hidden[rows] = gradient @ w
                grad_weight += (gradient.T @ h[rows]).to(teacher.dtype)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(argmax)
        return total, argmax

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _argmax) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad.to(grad_hidden.dtype), (grad_weight * grad).to(ctx.weight_dtype), None, None


def aux_layers(target) -> tuple[int, int, int]:
    """The target layers whose incoming hidden states a head reads (kept for every kind: one cache serves all)."""
    return default_layer_ids(target.config.num_hidden_layers)


class TargetFeatures:
    """The target's states of training batches: from the cache when it holds every sequence, else from the
    target (and then stored)."""

    def __init__(self, target, cache: FeatureCache | None, vocab: torch.Tensor) -> None:
        self.target, self.cache = target, cache
        self.layers = aux_layers(target)
        self.head = target.get_output_embeddings().weight
        self.rows = self.head[vocab.to(self.head.device)]

    def batch(self, sequences: list[Sequence], max_length: int, pad: int, full_argmax: bool = False) -> Batch:
        tokens, attention, mask = batch_tensors(sequences, max_length, pad)
        keys = [(s.shard, s.row) for s in sequences]
        if self.cache is not None and all(self.cache.has(*key) for key in keys):
            aux, final = self.cache.read(keys, tokens.shape[1])
        else:
            aux, final = target_states(self.target, tokens, attention, self.layers)
            if self.cache is not None:
                self.cache.write(keys, aux, final)
        argmax = (final @ self.head.T).argmax(dim=-1) if full_argmax else None
        return Batch(tokens, attention, mask, aux.float(), draft_log_probs(final, self.rows), argmax)


@torch.no_grad()
def heldout_accuracy(
    kind: DraftKind, draft: nn.Module, features: TargetFeatures, sequences: list[Sequence], config: TrainingConfig, vocab: torch.Tensor, pad: int
) -> dict:
    """Per draft position k: how often the draft's arg-max equals the target's greedy token (greedy acceptance
    of step k given the earlier steps right), per language; and, for drafts predicting several positions,
    τ at depth 4 (1 + mean accepted; over all positions predicted when fewer than 4)."""
    draft.eval()
    hits: dict[str, list[list[int]]] = {}
    bases = accepted = 0
    losses = []
    for start in range(0, len(sequences), config.batch_size):
        chunk = sequences[start : start + config.batch_size]
        batch = features.batch(chunk, config.max_length, pad, full_argmax=True)
        loss, predictions = kind.loss(draft, batch, predict=True)
        losses.append(float(loss))
        run = torch.ones_like(batch.mask)
        for step, predicted in enumerate(predictions):
            shift = step + kind.lead
            truth = torch.nn.functional.pad(batch.target_argmax[:, shift:], (0, shift), value=-1)
            valid = torch.nn.functional.pad(batch.mask[:, shift:], (0, shift), value=False) & batch.mask
            correct = (vocab[predicted] == truth) & valid
            for row, s in enumerate(chunk):
                lang_hits = hits.setdefault(s.lang, [[0, 0] for _ in predictions])
                lang_hits[step][0] += int(correct[row].sum())
                lang_hits[step][1] += int(valid[row].sum())
            run = run & (correct | ~valid)
            if step < 4:
                accepted += int((run & valid).sum())
        bases += int(batch.mask.sum())
    draft.train()
    steps = kind.steps_predicted
    per_lang = {lang: [h / max(1, n) for h, n in counts] for lang, counts in hits.items()}
    overall = [sum(hits[lang][k][0] for lang in hits) / max(1, sum(hits[lang][k][1] for lang in hits)) for k in range(steps)]
    return {
        "heldout_loss": sum(losses) / max(1, len(losses)),
        "accuracy": overall,
        "per_language": per_lang,
        "tau_depth4": 1 + accepted / max(1, bases) if steps > 1 else None,
    }


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


def _schedule(step: int, config: TrainingConfig, rewarm_from: int | None = None) -> float:
    """Linear warm-up, then cosine decay to 0 at ``config.steps``; ``rewarm_from``: the step where a fresh
    optimiser took over (its moments start at zero: warm up again from there)."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    if rewarm_from is not None and step < rewarm_from + config.warmup_steps:
        return cosine * (step - rewarm_from + 1) / config.warmup_steps
    return cosine


def train_draft(
    kind: DraftKind,
    target,
    tokenizer,
    data: Path,
    out: Path,
    config: TrainingConfig,
    features: Path | None = None,
    write_features: bool = True,
    also_measure: dict[str, list[Sequence]] | None = None,
) -> dict:
    """Train (or continue training) a draft of ``kind`` into ``out``; returns the last held-out measurement.
    ``features``: a root folder for the target's features on local disk (:mod:`lab.feature_cache`), None to
    recompute them; ``write_features`` False: only read what another training fills there; ``also_measure``:
    more sequences to measure at each checkpoint, by name (e.g. the workload's val split), logged under it."""
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "checkpoint"
    sequences = read_shards(data)
    heldout = [s for s in sequences if held_out(s.id, config.heldout_percent)][: config.heldout_sequences]
    train_set = [s for s in sequences if not held_out(s.id, config.heldout_percent)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    target.requires_grad_(False).eval()
    if (checkpoint / "state.json").is_file():
        state = json.loads((checkpoint / "state.json").read_text())
        draft = kind.load(checkpoint, target).train()
        log.info("resuming at step %d", state["step"])
    elif (out / "state.json").is_file():  # the run's committed files, e.g. from another machine
        state = json.loads((out / "state.json").read_text())
        state["fresh_optimiser_at"] = [*state.get("fresh_optimiser_at", []), state["step"]]
        draft = kind.load(out, target).train()
        log.info("resuming at step %d from the draft in %s (no optimiser state there: fresh moments, warm-up again)", state["step"], out)
    else:
        state = {"step": 0, "kind": kind.name, "config": asdict(config), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        torch.manual_seed(config.seed)
        draft = kind.build(target, draft_vocabulary(train_set, config.draft_vocab_size, list(tokenizer.all_special_ids))).train()
    vocab = kind.vocabulary(draft).cpu()
    cache = None
    if features is not None:
        folder = cache_folder(features, data, target.dtype, aux_layers(target), config.max_length)
        lengths: dict[str, list[int]] = {}
        for s in sequences:
            lengths.setdefault(s.shard, []).append(min(config.max_length, len(s.prompt) + len(s.response)))
        cache = FeatureCache(folder, data, lengths, (3 * target.config.hidden_size, target.config.hidden_size), target.dtype, write_features)
        log.info("feature cache %s: %.0f %% filled", folder, 100 * cache.filled_share())
    teacher = TargetFeatures(target, cache, vocab)
    uncached = TargetFeatures(target, None, vocab)

    def measure() -> dict:
        extra = {name: heldout_accuracy(kind, draft, uncached, seqs, config, vocab, pad) for name, seqs in (also_measure or {}).items()}
        return {**heldout_accuracy(kind, draft, teacher, heldout, config, vocab, pad), **extra}

    optimiser = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=config.learning_rate, weight_decay=0.0)
    if (checkpoint / "optimiser.pt").is_file():
        optimiser.load_state_dict(torch.load(checkpoint / "optimiser.pt", weights_only=True))
    for group in optimiser.param_groups:  # a resumed schedule starts from the peak rate
        group.setdefault("initial_lr", config.learning_rate)
    rewarm_from = (state.get("fresh_optimiser_at") or [None])[-1]
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: _schedule(s, config, rewarm_from), last_epoch=state["step"] - 1)
    rng = random.Random(config.seed)
    order: list[int] = []
    for _ in range(state["step"] * config.batch_size // max(1, len(train_set)) + 1):  # replay the data order up to here
        order += _epoch(train_set, rng, config.batch_size)
    cursor = state["step"] * config.batch_size
    measured: dict = {}
    data = data_summary(train_set, heldout)
    if state["step"] == 0:  # the untrained draft, for comparison
        _log(out, {"step": 0, **measure(), "train_sequences": len(train_set)})
    with tqdm(total=config.steps, initial=state["step"], desc=f"{kind.name} draft", unit="step") as bar:
        while state["step"] < config.steps:
            yield_to_measurements()
            while cursor + config.batch_size > len(order):
                order += _epoch(train_set, rng, config.batch_size)
            batch = teacher.batch([train_set[i] for i in order[cursor : cursor + config.batch_size]], config.max_length, pad)
            cursor += config.batch_size
            loss, _ = kind.loss(draft, batch)
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            optimiser.step()
            scheduler.step()
            state["step"] += 1
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}")
            if state["step"] % config.checkpoint_every == 0 or state["step"] == config.steps:
                measured = measure()
                _log(out, {"step": state["step"], "loss": loss.item(), "lr": scheduler.get_last_lr()[0], **measured, "train_sequences": len(train_set)})
                if cache is not None:
                    cache.flush()
                _checkpoint(kind, draft, optimiser, state, checkpoint)
                kind.save(draft, out, {"step": state["step"], "train_sequences": len(train_set), "heldout_accuracy": measured["accuracy"]})
                (out / "state.json").write_text(json.dumps(state))
                _write_card(kind, draft, out, config, state, data)
                log.info(
                    "step %d: loss %.3f, held-out accuracy per position %s, tau@4 %s",
                    state["step"],
                    loss.item(),
                    [round(a, 3) for a in measured["accuracy"]],
                    measured["tau_depth4"],
                )
    return measured


def _write_card(kind: DraftKind, draft: nn.Module, out: Path, config: TrainingConfig, state: dict, data: dict) -> None:
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    command = f"adaptive distill --kind {kind.name} --out {out} --steps {config.steps}"
    (out / "README.md").write_text(model_card(f"{kind.name} draft ({out.name})", kind.describe(draft), command, asdict(config), state, log, data))


def _log(out: Path, entry: dict) -> None:
    with (out / "log.jsonl").open("a") as handle:
        handle.write(json.dumps({**entry, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")


def _checkpoint(kind: DraftKind, draft: nn.Module, optimiser, state: dict, folder: Path) -> None:
    """Draft, optimiser and step, written to a fresh folder and swapped in (a kill leaves the previous one)."""
    staging = folder.with_name(folder.name + ".partial")
    kind.save(draft, staging, {})
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
