"""Live wall-clock comparisons that survive a noisy machine.

For each prompt, plain decoding and every decoder run back to back in an order that rotates from one
(prompt, repeat) to the next, so no configuration always runs first or last; each runs ``repeats`` times
per prompt and keeps the median time. Speedups are ratios of rates over the same prompts; their 95 %
intervals come from a paired bootstrap over prompts (each resample keeps every configuration's run of a
prompt together), and a ratio whose interval covers 1 is reported as "not significant".

Other work on the machine slows whatever generation it lands in. While the pause file exists
(``$ADAPTIVE_PAUSE_FILE``, default ``runs/pause`` under the working directory) a measurement waits between
generations, never inside one: ``touch runs/pause``, wait for "paused" in its log, run the other work, remove it.
The other way round, background data work (:mod:`lab.background`) waits while a measurement runs.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from adaptive.decoder import SpeculativeDecoder, generate_plain
from adaptive.learned_policy import WEIGHTS, policy_sidecar
from adaptive.pair import load_pair
from adaptive.policy import DraftPolicy
from adaptive.precision import DEFAULT_DTYPE
from adaptive.profiling import hardware_description
from adaptive.sampling import GREEDY, SamplingConfig
from adaptive.workload import LANGUAGES, chat_ids, interleave_tasks, load_prompts
from lab.background import live_measurement
from lab.checkpoints import Checkpoint
from lab.evaluation import paired_ratio, verdict
from lab.memory import PeakMemory
from lab.report import format_table

PLAIN = "plain"
PAUSE_POLL_SECONDS = 2.0


def pause_file() -> Path:
    """The file whose existence pauses every live measurement between generations."""
    return Path(os.environ.get("ADAPTIVE_PAUSE_FILE", "runs/pause"))


def wait_while_paused(path: Path, sleep: Callable[[float], None] = time.sleep, say: Callable[[str], None] = tqdm.write) -> float:
    """Return once ``path`` does not exist (at once when it never did); the seconds spent waiting."""
    if not path.exists():
        return 0.0
    say(f"paused: {path} exists; remove it to go on")
    start = time.perf_counter()
    while path.exists():
        sleep(PAUSE_POLL_SECONDS)
    waited = time.perf_counter() - start
    say(f"resumed after {waited:.0f} s")
    return waited


class TurnClock:
    """A clock that runs only during its owner's turns (``with clock.turn(): ...``), from 0 at the first.

    Decoders that take turns on one machine, each reading its own such clock, each see the time of their own
    work only; a change of host speed slower than a turn reaches all of them alike instead of whichever ran
    in that spell."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._elapsed = 0.0
        """Seconds of the turns taken so far."""
        self._since: float | None = None
        """When the current turn started (None between turns)."""

    def __call__(self) -> float:
        return self._elapsed + (self._clock() - self._since if self._since is not None else 0.0)

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Run the clock for the duration of the block."""
        if self._since is not None:
            raise RuntimeError("this clock's turn is already running")
        self._since = self._clock()
        try:
            yield
        finally:
            self._elapsed += self._clock() - self._since
            self._since = None


def chain_decoders(pair, policies: dict[str, Callable[[], DraftPolicy]], max_depth: int) -> dict[str, Callable[[], object]]:
    """Factories of chain decoders, one per policy factory."""
    return {
        name: (lambda f=factory: SpeculativeDecoder(pair.target, pair.draft, f(), tokenizer=pair.tokenizer, max_depth=max_depth))
        for name, factory in policies.items()
    }


def warm_pair(name: str, dtype: str = DEFAULT_DTYPE, engine: str = "eager"):
    """The named pair, its target run through ``engine``, after one short plain generation."""
    pair = load_pair(name, dtype, engine=engine)
    generate_plain(pair.target, chat_ids(pair.tokenizer, "Hello"), 4)
    return pair


def first_prompts(pair, split: str, per_language: int, tasks: tuple[str, ...] | None = None) -> tuple[list[dict], list[list[int]]]:
    """The first ``per_language`` prompts of each language of a split (of ``tasks`` only, if given, taking
    turns in that order), and their chat token ids."""
    prompts = []
    for lang in LANGUAGES:
        rows = load_prompts(split, lang=lang)
        prompts += (interleave_tasks([p for p in rows if p["task"] in tasks], tasks) if tasks else rows)[:per_language]
    return prompts, [chat_ids(pair.tokenizer, prompt["prompt"]) for prompt in prompts]


def rotation(names: Sequence[str], turn: int) -> list[str]:
    """``names`` rotated left by ``turn`` places (mod their number)."""
    k = turn % len(names)
    return [*names[k:], *names[:k]]


def measure(
    target,
    prompts: Sequence[dict],
    prompt_ids: Sequence[list[int]],
    decoders: dict[str, Callable[[], object]],
    new_tokens: int,
    repeats: int = 2,
    desc: str = "live",
    sampling: SamplingConfig = GREEDY,
    seed: int = 0,
    checkpoint: Path | None = None,
    identity: dict | None = None,
) -> dict[str, list[dict]]:
    """Plain decoding of ``target`` and every decoder (factories of objects with ``generate(ids, n, seed=)``
    returning a :class:`~adaptive.generation.GenerationResult`) on each prompt (workload rows with ``id`` and
    ``lang``; ``prompt_ids``: their token ids); plain decoding samples with ``sampling``, every run with ``seed``.

    Per configuration (``plain`` and each decoder's name) one row per prompt: tokens, the median
    seconds over ``repeats`` rotating back-to-back runs (``seconds_runs``: all of them) and the median prefill
    seconds within them (``prefill``: the prompt's forward through both models and per-call set-up), rounds, accepted
    and rejecting rounds, TTFT, inter-token gaps and token ids of the median run, whether every run's
    output equals plain's, peak memory. A progress bar over generations shows the time left. Before each
    generation it waits while :func:`pause_file` exists.

    With ``checkpoint`` (a JSONL file) every finished prompt's rows are appended to it, and a later call with
    the same file skips those prompts: a long measurement resumes where it was killed. Rows measured on other
    hardware or with other settings, or another ``identity`` (whatever else the rows depend on, e.g. digests of
    the draft's and the policies' weights), are refused (:class:`lab.checkpoints.Checkpoint`), never mixed in."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = [PLAIN, *decoders]
    header = {
        "hardware": hardware_description(target.device),
        "configurations": names,
        "prompts": [prompt["id"] for prompt in prompts],
        "new_tokens": new_tokens,
        "repeats": repeats,
        "sampling": sampling.describe(),
        "seed": seed,
        "identity": identity,
    }
    saved = Checkpoint(checkpoint, header, header["prompts"], "prompt", "rows") if checkpoint else None
    done = saved.done() if saved else []
    pause = pause_file()
    tqdm.write(f"{desc}: touch {pause} to pause between generations")
    results: dict[str, list[dict]] = {name: [row[name] for row in done] for name in names}
    with (
        live_measurement(),
        tqdm(total=len(prompts) * repeats * len(names), initial=len(done) * repeats * len(names), desc=desc, unit="generation") as progress,
    ):
        for index in range(len(done), len(prompts)):
            prompt, ids = prompts[index], prompt_ids[index]
            runs: dict[str, list] = {name: [] for name in names}
            for repeat in range(repeats):
                for name in rotation(names, index * repeats + repeat):
                    wait_while_paused(pause)
                    with PeakMemory(target.device) as peak:
                        if name == PLAIN:
                            result = generate_plain(target, ids, new_tokens, sampling, seed=seed)
                        else:
                            result = decoders[name]().generate(ids, new_tokens, seed=seed)
                    runs[name].append((result, peak.mib))
                    progress.update()
            plain_tokens = runs[PLAIN][0][0].token_ids
            rows = {name: _row(prompt, runs[name], plain_tokens) for name in names}
            for name, row in rows.items():
                results[name].append(row)
            if saved:
                saved.add(prompt["id"], rows)
    return results


def weights_digest(draft) -> str | None:
    """A SHA-256 of a draft module's weights (None for a drafter without any)."""
    if not isinstance(draft, torch.nn.Module):
        return None
    sha = hashlib.sha256()
    for name, tensor in sorted(draft.state_dict().items()):
        sha.update(name.encode())
        sha.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def policy_digests(specs: Sequence[str]) -> dict[str, str]:
    """A SHA-256 of each learned policy a spec names by path, whole or as its last ``:`` field (e.g.
    ``capped:SCHEDULE:FOLDER``): its sidecar and weights (a retrained ``runs/NAME-latest`` differs)."""
    digests = {}
    for spec in specs:
        path = next((Path(p) for p in (spec, spec.rsplit(":", 1)[-1]) if Path(p).exists()), None)
        if path is not None:
            sidecar = policy_sidecar(path)
            digests[spec] = hashlib.sha256(sidecar.read_bytes() + (sidecar.parent / WEIGHTS).read_bytes()).hexdigest()
    return digests


def identity(pair, drafts: dict[str, object], policies: Sequence[str]) -> dict:
    """What a checkpoint's rows depend on beyond :func:`measure`'s settings: the dtype, each draft's weights (by
    name) and each learned policy's files."""
    return {"dtype": str(pair.target.dtype), "drafts": {name: weights_digest(draft) for name, draft in drafts.items()}, "policies": policy_digests(policies)}


def checkpoint_path(folder: Path, part: str) -> Path:
    """Where a job writing its report into ``folder`` keeps the finished prompts of its live ``part`` until then."""
    return folder / f"live-{part}.partial.jsonl"


def discard_checkpoints(folder: Path) -> None:
    """Delete the checkpoints of :func:`checkpoint_path` in ``folder`` (once the report they fed is written)."""
    for path in folder.glob("live-*.partial.jsonl"):
        path.unlink()


def measure_policies(
    pair,
    split: str,
    per_language: int,
    policies: dict[str, Callable[[], DraftPolicy]],
    max_depth: int,
    new_tokens: int,
    repeats: int = 2,
    desc: str = "live",
    checkpoint: Path | None = None,
    identity: dict | None = None,
) -> dict[str, list[dict]]:
    """:func:`measure` of chain decoders with each policy on the first ``per_language`` prompts per language of a split."""
    prompts, ids = first_prompts(pair, split, per_language)
    return measure(pair.target, prompts, ids, chain_decoders(pair, policies, max_depth), new_tokens, repeats, desc, checkpoint=checkpoint, identity=identity)


def _row(prompt: dict, runs: list, plain_tokens: list[int]) -> dict:
    ordered = sorted(runs, key=lambda run: run[0].total_time)
    median, _ = ordered[(len(ordered) - 1) // 2]
    return {
        "lang": prompt["lang"],
        "id": prompt["id"],
        "tokens": len(median.token_ids),
        "seconds": statistics.median(r.total_time for r, _ in runs),
        "seconds_runs": [r.total_time for r, _ in runs],
        "prefill": statistics.median(r.prefill_time for r, _ in runs),
        "rounds": len(median.rounds),
        "ttft": statistics.median(r.first_token_time for r, _ in runs),
        "accepted": sum(r.accepted for r in median.rounds),
        "rejections": sum(r.rejected for r in median.rounds),
        "gaps": [r.total_time / r.emitted for r in median.rounds for _ in range(r.emitted)],
        "token_ids": list(median.token_ids),
        "identical": all(r.token_ids == plain_tokens for r, _ in runs),
        "peak_mib": max((mib for _, mib in runs if mib is not None), default=None),
    }


def output_digest(token_ids: Sequence[int]) -> str:
    """A short fingerprint of a generation's output (result files keep no token ids): equal outputs, equal digests."""
    return hashlib.blake2b(np.asarray(token_ids, dtype=np.int64).tobytes(), digest_size=8).hexdigest()


def kept_row(row: dict) -> dict:
    """A live row as a result file keeps it: its output as a digest (:func:`output_digest`) instead of token ids, and
    its per-token gaps (each round's time over the tokens it emitted) as runs ``[seconds, tokens]``, one per round."""
    kept = {key: value for key, value in row.items() if key not in ("token_ids", "gaps")}
    if "token_ids" in row:
        kept["output_digest"] = output_digest(row["token_ids"])
    runs: list[list[float]] = []
    for gap in row["gaps"]:
        if isinstance(gap, list):  # already kept
            runs.append(gap)
        elif runs and runs[-1][0] == gap:
            runs[-1][1] += 1
        else:
            runs.append([gap, 1])
    kept["gaps"] = runs
    return kept


def _gaps(row: dict) -> list[float]:
    """A row's per-token gaps, whether as measured or as :func:`kept_row` keeps them."""
    return [g for gap in row["gaps"] for g in ([gap[0]] * int(gap[1]) if isinstance(gap, list) else [gap])]


def ratio_interval(rows: list[dict], baseline: list[dict]) -> tuple[float, float, float]:
    """(ratio, low, high) of the rate of ``rows`` over that of ``baseline`` (same prompts, same order)."""
    if [r["id"] for r in rows] != [r["id"] for r in baseline]:
        raise ValueError("paired rows must hold the same prompts in the same order")
    return paired_ratio([(r["tokens"], r["seconds"]) for r in rows], [(r["tokens"], r["seconds"]) for r in baseline])


def summary(rows: list[dict], plain: list[dict]) -> dict:
    """One configuration's live numbers against plain decoding on the same prompts."""
    tokens, seconds = sum(r["tokens"] for r in rows), sum(r["seconds"] for r in rows)
    gaps = np.array([g for r in rows for g in _gaps(r)])
    speedup, low, high = ratio_interval(rows, plain)
    return {
        "tokens_per_second": tokens / seconds,
        "speedup": speedup,
        "low": low,
        "high": high,
        "verdict": verdict(low, high),
        "tau": tokens / max(1, sum(r["rounds"] for r in rows)),
        "ttft_ms": statistics.median(r["ttft"] for r in rows) * 1e3,
        "itl_ms": {f"p{q}": float(np.percentile(gaps, q) * 1e3) for q in (50, 95, 99)} if len(gaps) else {},
        "seconds": seconds,
        "identical": all(r["identical"] for r in rows),
        "peak_mib": max((r["peak_mib"] for r in rows if r["peak_mib"] is not None), default=None),
    }


def summarise(live: dict[str, list[dict]]) -> dict:
    """Per configuration and language (those measured, and all): :func:`summary` against the plain rows."""
    measured = [lang for lang in (*LANGUAGES, "all") if any(lang in (r["lang"], "all") for r in live[PLAIN])]
    return {
        name: {lang: summary([r for r in rows if lang in (r["lang"], "all")], [r for r in live[PLAIN] if lang in (r["lang"], "all")]) for lang in measured}
        for name, rows in live.items()
    }


def compare(live: dict[str, list[dict]], name: str, reference: str) -> dict:
    """``name`` against ``reference`` on the same prompts: ratio, 95 % interval and verdict."""
    ratio, low, high = ratio_interval(live[name], live[reference])
    return {"ratio": ratio, "low": low, "high": high, "verdict": verdict(low, high)}


def report(live: dict, repeats: int) -> list[str]:
    """Markdown lines of the live table (speedup over plain per language; all languages with its interval)."""
    rows = []
    for name, data in live.items():
        d = data["all"]
        interval = f"{d['speedup']:.2f}x [{d['low']:.2f}, {d['high']:.2f}]" + (" n.s." if d["verdict"] == "not significant" and name != PLAIN else "")
        itl = d["itl_ms"]
        rows.append(
            [
                name,
                *(f"{data[lang]['speedup']:.2f}x" if lang in data else "-" for lang in LANGUAGES),
                interval,
                f"{d['tokens_per_second']:.1f}",
                f"{d['tau']:.2f}",
                f"{d['ttft_ms']:.0f}",
                f"{itl['p50']:.1f}/{itl['p95']:.1f}/{itl['p99']:.1f}" if itl else "-",
                f"{d['seconds']:.1f}",
                "n/a" if d["peak_mib"] is None else f"{d['peak_mib']:.0f}",
                "yes" if d["identical"] else "NO",
            ]
        )
    return [
        "",
        f"## Live: wall clock (each prompt {repeats}x per configuration, rotating order, medians; [95 % paired bootstrap over prompts])",
        "",
        format_table(["policy", *LANGUAGES, "all", "tok/s", "tau", "TTFT ms", "ITL p50/p95/p99 ms", "total s", "peak MiB", "= plain"], rows),
        "",
        "n.s.: not significant (the interval covers 1). Peak MiB: the process's peak resident memory during the generation "
        "(both models included), or peak device memory on CUDA.",
    ]
