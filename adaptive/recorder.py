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

For T > 0 (:func:`sampled_trace`), along outputs o sampled from the target (several per prompt), which is
also what speculative decoding emits. Given o, live decoding accepts its proposal at position j exactly with
probability a_j = min(1, q_j(o_j) / p_j(o_j)) (maximal coupling: P(propose x and emit x) = min(p(x), q(x))),
and on a rejection the proposal is distributed as norm(max(q_j − p_j, 0)), whatever o_j is. So a sampled
trace holds a_j, the draft's features of proposing o_j, one rejected proposal drawn from that law with its
features, and the draft's sampled continuation after it; replay draws each drafted step's acceptance from
a_j and shows the features of that outcome (:class:`envs.replay.ReplayBackend`): exact in distribution
for every chain policy that verifies what it drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel

from adaptive.cached_model import CachedModel, output_vocab_size
from adaptive.copy_draft import MODEL_FREE, CopyDraft, PromptLookupDraft, proposes
from adaptive.decoder import SpeculativeDecoder
from adaptive.drafts import Draft, HeadSession, draft_session, target_taps, teacher_forced
from adaptive.lean import open_cache
from adaptive.sampling import GREEDY, STEP_FEATURES, SamplingConfig, arg_max, draft_features, sample, sampling_distribution
from adaptive.traces import CopyTrace, TraceSet
from adaptive.tree import attention_mask
from adaptive.verification import acceptance_probabilities, residual_correction

FEATURES = len(STEP_FEATURES)


@torch.inference_mode()
def teacher_forced_greedy(target: PreTrainedModel, prompt: list[int], output: list[int]) -> int:
    """How many leading tokens of ``output`` the target's greedy decoding reproduces after ``prompt``."""
    if not output:
        return 0
    logits = target(input_ids=torch.tensor([prompt + output], device=target.device)).logits[0, len(prompt) - 1 : -1]
    agree = (arg_max(logits).cpu() == torch.tensor(output)).tolist() + [False]
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


def _check_prompt(draft: Draft, prompt_length: int) -> None:
    """A head drafts from the target's state before the last token: refuse a 1-token prompt for it. A copy
    drafter is recorded beside a draft model (:func:`copy_trace`), not as the pair's draft."""
    if isinstance(draft, MODEL_FREE):
        raise ValueError("a copy drafter is recorded beside the pair's draft model, not as its draft: adaptive record --pair NAME --copy")
    if target_taps(draft) and prompt_length < 2:
        raise ValueError(f"a draft head drafts after 2 tokens or more; this prompt has {prompt_length}")


@torch.inference_mode()
def draft_trace(target: PreTrainedModel, draft: nn.Module, prompt: list[int], output: list[int], depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Match lengths ``[N]`` and step features ``[N, depth, 4]`` of the draft's greedy continuations (the
    target is read only by a draft that drafts from its hidden states)."""
    n, p = len(output), len(prompt)
    _check_prompt(draft, p)
    session, logits = teacher_forced(target, draft, prompt + output)
    first = draft_features(logits[p - 1 : p - 1 + n], vocabulary=session.vocabulary)
    first_tokens = [f[0] for f in first]
    features = np.zeros((n, depth, FEATURES), dtype=np.float32)
    features[:, 0] = [f[1:] for f in first]
    # A draft that reads only tokens drafts after a hit d(t) = y[t] exactly as it drafts at t + 1, so only misses
    # need rollouts of their own; a head reads its own state after d(t) but the target's at t + 1: all do.
    chained = target_taps(draft) is None
    own = [t for t in range(n) if not chained or first_tokens[t] != output[t] or t == n - 1]
    drafted = torch.zeros(len(own), 0, dtype=torch.long)
    if depth > 1 and own:
        features[own, 1:], drafted, _ = _rollouts(session, [p + t for t in own], [first_tokens[t] for t in own], depth - 1)
    match = np.zeros(n, dtype=np.int64)
    if not chained:
        for row, t in enumerate(own):
            proposal, truth = [first_tokens[t]] + drafted[row].tolist(), output[t : t + depth]
            match[t] = next((j for j, (a, b) in enumerate(zip(proposal, truth)) if a != b), min(len(proposal), len(truth)))
        return match, features
    for t in range(n - 1, -1, -1):
        if first_tokens[t] == output[t]:
            match[t] = min(depth, 1 + (match[t + 1] if t + 1 < n else 0))
            if t not in own:
                features[t, 1:] = features[t + 1, : depth - 1]
    return match, features


def _rollouts(
    session: CachedModel | HeadSession,
    contexts: list[int],
    first_tokens: list[int],
    steps: int,
    sampling: SamplingConfig = GREEDY,
    generator: torch.Generator | None = None,
    forced: list[list[int]] | None = None,
) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Draft ``steps`` more tokens for each row, all rows in one masked forward per step appended to the
    session's cache: row r sees the first ``contexts[r]`` cached tokens and then its own tokens, starting
    with ``first_tokens[r]`` (at position ``contexts[r]``), then ``forced[r]`` (tokens given, not drafted)
    and then what it drafts. Greedy picks the arg-max, otherwise tokens are drawn from the sampling
    distribution. Returns features ``[rows, steps, 4]``, the drafted tokens ``[rows, steps]`` (the draft's
    own choice at every step, forced or not) and the probability each had under the draft's sampling
    distribution."""
    rows = len(contexts)
    own: list[list[int]] = [[] for _ in range(rows)]
    tokens = list(first_tokens)
    out = np.zeros((rows, steps, FEATURES), dtype=np.float32)
    drafted, probs = [], []
    for j in range(steps):
        cached = session.length
        mask = attention_mask(cached, contexts, own, session.dtype, session.device)
        logits = session.forward_masked(tokens, [c + j for c in contexts], mask)
        for r in range(rows):
            own[r].append(cached + r)
        chosen = None
        if not sampling.is_greedy:
            q = sampling_distribution(logits, sampling)
            chosen = sample(q, generator)
            probs.append(q.gather(-1, chosen[:, None])[:, 0])
        step = draft_features(logits, chosen, session.vocabulary)
        out[:, j] = [s[1:] for s in step]
        tokens = [s[0] for s in step]
        drafted.append(torch.tensor(tokens, device=session.device))
        if forced is not None:
            tokens = [given[j] if j < len(given) else token for given, token in zip(forced, tokens)]
    empty = torch.zeros(rows, 0, device=session.device)
    return out, torch.stack(drafted, 1) if drafted else empty.long(), torch.stack(probs, 1) if probs else empty


@torch.inference_mode()
def head_chains_after_copies(target: PreTrainedModel, head: nn.Module, prompt: list[int], output: list[int], chains: Sequence[CopyTrace]) -> list[CopyTrace]:
    """Each of ``chains`` (e.g. the copy drafter's and prompt lookup's) with a draft head's chain in every
    copy+model round whose copied tokens all match the output (:attr:`CopyTrace.after_match`,
    :attr:`CopyTrace.after_features`): the head reads the a copied tokens as the live decoder feeds them, the
    first from the target's state before it and the rest from its own, then drafts the round's remaining
    K - a steps. One teacher-forced pass, then all such rounds of every chain kind in one batched forward per step."""
    n, p = len(output), len(prompt)
    rounds = [  # (chain kind, t, copied tokens a) of the rounds that reach the model after matching copies
        (c, t, int(chain.available[t]))
        for c, chain in enumerate(chains)
        for t in range(n)
        if 1 <= chain.available[t] == chain.match[t] < chain.features.shape[1] and t + chain.available[t] < n
    ]
    after = [(np.full(n, -1, dtype=np.int64), np.zeros(chain.features.shape, dtype=np.float32)) for chain in chains]
    if rounds:
        depth = max(chain.features.shape[1] for chain in chains)
        session, _ = teacher_forced(target, head, prompt + output)
        forced = [output[t + 1 : t + a] for _, t, a in rounds]
        features, drafted, _ = _rollouts(session, [p + t for _, t, _ in rounds], [output[t] for _, t, _ in rounds], depth - 1, forced=forced)
        for row, (c, t, a) in enumerate(rounds):
            k = chains[c].features.shape[1] - a  # the model steps left in the round
            after[c][1][t, :k] = features[row, a - 1 : a - 1 + k]
            proposal, truth = drafted[row, a - 1 : a - 1 + k].tolist(), output[t + a : t + a + k]
            after[c][0][t] = next((j for j, (x, y) in enumerate(zip(proposal, truth)) if x != y), min(len(proposal), len(truth)))
    return [replace(chain, after_match=m, after_features=f) for chain, (m, f) in zip(chains, after)]


def copy_trace(copy: CopyDraft | PromptLookupDraft, vocab_size: int, prompt: list[int], output: list[int], depth: int) -> CopyTrace:
    """A model-free drafter's chain at every position t of ``output`` (context: prompt + output[:t]), up to
    ``depth`` steps or until it has nothing to propose. Its proposals depend on the tokens alone, so one
    session reads the output once and drafts each chain on top, rolled back after (a rollback starts a new
    round, where prompt lookup looks the context up afresh, as in decoding)."""
    n = len(output)
    trace = CopyTrace(np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros((n, depth, FEATURES), np.float32), np.zeros((n, depth), np.int64))
    session = copy.session(vocab_size, torch.device("cpu"))
    row = session.forward(prompt)[-1]
    for t in range(n):
        context, proposals = session.length, []
        while proposes(row) and len(proposals) < depth:
            token, *features = draft_features(row[None])[0]
            trace.features[t, len(proposals)] = features
            trace.lengths[t, len(proposals)] = session.match_lengths[-1]
            proposals.append(token)
            row = session.forward([token])[-1]
        trace.available[t] = len(proposals)
        truth = output[t : t + len(proposals)]
        trace.match[t] = next((j for j, (a, b) in enumerate(zip(proposals, truth)) if a != b), min(len(proposals), len(truth)))
        session.rollback(context)
        row = session.forward([output[t]])[-1]
    return trace


@torch.inference_mode()
def sampled_trace(
    target: PreTrainedModel,
    draft: nn.Module,
    prompt: list[int],
    output: list[int],
    depth: int,
    sampling: SamplingConfig,
    generator: torch.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For T > 0, along an output sampled from the target: per position j the acceptance probability a_j =
    min(1, q_j(o_j) / p_j(o_j)) ``[N]``; the features of proposing o_j at each step of a round that accepts
    every step ``[N, depth, 4]`` (step k of a round at j is position j + k's); and the features of a round
    whose first step is rejected at j ``[N, depth, 4]``: a proposal drawn from norm(max(q_j − p_j, 0)),
    then the draft's sampled continuation after it. One teacher-forced forward of each model, then
    ``depth - 1`` batched draft steps."""
    n, p = len(output), len(prompt)
    _check_prompt(draft, p)
    reading = open_cache(target, target_taps(draft))
    target_p = sampling_distribution(reading.forward(prompt + output)[p - 1 : p - 1 + n], sampling)
    session = draft_session(draft, reading)
    draft_logits = session.forward(prompt + output)[p - 1 : p - 1 + n]
    draft_q = sampling_distribution(draft_logits, sampling)
    emitted = torch.tensor(output, device=draft_q.device)
    p_emitted = target_p.gather(-1, emitted[:, None])[:, 0]
    if bool((p_emitted <= 0).any()):
        j = int((p_emitted <= 0).nonzero()[0])
        raise ValueError(f"token {j} of the output has probability 0 under the target at {sampling.describe()}: not a sample of it")
    # The coupling seen from the emitted side: the verification rules with p and q swapped.
    accept = acceptance_probabilities(draft_q, target_p, emitted)  # min(1, q_j(o_j) / p_j(o_j))
    rejected = sample(residual_correction(draft_q, target_p), generator)  # norm(max(q_j - p_j, 0)); unused where a_j = 1
    accepting = np.zeros((n, depth, FEATURES), dtype=np.float32)
    along = np.array([f[1:] for f in draft_features(draft_logits, emitted, session.vocabulary)], dtype=np.float32)
    for k in range(depth):
        accepting[: n - k, k] = along[k:]
    rejecting = np.zeros((n, depth, FEATURES), dtype=np.float32)
    rejecting[:, 0] = [f[1:] for f in draft_features(draft_logits, rejected, session.vocabulary)]
    if depth > 1:
        rejecting[:, 1:] = _rollouts(session, [p + t for t in range(n)], rejected.tolist(), depth - 1, sampling, generator)[0]
    return accept.float().cpu().numpy(), accepting, rejecting


def record(
    decoder: SpeculativeDecoder,
    prompts: Sequence[dict],
    prompt_ids: Sequence[list[int]],
    max_new_tokens: int,
    depth: int,
    metadata: dict,
    given_outputs: dict[str, list[int]] | None = None,
    progress=None,
    seed: int = 0,
    copy: CopyDraft | None = None,
) -> TraceSet:
    """Traces of ``prompts`` (workload rows with ``id`` and ``lang``) whose token ids are ``prompt_ids``.

    Greedy decoders record match lengths (exact replay); sampling decoders record :func:`sampled_trace`
    along one sampled output per entry of ``prompts`` (give a prompt several times for several samples),
    entry i drawn with ``seed`` + i. With ``copy``, the copy drafter's chains along the same outputs too,
    and transformers' prompt lookup's (up to ``depth`` tokens), to replay that baseline (:func:`copy_trace`)."""
    outputs, matches, features, accepts, rejects, copies, lookups = [], [], [], [], [], [], []
    lookup = PromptLookupDraft(num_tokens=depth)
    repaired = 0
    sampling = decoder.sampling
    for i, (prompt, ids) in enumerate(zip(prompts, prompt_ids)):
        if sampling.is_greedy:
            given = given_outputs.get(prompt["id"]) if given_outputs else None
            y = greedy_output(decoder, ids, max_new_tokens, given)
            repaired += given is not None and y != given[:max_new_tokens]
            m, f = draft_trace(decoder.target.model, decoder.draft.model, ids, y, depth)
        else:
            y = decoder.generate(ids, max_new_tokens, seed=seed + i).token_ids
            generator = torch.Generator(device=decoder.draft.device).manual_seed(seed + i)
            a, f, r = sampled_trace(decoder.target.model, decoder.draft.model, ids, y, depth, sampling, generator)
            m = np.zeros(len(y), dtype=np.int64)
            accepts.append(a)
            rejects.append(r)
        if copy is not None:
            vocab = output_vocab_size(decoder.target.model)
            chains = copy_trace(copy, vocab, ids, y, depth), copy_trace(lookup, vocab, ids, y, depth)
            if target_taps(decoder.draft.model) is not None:  # a head: its chain after copied tokens is its own
                chains = head_chains_after_copies(decoder.target.model, decoder.draft.model, ids, y, chains)
            copies.append(chains[0])
            lookups.append(chains[1])
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
        accept_prob=np.concatenate(accepts) if accepts else None,
        reject_features=np.concatenate(rejects) if rejects else None,
        copy=_joined(copies),
        lookup=_joined(lookups),
        metadata={
            **metadata,
            **({"copy_draft": asdict(copy), "prompt_lookup": asdict(lookup)} if copy is not None else {}),
            "max_new_tokens": max_new_tokens,
            "depth": depth,
            "sampling": sampling.describe(),
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "seed": seed,
            "repaired_outputs": int(repaired),
        },
    )


def _joined(chains: list[CopyTrace]) -> CopyTrace | None:
    """Per-prompt chains of a model-free drafter back to back (None when none were recorded)."""
    return CopyTrace.concatenate(chains) if chains else None
