"""Load tests of the batched decoder (``adaptive loadtest``): requests from the test split, mixed languages,
under closed-loop clients (a fixed concurrency) or Poisson arrivals (a fixed rate), bounded in count and
time; latency percentiles, goodput, throughput and peak memory per policy, per language and overall.
While the pause file exists (:func:`lab.live_protocol.pause_file`) it waits between runs, never inside one.

Per request: TTFT (submission to first token, queueing included), TPOT (time per output token after the
first: (last − first token) / (tokens − 1)), inter-token gaps (tokens of one round arrive together: the
gaps inside a round are 0), end-to-end latency. Goodput counts the tokens of requests whose TPOT meets the
target (``slo_tpot_ms``), per second of the run. Each policy runs on the same requests in the same order;
with repeats, the order of policies rotates. Interleaved (``LoadTestSettings.interleave``), a repeat's policies
run at once, one round each in turn, each on a clock that runs only in its own turns, so that host-speed drift
reaches them alike. A policy's gain over plain batched decoding is the ratio of
their throughputs, with a 95 % paired-bootstrap interval over requests (tokens and end-to-end seconds of
each request, as :func:`lab.evaluation.paired_ratio` pairs them).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from adaptive.batch_decoder import BatchedSpeculativeDecoder, RequestResult
from adaptive.divergence import first_divergence
from adaptive.files import read_json
from adaptive.generation import Clock
from adaptive.pair import ModelPair
from adaptive.policy import BatchPolicy
from adaptive.profiling import hardware_description
from adaptive.sampling import SamplingConfig
from adaptive.workload import LANGUAGES, chat_ids, load_prompts
from lab import live_protocol
from lab.background import live_measurement
from lab.checkpoints import Checkpoint
from lab.evaluation import paired_ratio, verdict
from lab.live_protocol import TurnClock, output_digest
from lab.memory import PeakMemory

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class Load:
    """How requests arrive: ``concurrency`` closed-loop clients (each sends its next request when the last
    one finished), or Poisson arrivals at ``rate`` requests per second; ``requests`` in all, no new ones
    after ``duration`` seconds (None: no time bound)."""

    requests: int
    concurrency: int | None = None
    rate: float | None = None
    duration: float | None = None
    max_batch: int = 8
    """Open loop: requests decoded at once (closed loop: the concurrency)."""

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed-loop clients) and rate (Poisson arrivals per second)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0 requests per second, got {self.rate}")
        if self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")

    @property
    def batch(self) -> int:
        return self.concurrency if self.concurrency is not None else self.max_batch

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency is not None else f"rate {self.rate:g}/s"


def mixed_prompt_rows(count: int, split: str = "test") -> list[dict]:
    """The workload rows of a load test's ``count`` requests: ``split``'s prompts, the languages taking turns,
    each language's in file order (wrapping round)."""
    by_lang = {lang: load_prompts(split, lang=lang) for lang in LANGUAGES}
    langs = [LANGUAGES[i % len(LANGUAGES)] for i in range(count)]
    return [by_lang[lang][i // len(LANGUAGES) % len(by_lang[lang])] for i, lang in enumerate(langs)]


def mixed_prompts(pair: ModelPair, count: int, split: str = "test") -> list[tuple[str, list[int]]]:
    """``count`` chat-formatted prompts of ``split``, the languages taking turns: (language, token ids)."""
    return [(row["lang"], chat_ids(pair.tokenizer, row["prompt"])) for row in mixed_prompt_rows(count, split)]


RoundRecord = tuple[int, int, float, float, float, int]
"""A round of a load test: batch size, depth, policy seconds (its decisions, per round and per draft step), seconds
in all (policy, draft and verification), seconds admitting requests before it (their prefill) and drafted tokens
accepted (summed over its requests)."""


class LoadRun:
    """``decoder`` driven with ``prompts`` (request i is prompt i) under ``load``, one round per :meth:`advance`,
    so that several runs can take turns (:func:`run_interleaved`); :func:`run_load` runs one to its end."""

    def __init__(self, decoder: BatchedSpeculativeDecoder, prompts: Sequence[list[int]], load: Load, max_new_tokens: int, seed: int = 0) -> None:
        self.decoder, self.prompts, self.load, self.max_new_tokens, self.seed = decoder, prompts, load, max_new_tokens, seed
        self.start = decoder.clock()
        self.arrivals = None
        if load.rate is not None:
            self.arrivals = list(self.start + np.cumsum(np.random.default_rng(seed).exponential(1.0 / load.rate, size=len(prompts))))
        self.submitted: list[int] = []
        self.rounds: list[RoundRecord] = []
        self.finished = False

    def _submit(self, at: float | None = None) -> None:
        index = len(self.submitted)
        self.submitted.append(self.decoder.submit(self.prompts[index], self.max_new_tokens, seed=self.seed + index, at=at))

    def advance(self) -> bool:
        """Submit the requests due, then decode one round (waiting first for the next arrival when nothing is
        decoding); False once every request has finished."""
        decoder, clock, load = self.decoder, self.decoder.clock, self.load
        while not self.finished:
            now = clock()
            open_for_more = load.duration is None or now - self.start < load.duration
            more = open_for_more and len(self.submitted) < len(self.prompts)
            if self.arrivals is None:
                while more and len(decoder.queue) + len(decoder.batch) < load.concurrency:
                    self._submit()
                    more = len(self.submitted) < len(self.prompts)
            else:
                while more and self.arrivals[len(self.submitted)] <= now:
                    self._submit(at=self.arrivals[len(self.submitted)])
                    more = len(self.submitted) < len(self.prompts)
                if decoder.idle and more:
                    time.sleep(max(0.0, self.arrivals[len(self.submitted)] - clock()))
                    continue
            if decoder.idle:
                self.finished = True
                break
            round_ = decoder.step()
            if round_ is not None:
                seconds = (round_.policy_time, round_.total_time - round_.admit_time, round_.admit_time)
                self.rounds.append((len(round_.requests), round_.depth, *seconds, sum(round_.accepted)))
                return True
        return False

    def outcome(self) -> tuple[list[RequestResult], float, list[RoundRecord]]:
        """The finished requests in submission order, the run's seconds (first submission to last token) and
        its rounds."""
        results = [self.decoder.finished.pop(i) for i in self.submitted]
        return results, max((r.token_times[-1] for r in results if r.token_times), default=self.start) - self.start, self.rounds


def run_load(
    decoder: BatchedSpeculativeDecoder, prompts: Sequence[list[int]], load: Load, max_new_tokens: int, seed: int = 0
) -> tuple[list[RequestResult], float, list[RoundRecord]]:
    """Drive ``decoder`` with ``prompts`` (request i is prompt i) under ``load`` to the end: the finished
    requests in submission order, the run's wall seconds (first submission to last token) and its rounds
    (:data:`RoundRecord`)."""
    run = LoadRun(decoder, prompts, load, max_new_tokens, seed)
    while run.advance():
        pass
    return run.outcome()


def warm_up(
    pair: ModelPair,
    policies: dict[str, Callable[[], BatchPolicy]],
    sampling: SamplingConfig,
    prompts: Sequence[list[int]],
    max_depth: int = 8,
    max_new_tokens: int = 8,
) -> None:
    """Run every policy briefly on two requests at once before any timed run, so that none of them (the first
    measured in particular) carries the kernels' and allocator's first-use costs in its timings."""
    for make in policies.values():
        decoder = BatchedSpeculativeDecoder(pair.target, pair.draft, make(), sampling, max_depth=max_depth)
        run_load(decoder, prompts[:2], Load(2, concurrency=2), max_new_tokens=max_new_tokens)


def run_interleaved(
    decoders: dict[str, BatchedSpeculativeDecoder], clocks: dict[str, TurnClock], prompts: Sequence[list[int]], load: Load, max_new_tokens: int, seed: int = 0
) -> dict[str, tuple[list[RequestResult], float, list[RoundRecord]]]:
    """The decoders (each reading its own :class:`~lab.live_protocol.TurnClock` from ``clocks``) under the same
    load on the same requests, taking one round each in turn until all have finished: :func:`run_load`'s outcome
    per decoder, each timed on its own turns. The order of turns is shuffled in every lap (seeded by ``seed``), so
    that no decoder always follows the same one (a round leaves the caches as its decoder used them)."""
    runs = {name: LoadRun(decoder, prompts, load, max_new_tokens, seed) for name, decoder in decoders.items()}
    going, order = list(runs), random.Random(seed)
    while going:
        order.shuffle(going)
        for name in list(going):
            with clocks[name].turn():
                if not runs[name].advance():
                    going.remove(name)
    return {name: runs[name].outcome() for name in decoders}


def request_row(result: RequestResult, prompt: int, lang: str) -> dict:
    """What a report needs of one finished request (``prompt``: its index in the run's prompts)."""
    n = len(result.token_ids)
    return {
        "prompt": prompt,
        "lang": lang,
        "tokens": n,
        "seconds": result.latency,
        "ttft": result.first_token_latency,
        "tpot": (result.token_times[-1] - result.token_times[0]) / (n - 1) if n > 1 else float("nan"),
        "gaps": result.inter_token_latencies,
        "rounds": len(result.accepted),
        "accepted": sum(result.accepted),
        "token_ids": result.token_ids,
        "output_digest": output_digest(result.token_ids),
    }


RESULT_FILE = "result.json"
GAPS_FILE = "gaps.npz"


def write_result(result: dict, folder: Path) -> None:
    """A load test's result as files to keep: ``result.json`` holds the settings, each load's summary and each
    request's row without its token ids (their :func:`output_digest` instead) or inter-token gaps, which go to
    ``gaps.npz`` (float32 seconds per run, compressed); the runs' per-round records stay out (each load's summary
    holds what they tell). :func:`read_result` reads both back."""
    arrays: dict[str, np.ndarray] = {}
    loads = {}
    for label, load in result["loads"].items():
        runs = {}
        for name, repeats in load["runs"].items():
            kept = []
            for run in repeats:
                key = f"run{len(arrays) // 2}"
                arrays[f"{key}_gaps"] = np.array([g for row in run["rows"] for g in row["gaps"]], dtype=np.float32)
                arrays[f"{key}_counts"] = np.array([len(row["gaps"]) for row in run["rows"]], dtype=np.int64)
                rows = [{k: v for k, v in row.items() if k not in ("token_ids", "gaps")} for row in run["rows"]]
                kept.append({"wall": run["wall"], "peak_mib": run["peak_mib"], "gaps": key, "rows": rows})
            runs[name] = kept
        loads[label] = {**load, "runs": runs}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RESULT_FILE).write_text(json.dumps({**result, "loads": loads}, indent=1))
    np.savez_compressed(folder / GAPS_FILE, **arrays)


def read_result(path: str | Path) -> dict:
    """A load test's ``result.json`` with each request's inter-token gaps back from the ``gaps.npz`` beside it (read
    without pickles); results written before it keep their gaps inline, and their token ids become digests."""
    path = Path(path)
    result = read_json(path, "load-test result")
    runs = [run for load in result["loads"].values() for repeats in load["runs"].values() for run in repeats]
    if any(isinstance(run.get("gaps"), str) for run in runs):
        with np.load(path.parent / GAPS_FILE, allow_pickle=False) as arrays:
            for run in runs:
                gaps, counts = arrays[f"{run['gaps']}_gaps"].astype(float), arrays[f"{run['gaps']}_counts"]
                for row, piece in zip(run["rows"], np.split(gaps, np.cumsum(counts)[:-1]), strict=True):
                    row["gaps"] = piece.tolist()
    for row in (row for run in runs for row in run["rows"] if "token_ids" in row):
        row["output_digest"] = output_digest(row.pop("token_ids"))
    return result


def summary(rows: list[dict], wall: float, slo_tpot_ms: float) -> dict:
    """Latency percentiles (ms), throughput and goodput (tokens/s over the run's wall time) of some requests."""

    def percentiles(values: list[float]) -> dict:
        clean = [v for v in values if v == v]
        return {f"p{q}": float(np.percentile(clean, q) * 1e3) if clean else float("nan") for q in PERCENTILES}

    tokens = sum(r["tokens"] for r in rows)
    meeting = sum(r["tokens"] for r in rows if r["tpot"] == r["tpot"] and r["tpot"] * 1e3 <= slo_tpot_ms)
    return {
        "requests": len(rows),
        "tokens": tokens,
        "ttft_ms": percentiles([r["ttft"] for r in rows]),
        "tpot_ms": percentiles([r["tpot"] for r in rows]),
        "itl_ms": percentiles([g for r in rows for g in r["gaps"]]),
        "e2e_ms": percentiles([r["seconds"] for r in rows]),
        "throughput": tokens / wall if wall > 0 else 0.0,
        "goodput": meeting / wall if wall > 0 else 0.0,
        "accepted_per_round": sum(r["accepted"] for r in rows) / max(1, sum(r["rounds"] for r in rows)),
    }


@dataclass(frozen=True)
class LoadTestSettings:
    loads: tuple[Load, ...]
    max_new_tokens: int = 128
    max_depth: int = 8
    repeats: int = 1
    slo_tpot_ms: float = 100.0
    seed: int = 0
    near_ties: bool = False
    """Check every greedy divergence from the baseline for a near-tie of the target (after the runs)."""
    interleave: bool = False
    """Run every policy of a repeat at once, taking rounds in turn, each timed on its own turns (its peak memory
    is then theirs together), instead of one policy's run after another's."""


def load_test(
    pair: ModelPair,
    policies: dict[str, Callable[[], BatchPolicy]],
    settings: LoadTestSettings,
    sampling: SamplingConfig,
    prompts: list[tuple[str, list[int]]],
    checkpoint: Path | None = None,
    identity: dict | None = None,
) -> dict:
    """Every policy under every load, ``repeats`` times (policy order rotating), on the same requests: one
    policy's run after another's, or with ``settings.interleave`` all at once, taking rounds in turn.
    Returns per load: per policy the runs' request rows, wall seconds and peak memory, and the summaries
    (per language and overall, over all repeats) with each policy's throughput ratio to the first policy.

    With ``checkpoint`` (a JSONL file) every finished load is appended to it, and a later call with the same
    file, hardware, settings, policies, sampling, prompts and ``identity`` (e.g. digests of the draft's and the
    policies' weights) measures only the loads that are missing (:class:`lab.checkpoints.Checkpoint`)."""
    names = list(policies)
    out: dict = {"settings": {**asdict(settings), "loads": [asdict(load) for load in settings.loads]}, "loads": {}}
    header = {
        "hardware": hardware_description(pair.target.device),
        "settings": out["settings"],
        "policies": names,
        "sampling": sampling.describe(),
        "prompts": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
        "identity": identity,
    }
    saved = Checkpoint(checkpoint, header, [load.label for load in settings.loads], "load", "result") if checkpoint else None
    for load, measured in zip(settings.loads, saved.done() if saved else []):
        out["loads"][load.label] = measured
    total = len(settings.loads) * settings.repeats * len(names)
    pause = live_protocol.pause_file()
    tqdm.write(f"load test: touch {pause} to pause between runs")
    with live_measurement(), tqdm(total=total, initial=len(out["loads"]) * settings.repeats * len(names), desc="load test", unit="run") as bar:
        for load in settings.loads[len(out["loads"]) :]:
            runs: dict[str, list[dict]] = {name: [] for name in names}
            requests = [ids for _, ids in prompts[: load.requests]]
            for repeat in range(settings.repeats):
                order = live_protocol.rotation(names, repeat)
                for group in [order] if settings.interleave else [[name] for name in order]:
                    live_protocol.wait_while_paused(pause)
                    clocks = {name: TurnClock(Clock(pair.target.device)) for name in group} if settings.interleave else {}
                    decoders = {
                        name: BatchedSpeculativeDecoder(
                            pair.target,
                            pair.draft,
                            policies[name](),
                            sampling,
                            tokenizer=pair.tokenizer,
                            max_depth=settings.max_depth,
                            max_batch=load.batch,
                            clock=clocks.get(name),
                        )
                        for name in group
                    }
                    with PeakMemory(pair.target.device) as peak:
                        if settings.interleave:
                            outcomes = run_interleaved(decoders, clocks, requests, load, settings.max_new_tokens, settings.seed)
                        else:
                            outcomes = {name: run_load(decoder, requests, load, settings.max_new_tokens, settings.seed) for name, decoder in decoders.items()}
                    for name, (results, wall, rounds) in outcomes.items():
                        rows = [request_row(r, i, prompts[i][0]) for i, r in enumerate(results)]
                        runs[name].append({"rows": rows, "wall": wall, "peak_mib": peak.mib, "rounds": [list(r) for r in rounds]})
                        bar.update()
            summary_ = summarise_load(runs, names[0], settings.slo_tpot_ms)
            if settings.near_ties:
                for name in names[1:]:
                    summary_[name]["divergences"] = divergences(pair.target, [ids for _, ids in prompts], runs[name], runs[names[0]])
            out["loads"][load.label] = {"load": asdict(load), "runs": runs, "summary": summary_}
            if saved:
                saved.add(load.label, out["loads"][load.label])
    return out


def divergences(target, prompts: list[list[int]], runs: list[dict], baseline: list[dict]) -> dict:
    """Where a policy's greedy outputs leave the baseline's (same repeat, same request): how many, and how many
    of those are near-ties of the target (:func:`adaptive.divergence.first_divergence`; bf16 rounds a batched
    k-token forward and a 1-token forward differently)."""
    found = []
    pairs = [(a, b) for run, base in zip(runs, baseline) for a, b in zip(run["rows"], base["rows"]) if a["token_ids"] != b["token_ids"]]
    for row, base in tqdm(pairs, desc="near-tie check", unit="divergence", leave=False):
        divergence = first_divergence(target, prompts[row["prompt"]], base["token_ids"], row["token_ids"])
        if divergence is not None:
            found.append({"prompt": row["prompt"], **asdict(divergence), "near_tie": divergence.near_tie})
    return {"count": len(found), "near_ties": sum(d["near_tie"] for d in found), "each": found}


def depths_by_batch(rounds: list[tuple]) -> dict[str, dict[str, int]]:
    """Rounds per depth at each batch size (JSON keys): what a policy chose under this load (each round
    (batch size, depth, ...))."""
    counts: dict[str, dict[str, int]] = {}
    for batch, depth, *_ in sorted(rounds):
        per_depth = counts.setdefault(str(batch), {})
        per_depth[str(depth)] = per_depth.get(str(depth), 0) + 1
    return counts


def round_ms_by_batch(rounds: list[tuple]) -> dict[str, dict[str, float]]:
    """Median milliseconds of a round (policy, draft and verification; admissions apart) per depth at each batch
    size (JSON keys): live round costs to set beside a batched profile's. Rounds kept before round times were
    (three fields) count in none."""
    times: dict[tuple[int, int], list[float]] = {}
    for batch, depth, _policy, seconds, *_ in (r for r in rounds if len(r) >= 4):
        times.setdefault((batch, depth), []).append(seconds)
    table: dict[str, dict[str, float]] = {}
    for (batch, depth), seconds in sorted(times.items()):
        table.setdefault(str(batch), {})[str(depth)] = float(np.median(seconds) * 1e3)
    return table


def summarise_load(runs: dict[str, list[dict]], baseline: str, slo_tpot_ms: float) -> dict:
    """Per policy: summaries per language and overall (repeats pooled: wall seconds summed), peak memory,
    and the throughput ratio to ``baseline`` with its paired interval over requests."""
    result = {}
    for name, repeats in runs.items():
        rows = [row for run in repeats for row in run["rows"]]
        wall = sum(run["wall"] for run in repeats)
        per_lang = {lang: summary([r for r in rows if r["lang"] == lang], wall, slo_tpot_ms) for lang in LANGUAGES if any(r["lang"] == lang for r in rows)}
        entry = {"all": summary(rows, wall, slo_tpot_ms), **per_lang, "peak_mib": max((run["peak_mib"] or 0.0) for run in repeats)}
        rounds = [tuple(r) for run in repeats for r in run.get("rounds", [])]
        entry["depths"] = depths_by_batch(rounds)
        timed = [r[2] for r in rounds if len(r) > 2]  # policy seconds per round (load tests since they were kept)
        entry["policy_us_per_round"] = float(np.mean(timed) * 1e6) if timed else None
        entry["policy_share"] = sum(timed) / wall if timed and wall > 0 else None
        entry["round_ms"] = round_ms_by_batch(rounds)
        result[name] = entry
    for name, repeats in runs.items():
        rows = [row for run in repeats for row in run["rows"]]
        base = [row for run in runs[baseline] for row in run["rows"]]
        ratio, low, high = paired_ratio([(r["tokens"], r["seconds"]) for r in rows], [(r["tokens"], r["seconds"]) for r in base])
        throughput = result[name]["all"]["throughput"] / result[baseline]["all"]["throughput"]
        result[name]["versus_baseline"] = {
            "request_speed_ratio": ratio,
            "low": low,
            "high": high,
            "verdict": verdict(low, high),
            "throughput_ratio": throughput,
        }
        result[name]["divergent_requests"] = sum(a["output_digest"] != b["output_digest"] for a, b in zip(rows, base))
    return result
