"""Recording replay traces of a workload split: which prompts, the metadata every trace file carries, and
the check that tree traces follow the prompts their chain traces were recorded with."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from adaptive.copy_draft import CopyDraft
from adaptive.decoder import SpeculativeDecoder
from adaptive.engines import engine_of
from adaptive.pair import ModelPair
from adaptive.profile import CostProfile
from adaptive.profiling import hardware_description
from adaptive.recorder import record
from adaptive.sampling import SamplingConfig
from adaptive.traces import TraceSet
from adaptive.tree import TreeShape
from adaptive.tree_traces import TreeTraceSet, record_trees
from adaptive.workload import chat_ids, first_per_language, interleave_tasks, load_prompts
from lab.scale import parallel_map
from policies import make_policy

TRACES = Path("data") / "traces"


def recording_time() -> str:
    """Now, or the time in ``SOURCE_DATE_EPOCH`` when set (the reproducible-builds convention: equal
    recordings then make byte-identical trace files)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(int(epoch)) if epoch else time.localtime())


def trace_metadata(pair: ModelPair, name: str, split: str, dtype: str, **extra) -> dict:
    """What every trace file records about how it was made (``dtype``: as run; ``dtype_asked``: as given, e.g. auto;
    ``engine``: the forward the target ran through, whose numerics the acceptances are of)."""
    return {
        "pair": name,
        "tokenizer": pair.tokenizer.name_or_path,
        "split": split,
        "dtype": str(pair.target.dtype).removeprefix("torch."),
        "dtype_asked": dtype,
        "engine": engine_of(pair.target),
        "recorded_on": hardware_description(pair.target.device),
        "recorded_at": recording_time(),
        **extra,
    }


def select_prompts(
    split: str, lang: str | None = None, per_language: int | None = None, limit: int | None = None, tasks: str | tuple[str, ...] | None = None
) -> list[dict]:
    """Workload prompts of a split: optionally one language, some task types (taking turns, so the first N per
    language cover each of them), the first N per language, the first N overall."""
    prompts = load_prompts(split, lang=lang)
    if tasks is not None:
        wanted = (tasks,) if isinstance(tasks, str) else tasks
        prompts = interleave_tasks([p for p in prompts if p["task"] in wanted])
    if per_language:
        prompts = [prompts[k] for k in first_per_language([p["lang"] for p in prompts], per_language)]
    return prompts[:limit]


def known_outputs(path: str | Path) -> dict[str, list[int]]:
    """Greedy outputs by prompt id from a JSONL file of ``{id, response}`` rows, or from every ``*.jsonl`` in a
    folder (e.g. the shards ``adaptive distill-data --pool data/workload/prompts.jsonl --out DIR`` writes)."""
    path = Path(path)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"--outputs must be a JSONL file of {{id, response}} rows or a folder of them; {path} is neither")
    return {row["id"]: row["response"] for f in files for row in map(json.loads, f.read_text().splitlines())}


def record_chains(
    pair: ModelPair,
    name: str,
    prompts: list[dict],
    *,
    split: str,
    dtype: str,
    depth: int,
    max_new_tokens: int,
    sampling: SamplingConfig,
    outputs: str | None = None,
    profile: str | Path | None = None,
    seed: int = 0,
    samples: int = 1,
    copy: CopyDraft | None = None,
) -> TraceSet:
    """Chain traces of ``prompts`` (greedy: exact replay; T > 0: ``samples`` sampled outputs per prompt, each
    with what exact sampled replay needs). ``outputs``: a JSONL of known greedy outputs ``{id, response}`` to
    reuse (checked, repaired). ``copy``: the copy drafter's chains too."""
    if depth < 1 or max_new_tokens < 2:
        raise ValueError(f"depth must be >= 1 and max_new_tokens >= 2, got {depth} and {max_new_tokens}")
    if samples < 1 or (samples > 1 and sampling.is_greedy):
        raise ValueError(f"samples must be 1 for greedy traces (one output per prompt) and >= 1 otherwise, got {samples}")
    prompts = [prompt for prompt in prompts for _ in range(samples)]
    given = known_outputs(outputs) if outputs else None
    decoder = SpeculativeDecoder(pair.target, pair.draft, make_policy("static:1"), sampling, tokenizer=pair.tokenizer, max_depth=depth)
    metadata = trace_metadata(pair, name, split, dtype, samples_per_prompt=samples)
    profile_path = Path(profile) if profile else Path("profiles") / f"{name}.json"
    if profile_path.is_file():
        metadata["profile"] = {"path": str(profile_path), "hardware": CostProfile.load(profile_path).hardware}
    ids = [chat_ids(pair.tokenizer, p["prompt"]) for p in prompts]
    with tqdm(total=len(prompts), desc=f"record {split}", unit="prompt") as progress:
        return record(decoder, prompts, ids, max_new_tokens, depth, metadata, given, progress, seed, copy)


def record_chains_sharded(load: Callable[[], ModelPair], name: str, prompts: list[dict], *, workers: int, address: str | None = None, **settings) -> TraceSet:
    """:func:`record_chains` of ``prompts`` in ``workers`` consecutive shards, as Ray tasks (:mod:`lab.scale`)
    that each load the pair with ``load`` (a picklable callable, e.g. a ``functools.partial`` of
    ``load_pair``), joined into the trace set one process records: entry i keeps seed + i. Greedy traces are
    then byte-identical to a single process's when both run with the same torch threads per process and
    ``SOURCE_DATE_EPOCH`` fixes the recording time."""
    samples, seed = settings.get("samples", 1), settings.get("seed", 0)
    bounds = [round(k * len(prompts) / workers) for k in range(workers + 1)]
    tasks = [(load, name, prompts[a:b], {**settings, "seed": seed + a * samples}) for a, b in zip(bounds, bounds[1:]) if b > a]
    return TraceSet.join(parallel_map(_record_shard, tasks, workers, address, desc=f"record {settings.get('split', '')}"))


def _record_shard(task: tuple) -> TraceSet:
    load, name, prompts, settings = task
    return record_chains(load(), name, prompts, **settings)


def record_tree_traces(
    pair: ModelPair,
    name: str,
    chain_traces: str | Path,
    *,
    split: str,
    dtype: str,
    shape: TreeShape,
    depth: int,
    lang: str | None = None,
    per_language: int | None = None,
    limit: int | None = None,
) -> TreeTraceSet:
    """Tree traces along the outputs of a split's chain traces (which recorded and checked them): greedy, or sampled from
    the target at T > 0 (then replayed exactly in distribution: :mod:`adaptive.tree_traces`), keeping their sampling."""
    source = Path(chain_traces)
    if source.suffix != ".npz":
        raise ValueError(f"tree traces follow a split's chain trace file (.npz) holding its outputs, got {source}")
    chain = TraceSet.load(source)
    recorded_on, running = chain.metadata.get("engine", "eager"), engine_of(pair.target)
    if recorded_on != running:
        raise ValueError(
            f"{source} holds outputs of the target on engine {recorded_on!r}, and the draft reads the target's states: record the trees "
            f"on the same engine (--engine {recorded_on}), not {running!r}"
        )
    by_id = {p["id"]: p for p in load_prompts(split)}
    keep = [i for i in range(len(chain)) if lang in (None, chain.langs[i])]
    if per_language:
        keep = [keep[k] for k in first_per_language([chain.langs[i] for i in keep], per_language)]
    keep = keep[:limit]
    prompts = [by_id[chain.prompt_ids[i]] for i in keep]
    ids = [chat_ids(pair.tokenizer, p["prompt"]) for p in prompts]
    if any(len(x) != int(chain.prompt_lengths[i]) for x, i in zip(ids, keep)):
        raise ValueError(f"{source} was recorded with other prompt tokens than this tokenizer gives")
    outputs = [chain.output(i).tolist() for i in keep]
    sampling = {key: chain.metadata[key] for key in ("sampling", "temperature", "top_k", "top_p", "seed", "samples_per_prompt") if key in chain.metadata}
    metadata = trace_metadata(pair, name, split, dtype, outputs_from=str(source), max_new_tokens=chain.max_new_tokens, **sampling)
    with tqdm(total=len(prompts), desc=f"record trees {split}", unit="prompt") as progress:
        return record_trees(pair.target, pair.draft, prompts, ids, outputs, shape, depth, metadata, progress)
