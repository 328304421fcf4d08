"""A pair's batched cost profile: how long a batched round takes at each batch size, and what the cost model
makes of it (measured by :func:`adaptive.profiling.profile_batches`, ``adaptive profile --batches``).

At batch size B a round drafting γ tokens per request costs γ draft forwards of B rows, ``draft(B)``, plus
one target forward of γ + 1 tokens per row, ``target(B, γ + 1)``; plain batched decoding is ``target(B, 1)``
per token. With per-token acceptance α each request emits E(α, γ) = (1 − α^(γ+1)) / (1 − α) tokens per round,
so the batch's throughput is B · E(α, γ) / round(B, γ), round(B, γ) = γ · draft(B) + target(B, γ + 1), and its
gain over plain batched decoding E(α, γ) · round(B, 0) / round(B, γ). Profiles that also timed whole decoder
rounds (``rounds``: the forwards plus the decoder's per-request work: sampling, acceptance, rollback,
emission) use those round times instead of the sum of the forwards. Between measured batch sizes times
are interpolated linearly; outside them the profile refuses, naming the range.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

from adaptive.costmodel import expected_tokens
from adaptive.files import UnreadableFile, read_json

FORMAT = "adaptive-draft/batch-profile/1"


@dataclass(frozen=True)
class BatchCostProfile:
    """Median batched forward times of a pair (ms) per batch size."""

    batch_sizes: tuple[int, ...]
    target_ms: tuple[tuple[float, ...], ...]
    """target_ms[i][n - 1]: a target forward of n tokens per row at batch_sizes[i]."""
    draft_ms: tuple[float, ...]
    """A draft forward of one token per row at batch_sizes[i]."""
    rounds_ms: tuple[tuple[float, ...], ...] | None
    """rounds_ms[i][d]: a whole decoder round drafting d tokens per request at batch_sizes[i] (None: not timed)."""
    context: int
    hardware: dict
    document: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, document: dict, source: str = "batch profile") -> BatchCostProfile:
        if document.get("format") != FORMAT:
            raise ValueError(f"{source} is not a batched cost profile of format {FORMAT} (written by adaptive profile --batches)")
        sizes = tuple(int(b) for b in document["batch_sizes"])
        target = tuple(tuple(v["median_ms"] for _, v in sorted(document["target"][str(b)].items(), key=lambda kv: int(kv[0]))) for b in sizes)
        draft = tuple(document["draft"][str(b)]["median_ms"] for b in sizes)
        rounds = None
        if "rounds" in document:
            rounds = tuple(tuple(v["median_ms"] for _, v in sorted(document["rounds"][str(b)].items(), key=lambda kv: int(kv[0]))) for b in sizes)
        return cls(sizes, target, draft, rounds, int(document["context"]), document.get("hardware", {}), document)

    @classmethod
    def load(cls, path: str | Path) -> BatchCostProfile:
        try:
            return cls.from_dict(read_json(path, "batched cost profile"), str(path))
        except (KeyError, TypeError, IndexError) as error:
            raise UnreadableFile(f"batched cost profile {path} is malformed ({type(error).__name__}: {error}); write it again with adaptive profile") from None

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.document, indent=1))

    @property
    def max_depth(self) -> int:
        """The deepest round the profile can time (its target forwards go up to max_depth + 1 tokens)."""
        return len(self.target_ms[0]) - 1 if self.rounds_ms is None else len(self.rounds_ms[0]) - 1

    def _interpolate(self, values: list[float], batch: int) -> float:
        if not self.batch_sizes[0] <= batch <= self.batch_sizes[-1]:
            raise ValueError(f"batch size {batch} lies outside the measured {self.batch_sizes[0]}..{self.batch_sizes[-1]}; profile more batch sizes")
        i = bisect_left(self.batch_sizes, batch)
        if self.batch_sizes[i] == batch:
            return values[i]
        low, high = self.batch_sizes[i - 1], self.batch_sizes[i]
        return values[i - 1] + (values[i] - values[i - 1]) * (batch - low) / (high - low)

    def target(self, batch: int, tokens: int) -> float:
        """ms of a target forward of ``tokens`` per row at ``batch`` rows."""
        if not 1 <= tokens <= self.max_depth + 1:
            raise ValueError(f"the profile times target forwards of 1..{self.max_depth + 1} tokens per row, got {tokens}")
        return self._interpolate([row[tokens - 1] for row in self.target_ms], batch)

    def draft(self, batch: int) -> float:
        """ms of a draft forward of one token per row at ``batch`` rows."""
        return self._interpolate(list(self.draft_ms), batch)

    def round_ms(self, batch: int, depth: int) -> float:
        """A round drafting ``depth`` tokens per request (0: a plain batched step): timed whole where the
        profile holds rounds, else its draft and target forwards."""
        if self.rounds_ms is None:
            return depth * self.draft(batch) + self.target(batch, depth + 1)
        if not 0 <= depth <= self.max_depth:
            raise ValueError(f"the profile times rounds of 0..{self.max_depth} drafted tokens, got {depth}")
        return self._interpolate([row[depth] for row in self.rounds_ms], batch)

    def gain(self, batch: int, depth: int, alpha: float) -> float:
        """Modelled throughput of ``depth`` over plain batched decoding at ``batch`` rows and acceptance α."""
        return expected_tokens(alpha, depth) * self.round_ms(batch, 0) / self.round_ms(batch, depth)

    def best_depth(self, batch: int, alpha: float, max_depth: int | None = None) -> int:
        """The depth 0..max_depth of the highest modelled throughput (0 when speculation does not pay)."""
        deepest = self.max_depth if max_depth is None else min(max_depth, self.max_depth)
        return max(range(deepest + 1), key=lambda depth: (self.gain(batch, depth, alpha), -depth))
