"""Record greedy traces (see :mod:`adaptive.traces`) of a model pair on a list of prompts.

Per prompt:

1. y: the target's greedy output (up to the budget or EOS), by the speculative decoder itself (its greedy
   output is the target's), or given (e.g. cached responses) and then checked: one teacher-forced target
   forward must reproduce every token of y; from the first disagreement on, y is regenerated.
2. One teacher-forced draft forward over prompt + y gives, at every position t, the draft's first
   token d(t) and its features.
3. The continuation after a matching first token is the next position's: if d(t) = y[t], the draft's
   K-step continuation at t is y[t] followed by the first K - 1 steps of the continuation at t + 1. Only
   positions where d(t) ≠ y[t] (and the last position) need drafting of their own; all of them are drafted
   together, K - 1 steps as one batch over the shared prompt + y cache, each row masked to its own prefix.
4. m(t) = 0 if d(t) ≠ y[t], else 1 + m(t + 1), capped at K and at the end of y.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from adaptive.cached_model import cache_keyword
from adaptive.decoder import SpeculativeDecoder
from adaptive.sampling import draft_features
from adaptive.traces import TraceSet


@torch.inference_mode()
def teacher_forced_greedy(target: PreTrainedModel, prompt: list[int], output: list[int]) -> int:
    """How many leading tokens of ``output`` the target's greedy decoding reproduces after ``prompt``."""
    if not output:
        return 0
    logits = target(input_ids=torch.tensor([prompt + output], device=target.device)).logits[0, len(prompt) - 1 : -1]
    agree = (logits.argmax(-1).cpu() == torch.tensor(output)).tolist() + [False]
    return agree.index(False)


def greedy_output(decoder: SpeculativeDecoder, prompt: list[int], max_new_tokens: int, given: list[int] | None = None) -> list[int]:
    """The target's greedy output; ``given`` tokens are kept as far as the target reproduces them."""
    if given is not None:
        given = given[:max_new_tokens]
        kept = teacher_forced_greedy(decoder.target.model, prompt, given)
        if kept == len(given) and (len(given) == max_new_tokens or (given and given[-1] in decoder.eos)):
            return given
        prefix = given[:kept]
        if prefix and prefix[-1] in decoder.eos:
            return prefix
    else:
        prefix = []
    rest = decoder.generate(prompt + prefix, max_new_tokens - len(prefix)).token_ids if len(prefix) < max_new_tokens else []
    return prefix + rest


@torch.inference_mode()
def draft_trace(draft: PreTrainedModel, prompt: list[int], output: list[int], depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Match lengths ``[N]`` and step features ``[N, depth, 3]`` of the draft's greedy continuations."""
    n, p = len(output), len(prompt)
    sequence = torch.tensor([prompt + output], device=draft.device)
    cache = DynamicCache(config=draft.config)
    logits = draft(input_ids=sequence, use_cache=True, **{cache_keyword(draft): cache}).logits[0, p - 1 : p - 1 + n]
    first = draft_features(logits)
    first_tokens = [f[0] for f in first]
    features = np.zeros((n, depth, 3), dtype=np.float32)
    features[:, 0] = [f[1:] for f in first]
    own = [t for t in range(n) if first_tokens[t] != output[t] or t == n - 1]
    if depth > 1 and own:
        features[own, 1:] = _rollouts(draft, cache, [p + t for t in own], [first_tokens[t] for t in own], depth - 1)
    match = np.zeros(n, dtype=np.int64)
    for t in range(n - 1, -1, -1):
        if first_tokens[t] == output[t]:
            match[t] = min(depth, 1 + (match[t + 1] if t + 1 < n else 0))
            if t not in own:
                features[t, 1:] = features[t + 1, : depth - 1]
    return match, features


def _rollouts(draft: PreTrainedModel, cache: DynamicCache, contexts: list[int], first_tokens: list[int], steps: int) -> np.ndarray:
    """Draft ``steps`` more greedy tokens for each row: row r sees the first ``contexts[r]`` cached tokens
    and then its own tokens, starting with ``first_tokens[r]``. Returns features ``[rows, steps, 3]``."""
    rows, cached = len(contexts), cache.get_seq_length()
    cache.batch_repeat_interleave(rows)
    device = draft.device
    visible = torch.arange(cached, device=device)[None, :] < torch.tensor(contexts, device=device)[:, None]
    mask = visible.long()
    tokens = torch.tensor(first_tokens, device=device)[:, None]
    positions = torch.tensor(contexts, device=device)[:, None]
    out = np.zeros((rows, steps, 3), dtype=np.float32)
    for j in range(steps):
        mask = torch.cat([mask, torch.ones(rows, 1, dtype=mask.dtype, device=device)], dim=1)
        logits = draft(
            input_ids=tokens, attention_mask=mask, position_ids=positions + j, use_cache=True, **{cache_keyword(draft): cache}
        ).logits[:, -1]
        step = draft_features(logits)
        out[:, j] = [s[1:] for s in step]
        tokens = torch.tensor([s[0] for s in step], device=device)[:, None]
    return out


def record(
    decoder: SpeculativeDecoder,
    prompts: Sequence[dict],
    prompt_ids: Sequence[list[int]],
    max_new_tokens: int,
    depth: int,
    metadata: dict,
    given_outputs: dict[str, list[int]] | None = None,
    progress=None,
) -> TraceSet:
    """Traces of ``prompts`` (workload rows with ``id`` and ``lang``) whose token ids are ``prompt_ids``."""
    outputs, matches, features = [], [], []
    repaired = 0
    for prompt, ids in zip(prompts, prompt_ids):
        given = given_outputs.get(prompt["id"]) if given_outputs else None
        y = greedy_output(decoder, ids, max_new_tokens, given)
        repaired += given is not None and y != given[:max_new_tokens]
        m, f = draft_trace(decoder.draft.model, ids, y, depth)
        outputs.append(np.array(y, dtype=np.int32))
        matches.append(m)
        features.append(f)
        if progress is not None:
            progress.update()
    offsets = np.cumsum([0] + [len(y) for y in outputs])
    return TraceSet(
        prompt_ids=[p["id"] for p in prompts],
        langs=[p.get("lang", "") for p in prompts],
        prompt_lengths=np.array([len(ids) for ids in prompt_ids]),
        offsets=offsets,
        outputs=np.concatenate(outputs),
        match=np.concatenate(matches),
        features=np.concatenate(features),
        metadata={**metadata, "max_new_tokens": max_new_tokens, "depth": depth, "sampling": "greedy", "repaired_outputs": int(repaired)},
    )
