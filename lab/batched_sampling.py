"""Many sequences continued at once on the lean engine, for data generation (prompts, distillation responses).

transformers' ``generate`` spends most of a step on its own bookkeeping here: on the default target at bf16,
64 rows, 2 cores, it made ~190 tokens/s where :meth:`adaptive.lean.LeanLlama.batched` on the same weights makes
~480. Batching is continuous: a row leaves when it ends and new prompts join (prefilled on their own, then
left-padded to the batch's columns), so short answers never wait for long ones. Pads are masked out and
rotary positions count from each row's first real token, so every row is computed as if it ran alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from adaptive.lean import BatchedLayer, BatchedLeanCache, LeanLlama, compile_batched


def next_tokens(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen token of each row of ``logits [B, V]`` (arg-max at temperature 0, else a sample at ``temperature``,
    among the ``top_k`` likeliest tokens when ``top_k`` > 0) and its log-probability under the distribution it was
    drawn from."""
    logits = logits.float()
    if temperature == 0:
        chosen = logits.argmax(dim=-1)
        return chosen, torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None])[:, 0]
    if top_k > 0:
        values, indices = logits.topk(top_k, dim=-1)
        log_probs = torch.log_softmax(values / temperature, dim=-1)
        pick = torch.multinomial(log_probs.exp(), 1, generator=generator)
        return indices.gather(1, pick)[:, 0], log_probs.gather(1, pick)[:, 0]
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    chosen = torch.multinomial(log_probs.exp(), 1, generator=generator)[:, 0]
    return chosen, log_probs.gather(1, chosen[:, None])[:, 0]


@dataclass
class _Rows:
    """The rows in flight: which prompt each continues, its cache, real columns, next position and last logits."""

    index: torch.Tensor  # [B] prompt indices
    cache: list[BatchedLayer]
    real: torch.Tensor  # [B, C] which cache columns hold real tokens
    position: torch.Tensor  # [B] rotary position of the last token
    last: torch.Tensor  # [B, V] logits after it

    def keep(self, rows: torch.Tensor) -> None:
        self.index, self.real, self.position, self.last = self.index[rows], self.real[rows], self.position[rows], self.last[rows]
        for layer in self.cache:
            layer.keys, layer.values = layer.keys[rows], layer.values[rows]
        empty = int((~self.real.any(dim=0)).cumprod(dim=0).sum())  # leading columns no row uses any more
        if empty:
            self.real = self.real[:, empty:]
            for layer in self.cache:
                layer.keys, layer.values = layer.keys[:, :, empty:], layer.values[:, :, empty:]

    def join(self, other: _Rows) -> None:
        """Take ``other``'s rows in, left-padding whichever has fewer columns."""
        width = max(self.real.shape[1], other.real.shape[1])
        for rows in (self, other):
            short = width - rows.real.shape[1]
            if short:
                rows.real = torch.cat((rows.real.new_zeros(len(rows.real), short), rows.real), dim=1)
                for layer in rows.cache:
                    pad = layer.keys.new_zeros(*layer.keys.shape[:2], short, layer.keys.shape[3])
                    layer.keys, layer.values = torch.cat((pad, layer.keys), dim=2), torch.cat((pad, layer.values), dim=2)
        self.index, self.real = torch.cat((self.index, other.index)), torch.cat((self.real, other.real))
        self.position, self.last = torch.cat((self.position, other.position)), torch.cat((self.last, other.last))
        for mine, theirs in zip(self.cache, other.cache):
            mine.keys, mine.values = torch.cat((mine.keys, theirs.keys)), torch.cat((mine.values, theirs.values))


def _prefill(engine: LeanLlama, prompts: list[list[int]], index: list[int], pad: int) -> _Rows:
    width = max(map(len, prompts))
    pads = torch.tensor([width - len(p) for p in prompts])
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    columns = torch.arange(width)
    real = columns[None, :] >= pads[:, None]
    positions = (columns[None, :] - pads[:, None]).clamp(min=0)
    cache = BatchedLeanCache(engine.layers).layers
    logits, _ = engine.batched(ids, positions, cache, (columns[None, :] <= columns[:, None])[None] & real[:, None, :])
    return _Rows(torch.tensor(index), cache, real, positions[:, -1], logits[:, -1])


@torch.inference_mode()
def continue_many(
    engine: LeanLlama,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos: int,
    batch_size: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    between_steps: Callable[[], object] | None = None,
) -> Iterator[tuple[int, list[int], float]]:
    """Yield, as each finishes: a prompt's index, its continuation (ids, ending with ``eos`` when the model ended it)
    and the continuation's mean log-probability per token under the distribution it was drawn from. New prompts
    join (in order) whenever a quarter of the batch has left. ``between_steps`` is called before every forward
    (background work yields to live measurements there)."""
    compile_batched(engine)
    waiting = list(range(len(prompts)))[::-1]
    outputs: dict[int, list[int]] = {}
    scores: dict[int, float] = {}
    rows: _Rows | None = None
    while waiting or rows is not None:
        if between_steps is not None:
            between_steps()
        room = batch_size - (0 if rows is None else len(rows.index))
        if waiting and room >= max(1, batch_size // 4):
            joining = [waiting.pop() for _ in range(min(room, len(waiting)))]
            new = _prefill(engine, [prompts[i] for i in joining], joining, eos)
            for i in joining:
                outputs[i], scores[i] = [], 0.0
            if rows is None:
                rows = new
            else:
                rows.join(new)
        chosen, log_prob = next_tokens(rows.last, temperature, top_k, generator)
        for i, token, score in zip(rows.index.tolist(), chosen.tolist(), log_prob.tolist()):
            outputs[i].append(token)
            scores[i] += score
        done = (chosen == eos) | torch.tensor([len(outputs[i]) >= max_new_tokens for i in rows.index.tolist()])
        for i in rows.index[done].tolist():
            output = outputs.pop(i)
            yield i, output, scores.pop(i) / len(output)
        if done.all():
            rows = None
            continue
        if done.any():
            rows.keep(~done)
            chosen = chosen[~done]
        rows.position = rows.position + 1
        rows.real = torch.cat((rows.real, torch.ones(len(rows.index), 1, dtype=torch.bool)), dim=1)
        logits, _ = engine.batched(chosen[:, None], rows.position[:, None], rows.cache, rows.real[:, None, :])
        rows.last = logits[:, 0]
