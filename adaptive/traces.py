"""Greedy decoding traces: everything needed to replay speculative decoding exactly, without models.

Under greedy decoding the speculative output equals the target's greedy output y for every policy. So a
trace stores, per prompt, y and, for every position t (context = prompt + y[:t]), the draft's greedy
continuation's per-step features (:data:`~adaptive.sampling.STEP_FEATURES`) for K steps and the match
length m(t): how many of those K tokens equal y[t:]. A round at t that verifies γ drafted tokens then
accepts min(γ, m(t)) and emits that + 1 (fewer at the end of y). Only time has to come from elsewhere:
a cost profile.

m(t) counts matches only up to the end of y: past an EOS the live decoder may still "accept" drafted
tokens it never emits; the replay does not count those (emitted tokens are identical either way).

Storage: one compressed ``.npz`` (no pickles) holding the arrays of all prompts back to back, with
``offsets`` marking where each prompt's positions start, and a JSON ``metadata`` string.

Traces may also hold the copy drafter's chain at every position (:class:`CopyTrace`), so a replayed round
can draft with either drafter or with the copy drafter then the model.

Sampled traces (T > 0, see :mod:`adaptive.recorder`) hold, along outputs sampled from the target, each
position's acceptance probability given the output and the features of accepting and of rejecting there,
instead of match lengths; replay draws acceptances from them, exact in distribution (format 2; sampled
traces of format 1 held an approximation and are refused). Format 3 adds each step's margin (top-1 minus
top-2 probability) to the features; read from older files, the margin is NaN (:attr:`TraceSet.has_margins`).
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from adaptive.files import UnreadableFile, read_arrays
from adaptive.sampling import STEP_FEATURES

TRACE_FORMAT = "adaptive-draft/trace/3"
READABLE_FORMATS = ("adaptive-draft/trace/1", "adaptive-draft/trace/2", TRACE_FORMAT)
"""Greedy traces of format 1 are format 2's greedy traces; its sampled ones are refused. Formats 1 and 2 lack
the steps' margins."""


def with_margins(features: np.ndarray) -> np.ndarray:
    """Step features ``[..., 4]`` (:data:`STEP_FEATURES`) as recorded, or, from files recorded before the margin
    was (``[..., 3]``), with a NaN margin column."""
    if features.shape[-1] == len(STEP_FEATURES):
        return features
    return np.concatenate([features, np.full(features.shape[:-1] + (1,), np.nan, dtype=features.dtype)], axis=-1)


def holds_margins(features: np.ndarray) -> bool:
    """True when every step's margin was recorded (not NaN)."""
    return not bool(np.isnan(features[..., STEP_FEATURES.index("margin")]).any())


def write_npz(path: str | Path, traces, arrays: dict[str, np.ndarray], file_format: str) -> None:
    """A trace file: the per-prompt arrays every trace set has (``traces``), ``arrays``, and the metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_npz(
        path,
        {
            "prompt_ids": np.array(traces.prompt_ids, dtype=str),
            "langs": np.array(traces.langs, dtype=str),
            "prompt_lengths": traces.prompt_lengths.astype(np.int32),
            "offsets": traces.offsets.astype(np.int64),
            "outputs": traces.outputs.astype(np.int32),
            **arrays,
            "metadata": np.array(json.dumps({"format": file_format, **traces.metadata})),
        },
    )


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """A compressed ``.npz`` whose bytes depend on ``arrays`` alone (fixed member times, unlike
    ``np.savez_compressed``), so equal traces make equal files; ``np.load`` reads it."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asanyarray(array), allow_pickle=False)
            member = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(member, buffer.getvalue(), compress_type=zipfile.ZIP_DEFLATED)


COMMON_ARRAYS = ("prompt_ids", "langs", "prompt_lengths", "offsets", "outputs", "metadata")


def read_trace_file(path: str | Path, file_format: str | tuple[str, ...], required: tuple[str, ...]) -> tuple[dict, dict, dict]:
    """Read a trace file whole (never unpickles) and check it: its format (one of ``file_format``), the arrays every
    trace file has and ``required``, and that the per-prompt arrays agree (a file cut short or altered is refused).
    Returns the per-prompt arrays, the metadata and every array."""
    arrays = read_arrays(path, "trace file")
    allowed = (file_format,) if isinstance(file_format, str) else file_format
    missing = [name for name in (*COMMON_ARRAYS, *required) if name not in arrays]
    if missing:
        raise UnreadableFile(f"{path} is not a trace file of format {' or '.join(allowed)}: array {missing[0]!r} is missing")
    try:
        metadata = json.loads(str(arrays["metadata"]))
    except json.JSONDecodeError:
        raise UnreadableFile(f"{path}: its metadata is not JSON") from None
    found = metadata.get("format") if isinstance(metadata, dict) else None
    if found not in allowed:
        raise UnreadableFile(f"{path} is not a trace file of format {' or '.join(allowed)} (found {found!r})")
    offsets, outputs = arrays["offsets"], arrays["outputs"]
    prompts = len(arrays["prompt_ids"])
    if not (
        len(arrays["langs"]) == len(arrays["prompt_lengths"]) == prompts
        and offsets.ndim == 1
        and len(offsets) == prompts + 1
        and np.issubdtype(offsets.dtype, np.integer)
        and offsets[0] == 0
        and bool(np.all(np.diff(offsets) >= 0))
        and offsets[-1] == len(outputs)
    ):
        raise UnreadableFile(f"{path}: its per-prompt arrays disagree ({prompts} prompts, offsets {offsets.shape}, {len(outputs)} output tokens): damaged?")
    common = {
        "prompt_ids": arrays["prompt_ids"].tolist(),
        "langs": arrays["langs"].tolist(),
        "prompt_lengths": arrays["prompt_lengths"],
        "offsets": offsets,
        "outputs": outputs,
    }
    return common, metadata, arrays


@dataclass
class CopyTrace:
    """The copy drafter's chain at every position of the outputs, next to the model draft's: its proposals
    depend on the tokens alone and are deterministic, so along any output (greedy or sampled) a proposal is
    accepted exactly when it is the output's token."""

    match: np.ndarray
    """[N] int: how many of its proposals at t equal the output from t (at most ``available``)."""
    available: np.ndarray
    """[N] int: how many steps it proposes at t before running out of matches (at most K); a round drafting
    with it stops there."""
    features: np.ndarray
    """[N, K, 4] float: :data:`STEP_FEATURES` of its continuation frequencies at each step (0 past ``available``)."""
    lengths: np.ndarray
    """[N, K] int: the match length behind each step (0 past ``available``)."""
    after_match: np.ndarray | None = None
    """[N] int, for a draft head: how many steps of the model's chain in a copy+model round at t (after the
    ``available`` proposals, all matching) equal the output from t + available; -1 where that round does not
    reach the model. A head reads the copied tokens from its own states, so its chain there is not the one it
    drafts at t + available from the target's; a draft reading only tokens needs none (None)."""
    after_features: np.ndarray | None = None
    """[N, K, 4] float, for a draft head: that chain's :data:`STEP_FEATURES`, step k at index k."""

    ARRAYS = ("match", "available", "features", "lengths")
    AFTER = ("after_match", "after_features")

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array it holds, by name (the optional head chains only when recorded)."""
        return {name: getattr(self, name) for name in (*self.ARRAYS, *self.AFTER) if getattr(self, name) is not None}

    @classmethod
    def concatenate(cls, parts: list[CopyTrace]) -> CopyTrace:
        """Chains of consecutive prompts (or prompt shards), back to back."""
        return cls(**{name: np.concatenate([part.arrays()[name] for part in parts]) for name in parts[0].arrays()})


@dataclass
class TraceSet:
    """Traces of many prompts for one pair, sampling setting and K."""

    prompt_ids: list[str]
    langs: list[str]
    prompt_lengths: np.ndarray
    """[P] tokens in each prompt (the context length at t = 0)."""
    offsets: np.ndarray
    """[P + 1] start of each prompt's positions in the flat arrays; prompt i has offsets[i+1]-offsets[i] positions."""
    outputs: np.ndarray
    """[N] int32: y of every prompt, back to back."""
    match: np.ndarray
    """[N] int16: m(t) at every position, at most K."""
    features: np.ndarray
    """[N, K, 4] float16: :data:`STEP_FEATURES` of each draft step (top-1 probability, entropy in nats,
    log-probability, margin)."""
    accept_prob: np.ndarray | None = None
    """[N] float32, sampled traces only: a_t = min(1, q_t(o_t) / p_t(o_t)), the probability that a proposal at t
    is accepted given the output (match is unused then; ``features`` are those of proposing the output)."""
    reject_features: np.ndarray | None = None
    """[N, K, 4] float16, sampled traces only: features of a round whose first step is rejected at t (a proposal
    from norm(max(q_t − p_t, 0)), then the draft's continuation after it)."""
    copy: CopyTrace | None = None
    """The copy drafter's chains along the same outputs (recorded with ``--copy``); ``metadata["copy_draft"]``
    holds its settings."""
    lookup: CopyTrace | None = None
    """transformers' prompt lookup's chains along the same outputs (recorded with the copy drafter's; its
    ``num_tokens`` is K), for replaying that baseline: :meth:`with_lookup_as_copy`."""
    metadata: dict = field(default_factory=dict)

    @property
    def sampled(self) -> bool:
        """True for T > 0 traces (acceptances are drawn in replay, exact in distribution)."""
        return self.accept_prob is not None

    @property
    def has_margins(self) -> bool:
        """True when every recorded step (the model draft's, the copy drafter's, the rejecting rounds') holds its
        margin: traces of format 3 or later."""
        arrays = [self.features, self.reject_features, *(c.features for c in (self.copy, self.lookup) if c is not None)]
        return all(holds_margins(a) for a in arrays if a is not None)

    @property
    def depth(self) -> int:
        """K: how many draft steps were recorded per position."""
        return int(self.features.shape[1])

    @property
    def max_new_tokens(self) -> int:
        """The token budget each generation had when recorded."""
        return int(self.metadata["max_new_tokens"])

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def with_lookup_as_copy(self) -> TraceSet:
        """These traces with prompt lookup's chains in the copy drafter's place: replaying the ``copy`` source
        on them replays transformers' prompt lookup beside the model draft."""
        if self.lookup is None:
            raise ValueError("these traces hold no prompt-lookup chains: record them with adaptive record --copy")
        return replace(self, copy=self.lookup, lookup=None)

    def output(self, i: int) -> np.ndarray:
        """y of prompt ``i``."""
        return self.outputs[self.offsets[i] : self.offsets[i + 1]]

    @classmethod
    def join(cls, parts: list[TraceSet]) -> TraceSet:
        """Trace sets of consecutive prompt shards, recorded alike, as one: the first part's metadata, with the
        repaired outputs of every part counted (what recording all prompts in one process gives)."""
        if not parts:
            raise ValueError("nothing to join")

        def cat(name: str):
            arrays = [getattr(part, name) for part in parts]
            return None if arrays[0] is None else np.concatenate(arrays)

        def chains(name: str) -> CopyTrace | None:
            found = [getattr(part, name) for part in parts]
            return None if found[0] is None else CopyTrace.concatenate(found)

        lengths = np.concatenate([np.diff(part.offsets) for part in parts])
        metadata = dict(parts[0].metadata)
        if "repaired_outputs" in metadata:
            metadata["repaired_outputs"] = sum(int(part.metadata["repaired_outputs"]) for part in parts)
        return cls(
            prompt_ids=[i for part in parts for i in part.prompt_ids],
            langs=[lang for part in parts for lang in part.langs],
            prompt_lengths=cat("prompt_lengths"),
            offsets=np.concatenate([[0], np.cumsum(lengths)]),
            outputs=cat("outputs"),
            match=cat("match"),
            features=cat("features"),
            accept_prob=cat("accept_prob"),
            reject_features=cat("reject_features"),
            copy=chains("copy"),
            lookup=chains("lookup"),
            metadata=metadata,
        )

    def save(self, path: str | Path) -> None:
        arrays = {"match": self.match.astype(np.int16), "features": self.features.astype(np.float16)}
        if self.accept_prob is not None:
            arrays["accept_prob"] = self.accept_prob.astype(np.float32)
            arrays["reject_features"] = self.reject_features.astype(np.float16)
        for prefix, chains in (("copy", self.copy), ("lookup", self.lookup)):
            if chains is not None:
                arrays.update(
                    {f"{prefix}_{name}": array.astype(np.float16 if name.endswith("features") else np.int16) for name, array in chains.arrays().items()}
                )
        write_npz(path, self, arrays, TRACE_FORMAT)

    @classmethod
    def load(cls, path: str | Path) -> TraceSet:
        """Read a trace file (never unpickles)."""
        common, metadata, data = read_trace_file(path, READABLE_FORMATS, ("match", "features"))
        sampled = "accept_prob" in data
        if sampled and metadata["format"] != TRACE_FORMAT:
            raise ValueError(
                f"{path} holds sampled traces of {metadata['format']}, whose replay was an approximation; "
                "re-record them (adaptive record --temperature T) for exact sampled replay"
            )
        if len(data["match"]) != len(common["outputs"]) or len(data["features"]) != len(common["outputs"]):
            raise UnreadableFile(f"{path}: 'match' and 'features' must have one row per output token ({len(common['outputs'])}): damaged?")
        return cls(
            **common,
            match=data["match"].astype(np.int64),
            features=with_margins(data["features"].astype(np.float32)),
            accept_prob=data["accept_prob"].astype(np.float32) if sampled else None,
            reject_features=with_margins(data["reject_features"].astype(np.float32)) if sampled else None,
            copy=_chains(data, "copy"),
            lookup=_chains(data, "lookup"),
            metadata=metadata,
        )


def _chains(data: dict[str, np.ndarray], prefix: str) -> CopyTrace | None:
    """A model-free drafter's chains stored under ``prefix`` in a trace file's arrays (None when absent)."""
    if f"{prefix}_match" not in data:
        return None
    names = [name for name in (*CopyTrace.ARRAYS, *CopyTrace.AFTER) if f"{prefix}_{name}" in data]
    arrays = {name: data[f"{prefix}_{name}"].astype(np.float32 if name.endswith("features") else np.int64) for name in names}
    return CopyTrace(**{**arrays, **{name: with_margins(arrays[name]) for name in ("features", "after_features") if name in arrays}})
