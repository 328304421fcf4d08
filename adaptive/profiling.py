"""Measuring a pair's cost profile on this machine: draft step time and target verification time as a
function of the tokens verified and the context length (the profile itself: :mod:`adaptive.profile`)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from adaptive.batch_decoder import BatchedSpeculativeDecoder
from adaptive.batch_profile import FORMAT as BATCH_PROFILE_FORMAT
from adaptive.batched_head import batched_sessions
from adaptive.cached_model import CachedModel
from adaptive.copy_draft import CopyDraft
from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.drafts import HeadSession, draft_session, target_taps
from adaptive.engines import engine_of
from adaptive.generation import Clock
from adaptive.lean import open_cache
from adaptive.policy import BasePolicy, DraftState, RoundStats
from adaptive.precision import cpu_flags
from adaptive.profile import CostProfile, summarise
from adaptive.tree import TreeShape, attention_mask
from adaptive.tree_decoder import DEFAULT_SHAPE, TreeDecoder

MATRIX_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
"""The CPU flags that decide how fast a forward runs (two CPUs of one model name may differ in them, e.g. under KVM)."""
DRAFT_RUN = 4
"""Draft steps timed back to back, after a target forward: a round drafts its steps in a row, and the first one after
the target's forward runs slower than the rest (the default head on the compiled-int4 engine: 0.97 ms, then 0.49, 0.36,
0.33). The profile keeps each position's time (``draft_run``: replay charges a round's steps by position) and their
mean as the draft step (``c``); timing one step alone overstated c by two."""
CATCH_UP = 8
"""A round's first draft step first reads what the last verification emitted (its accepted tokens and the target's
next one, n = accepted + 1; a head reads the target's states at them, in one batch) and drafts from the last: the
profile times that step for n = 1..CATCH_UP, each right after a target forward of n tokens (``draft_catch_up``);
replay charges it by the last round's acceptance."""
ROUND_WORK_TOKENS = 96
"""Tokens of the short decode that measures the decoder's own work per round (``round_work``)."""
TREE_LEVELS = 6
"""Levels a tree round grows at most in the decode that measures the tree decoder's own work (``tree_round_work``;
the shipped tree traces hold 6)."""
PREFILL_LENGTHS = (32, 96, 192)
"""Prompt lengths at which a generation's prefill is timed (``prefill``; the workload's prompts run 36..197 tokens)."""
SAME_MACHINE_KEYS = ("processor", "matrix_flags", "cpu_count", "torch_threads", "torch", "device", "gpu")
"""The entries of :func:`hardware_description` that must agree for timings to carry from one machine to another
(torch included: its kernels are part of the speed)."""


def hardware_description(device: torch.device) -> dict[str, str | int]:
    """What the numbers were measured on."""
    info: dict[str, str | int] = {
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "matrix_flags": " ".join(flag for flag in MATRIX_FLAGS if flag in cpu_flags()),
        "cpu_count": os.cpu_count() or 0,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def hardware_differences(recorded: dict, here: dict) -> list[str]:
    """How the machine that ``recorded`` describes differs from ``here`` (both :func:`hardware_description`s),
    one line per entry of :data:`SAME_MACHINE_KEYS`; empty when timings measured there hold here."""
    return [f"{key}: {recorded.get(key, 'not recorded')!r} there, {here.get(key)!r} here" for key in SAME_MACHINE_KEYS if recorded.get(key) != here.get(key)]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _summary(seconds: list[float]) -> dict[str, float]:
    quartiles = statistics.quantiles(seconds, n=4) if len(seconds) > 1 else [seconds[0]] * 3
    return {"median_ms": statistics.median(seconds) * 1e3, "p25_ms": quartiles[0] * 1e3, "p75_ms": quartiles[2] * 1e3}


def _feed(model: CachedModel, tokens: list[int], tree_mask: bool) -> None:
    """One forward of ``tokens``; with ``tree_mask`` the way the tree decoder verifies (an explicit 4D mask,
    built inside the timed region; its pattern does not change the cost of dense attention)."""
    if not tree_mask:
        model.forward(tokens)
        return
    cached = model.length
    mask = attention_mask(cached, [cached + i for i in range(len(tokens))], [[] for _ in tokens], model.dtype, model.device)
    model.forward_masked(tokens, range(cached, cached + len(tokens)), mask)


def _draft_after(target, draft, context: list[int], target_reads: int) -> CachedModel | HeadSession:
    """The draft's session after ``context``, on a target that has read its first ``target_reads`` tokens: all but
    the last, so that a timed step drafts from a head's own state (a round's later steps), or all of it, so that a
    head rolled back by n reads the last n from the target's states (a round's first step, :func:`_timed_catch_up`)."""
    reading = open_cache(target, target_taps(draft))
    if reading.taps:
        reading.forward(context[:target_reads])
    session = draft_session(draft, reading)
    session.forward(context)
    return session


def _timed_call(model: CachedModel | HeadSession, tokens: list[int], clock: Clock, tree_mask: bool = False) -> float:
    """Seconds of feeding ``tokens`` after the model's cached context, rolled back after."""
    length = model.length
    start = clock()
    _feed(model, tokens, tree_mask)
    seconds = clock() - start
    model.rollback(length)
    return seconds


def _timed_draft_run(session: CachedModel | HeadSession, tokens: list[int], clock: Clock) -> list[float]:
    """Seconds of each step of drafting ``tokens`` one by one after the session's cached context, rolled back after."""
    length = session.length
    seconds = []
    for token in tokens:
        start = clock()
        session.forward([token])
        seconds.append(clock() - start)
    session.rollback(length)
    return seconds


def _timed_catch_up(session: CachedModel | HeadSession, context: list[int], n: int, clock: Clock) -> float:
    """Seconds of a round's first draft step after a verification that emitted the last ``n`` tokens of ``context``."""
    session.rollback(len(context) - n)
    start = clock()
    session.forward(context[-n:])
    return clock() - start


class _CyclingDepths(BasePolicy):
    """Drafts 1, 2, .., max_depth tokens in turn, reading the draft's features at every step (as learned policies
    and ``confidence`` do: the dearer of the decoder's two ways)."""

    def __init__(self, max_depth: int) -> None:
        self.name, self.max_depth, self.round = "cycling", max_depth, 0

    def reset(self) -> None:
        self.round = 0

    def should_continue(self, state: DraftState) -> bool:
        return state.depth < 1 + self.round % self.max_depth

    def observe(self, stats: RoundStats) -> None:
        self.round += 1


def _fit_line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope of ys over xs (slope 0 where xs do not vary), neither below 0."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread) if spread else 0.0
    return max(0.0, mean_y - slope * mean_x), slope


def round_work(target, draft, context: list[int], max_depth: int, repetitions: int) -> dict[str, float]:
    """The chain decoder's own work per round, outside model forwards (the draft's features and sampling, the policy's
    state, acceptance, rollback, emitting), from a short greedy decode after ``context`` drafting every depth up to
    ``max_depth`` in turn: drafting's part fitted as fixed + per drafted token, verification's as fixed + per
    verified token, in ms."""
    decoder = SpeculativeDecoder(target, draft, _CyclingDepths(max_depth), max_depth=max_depth)
    rounds = [r for _ in range(repetitions) for r in decoder.generate(context, ROUND_WORK_TOKENS).rounds[1:]]  # round 1 follows the prefill
    drafting = _fit_line([r.drafted for r in rounds], [(r.draft_time - r.forward_time + r.target_forward_time) * 1e3 for r in rounds])
    verifying = _fit_line([r.verified for r in rounds], [(r.verify_time - r.target_forward_time) * 1e3 for r in rounds])
    fitted = {"draft_fixed_ms": drafting[0], "draft_token_ms": drafting[1], "verify_fixed_ms": verifying[0], "verify_token_ms": verifying[1]}
    return {**fitted, "rounds": len(rounds)}


class _CyclingTrees(_CyclingDepths):
    """Grows 1, 2, .., max_depth levels in turn and verifies sizes cycling through ``sizes`` on another period, so that
    depth and size vary apart."""

    sizes_trees = True

    def __init__(self, max_depth: int, sizes: tuple[int, ...]) -> None:
        super().__init__(max_depth)
        self.sizes = sizes

    def verify_size(self, state: DraftState) -> int:
        return self.sizes[self.round % len(self.sizes)]


def tree_round_work(target, draft, context: list[int], shape: TreeShape, max_size: int, repetitions: int) -> dict[str, float]:
    """What a tree round adds to a chain's, timed as the tree decoder runs it: a short greedy decode after ``context``
    (one untimed first, to warm every shape) grows every depth up to :data:`TREE_LEVELS` and verifies 1..``max_size``
    nodes in turn. Fitted, in ms: the draft's forwards as the first level's + ``level_forward_ms`` per later level (a
    masked forward over the W best nodes); the decoder's own work outside forwards (growing and ranking each level,
    the masks, selecting the verified nodes, acceptance, compacting both caches, emitting) as fixed + per level while
    drafting and fixed + per verified node while verifying."""
    sizes = tuple(sorted({1, 2, 3, *(n for n in (4, 6, 8, 12, 16, 24, 32, 48, 64) if n <= max_size), max_size}))
    decoder = TreeDecoder(target, draft, _CyclingTrees(TREE_LEVELS, sizes), TreeShape(shape.branching, shape.width, max_size), max_depth=TREE_LEVELS)
    decoder.generate(context, ROUND_WORK_TOKENS)
    rounds = [r for _ in range(repetitions) for r in decoder.generate(context, ROUND_WORK_TOKENS).rounds[1:]]
    parts = [r.time_parts() for r in rounds]
    forwards = _fit_line([r.drafted - 1 for r in rounds], [forward * 1e3 for forward, _, _, _ in parts])
    drafting = _fit_line([r.drafted for r in rounds], [own * 1e3 for _, own, _, _ in parts])
    verifying = _fit_line([r.verified for r in rounds], [own * 1e3 for _, _, _, own in parts])
    fitted = {
        "branching": shape.branching,
        "width": shape.width,
        "first_forward_ms": forwards[0],
        "level_forward_ms": forwards[1],
        "draft_fixed_ms": drafting[0],
        "draft_level_ms": drafting[1],
        "verify_fixed_ms": verifying[0],
        "verify_node_ms": verifying[1],
    }
    return {**fitted, "rounds": len(rounds)}


def prefill_work(target, draft, lengths: tuple[int, ...], repetitions: int, generator: torch.Generator) -> dict:
    """A generation's time outside its rounds, as live decoding reports it (``GenerationResult.prefill_time``: the
    prompt's forward through the target, and the draft for speculative decoding, and per-call set-up), timed at each
    prompt length in ``lengths`` (lengths interleaved, one warm-up sweep) and fitted as fixed + per prompt token, in ms,
    for plain and for speculative decoding."""
    decoder = SpeculativeDecoder(target, draft, _CyclingDepths(1), max_depth=1)
    prompts = [torch.randint(0, target.config.vocab_size, (n,), generator=generator).tolist() for n in lengths]
    runs = {"plain": lambda ids: generate_plain(target, ids, 1), "speculative": lambda ids: decoder.generate(ids, 1)}
    seconds: dict[str, list[list[float]]] = {kind: [[] for _ in lengths] for kind in runs}
    for sweep in range(repetitions + 1):
        for i, ids in enumerate(prompts):
            for kind, run in runs.items():
                measured = run(ids).prefill_time
                if sweep:
                    seconds[kind][i].append(measured * 1e3)
    fitted = {}
    for kind, points in seconds.items():
        fixed, per_token = _fit_line(list(lengths), [statistics.median(p) for p in points])
        fitted[kind] = {"fixed_ms": fixed, "token_ms": per_token, "median_ms": [statistics.median(p) for p in points]}
    return {"lengths": list(lengths), **fitted}


def profile_pair(
    target,
    draft,
    *,
    max_verify: int = 32,
    contexts: tuple[int, ...] = (64, 128, 512),
    reference_context: int = 128,
    repetitions: int = 7,
    seed: int = 0,
    tree_mask: bool = False,
    prefill_lengths: tuple[int, ...] = PREFILL_LENGTHS,
) -> CostProfile:
    """Measure the pair on this machine.

    Args:
        max_verify: largest number of tokens fed to the target in one verification.
        contexts: context lengths (tokens already cached) to measure at.
        reference_context: the context at which ``c`` and ``g`` are summarised.
        repetitions: timed repetitions per point (after one warm-up): sweeps over every point in turn, so
            that a disturbance of the machine spreads over all points instead of skewing one.
        tree_mask: time verifications as the tree decoder runs them (explicit tree attention mask), and what a tree
            round adds, from a short tree decode (``tree_round_work``; trees of
            :data:`~adaptive.tree_decoder.DEFAULT_SHAPE`'s branching and width).
        prefill_lengths: prompt lengths at which a generation's prefill is timed (none: not timed).
    """
    if reference_context not in contexts:
        raise ValueError(f"reference_context {reference_context} must be one of contexts {contexts}")
    clock = Clock(target.device)
    generator = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    target_cache = open_cache(target, target_taps(draft))  # verification keeps what the draft reads, as in decoding
    result: dict = {
        "contexts": list(contexts),
        "reference_context": reference_context,
        "repetitions": repetitions,
        "verify_mask": "tree" if tree_mask else "causal",
        "order": "interleaved",
    }
    result["draft_step"], result["draft_run"], result["draft_catch_up"], result["verify"], result["copy_step"] = {}, {}, {}, {}, {}
    catch_ups = range(1, min(CATCH_UP, max_verify) + 1)
    with tqdm(total=len(contexts) * (repetitions + 1), desc="profile", unit="sweep") as progress:
        for ctx in contexts:
            context = torch.randint(0, vocab, (ctx,), generator=generator).tolist()
            new = torch.randint(0, vocab, (max_verify,), generator=generator).tolist()
            target_cache.reset()
            target_cache.forward(context)
            draft_cache = _draft_after(target, draft, context, ctx - 1)
            catch_up = _draft_after(target, draft, context, ctx)
            copy_session = draft_session(CopyDraft(), target_cache)
            copy_session.forward(context)
            draft_tokens = new[:DRAFT_RUN]  # as many as max_verify allows
            points = [(target_cache, new[:n], tree_mask) for n in range(1, max_verify + 1)] + [(copy_session, new[:1], False)]
            times: list[list[float]] = [[] for _ in points]
            run: list[list[float]] = [[] for _ in draft_tokens]
            caught: list[list[float]] = [[] for _ in catch_ups]
            for sweep in range(repetitions + 1):  # sweep 0 warms every shape up; each later sweep times every point once
                steps = _timed_draft_run(draft_cache, draft_tokens, clock)  # after the previous sweep's target forwards
                seconds, reads = [], []
                for model, tokens, masked in points:
                    seconds.append(_timed_call(model, tokens, clock, masked))
                    if model is target_cache and len(tokens) in catch_ups:  # the draft's first step after this verification
                        reads.append(_timed_catch_up(catch_up, context, len(tokens), clock))
                if sweep:
                    for timed, measured in zip([*run, *times, *caught], [*steps, *seconds, *reads]):
                        timed.append(measured)
                progress.update()
            result["draft_step"][str(ctx)] = _summary([statistics.mean(sweep) for sweep in zip(*run)])
            result["draft_run"][str(ctx)] = [_summary(position) for position in run]
            result["draft_catch_up"][str(ctx)] = [_summary(point) for point in caught]
            result["copy_step"][str(ctx)] = _summary(times[-1])
            result["verify"][str(ctx)] = {str(n): _summary(times[n - 1]) for n in range(1, max_verify + 1)}
    if max_verify >= 2:
        context = torch.randint(0, vocab, (reference_context,), generator=generator).tolist()
        result["round_work"] = round_work(target, draft, context, min(max_verify - 1, CATCH_UP), repetitions=2)
        if tree_mask:
            result["tree_round_work"] = tree_round_work(target, draft, context, DEFAULT_SHAPE, max_verify - 1, repetitions=2)
    if prefill_lengths:
        result["prefill"] = prefill_work(target, draft, prefill_lengths, repetitions=2, generator=generator)
    summarise(result)
    result["hardware"] = hardware_description(target.device)
    result["dtype"] = str(target.dtype).removeprefix("torch.")
    result["engine"] = engine_of(target)
    result["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return CostProfile.from_dict(result)


class _Fixed:
    """A batch policy of one depth (the profile times each depth on its own)."""

    def __init__(self, depth: int) -> None:
        self.name, self.fixed = f"static:{depth}", depth

    def depth(self, state) -> int:
        return self.fixed


def profile_batches(
    target,
    draft,
    *,
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8),
    max_tokens: int = 9,
    context: int = 128,
    repetitions: int = 5,
    seed: int = 0,
) -> dict:
    """Batched costs on this machine, as the batched decoder pays them, every row at about ``context``
    cached tokens: forwards (:class:`~adaptive.batched_model.BatchedCachedModel`) of the target fed n =
    1..``max_tokens`` tokens per row and of the draft fed one (a drafting step past the first), and whole decoder rounds
    (:class:`~adaptive.batch_decoder.BatchedSpeculativeDecoder` drafting d = 0..``max_tokens`` − 1 tokens per
    request: the forwards plus its per-request work), for each batch size. Returns the JSON document
    :class:`~adaptive.batch_profile.BatchCostProfile` reads. Sweeps interleave every point, as
    :func:`profile_pair` does."""
    clock = Clock(target.device)
    generator = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    document: dict = {"format": BATCH_PROFILE_FORMAT, "context": context, "repetitions": repetitions, "batch_sizes": list(batch_sizes)}
    document["target"], document["draft"], document["rounds"] = {}, {}, {}
    with tqdm(total=len(batch_sizes) * (repetitions + 1), desc="batch profile", unit="sweep") as progress:
        for batch in batch_sizes:
            prompts = [torch.randint(0, vocab, (context,), generator=generator).tolist() for _ in range(batch)]
            models = dict(zip(("target", "draft"), batched_sessions(target, draft)))
            for session in models.values():
                session.add_rows(prompts)
            decoders = []
            for depth in range(max_tokens):
                decoder = BatchedSpeculativeDecoder(target, draft, _Fixed(depth), max_depth=depth, max_batch=batch, eos_token_id=[])
                for prompt in prompts:
                    decoder.submit(prompt, max_new_tokens=(repetitions + 1) * (depth + 1) + 1)
                decoders.append(decoder)
            feeds = torch.randint(0, vocab, (batch, max_tokens), generator=generator).tolist()
            points = [("draft", 1)] + [("target", n) for n in range(1, max_tokens + 1)]
            times: list[list[float]] = [[] for _ in points]
            rounds: list[list[float]] = [[] for _ in decoders]
            for sweep in range(repetitions + 1):
                for index, (name, n) in enumerate(points):
                    model = models[name]
                    if name == "draft":  # a drafting step past the first (a head's reads its own state, not the target's)
                        model.forward([row[:1] for row in feeds])
                    start = clock()
                    model.forward([row[:n] for row in feeds])
                    seconds = clock() - start
                    for row in range(batch):
                        model.rollback(row, context)
                    if sweep:
                        times[index].append(seconds)
                for depth, decoder in enumerate(decoders):  # sweep 0 admits (prefills) the requests
                    start = clock()
                    decoder.step()
                    if sweep:
                        rounds[depth].append(clock() - start)
                progress.update()
            document["draft"][str(batch)] = _summary(times[0])
            document["target"][str(batch)] = {str(n): _summary(times[n]) for n in range(1, max_tokens + 1)}
            document["rounds"][str(batch)] = {str(depth): _summary(rounds[depth]) for depth in range(max_tokens)}
    document["hardware"] = hardware_description(target.device)
    document["dtype"] = str(target.dtype).removeprefix("torch.")
    document["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return document
