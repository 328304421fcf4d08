"""The target's features of every head-training sequence, kept on local disk (never committed).

Training a head needs, for each sequence, the target's three aux hidden states ``[T, 3H]`` and its final
(normed) hidden state ``[T, H]``, from which the distribution over the draft vocabulary follows by one small
matmul. Computing them is a teacher-forced target forward, a third of a training step on this CPU; after the
first epoch they are read from here instead. The cache fills as training first meets each sequence.

Layout: per data shard, ``NAME.aux`` and ``NAME.final`` (raw memmaps of the states' bits, rows of every
sequence one after another, cut to ``max_length``), ``NAME.filled.npy`` (which sequences are in, written after
their rows are flushed, so a killed run only recomputes) and ``NAME.json`` (the shard's size and row
layout; a shard that changed is cached anew). A cache folder serves one target, dtype, layer set and
``max_length``: :func:`cache_folder` names it by all four.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

STORAGE = {torch.bfloat16: np.int16, torch.float16: np.int16, torch.float32: np.int32}
"""How each dtype's bits are stored (numpy has no bfloat16)."""


def cache_folder(root: Path, data: Path, dtype: torch.dtype, layer_ids, max_length: int) -> Path:
    """The cache folder of one data folder, target dtype, layer set and sequence cut."""
    layers = "-".join(str(i) for i in layer_ids)
    return Path(root) / f"{Path(data).name}-{str(dtype).removeprefix('torch.')}-layers{layers}-cut{max_length}"


class _Shard:
    """The memmaps of one data shard's sequences."""

    def __init__(self, folder: Path, name: str, size: int, lengths: list[int], widths: tuple[int, int], dtype: torch.dtype, writable: bool = True) -> None:
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.dtype, self.storage, self.writable = dtype, STORAGE[dtype], writable
        layout = {"shard_bytes": size, "lengths": lengths, "widths": list(widths), "dtype": str(dtype)}
        meta, self.filled_path = folder / f"{name}.json", folder / f"{name}.filled.npy"
        fresh = not meta.is_file() or json.loads(meta.read_text()) != layout
        self.filled = np.zeros(len(lengths), dtype=bool)
        if fresh and not writable:  # nothing usable cached for this shard yet
            return
        mode = "w+" if fresh else "r+" if writable else "r"
        total = max(1, int(self.offsets[-1]))
        self.aux = np.memmap(folder / f"{name}.aux", dtype=self.storage, mode=mode, shape=(total, widths[0]))
        self.final = np.memmap(folder / f"{name}.final", dtype=self.storage, mode=mode, shape=(total, widths[1]))
        if fresh:
            meta.write_text(json.dumps(layout))
            np.save(self.filled_path, self.filled)
        else:
            self.filled = np.load(self.filled_path, allow_pickle=False)

    def rows(self, row: int) -> slice:
        return slice(int(self.offsets[row]), int(self.offsets[row + 1]))

    def read(self, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.rows(row)
        return (torch.from_numpy(np.array(self.aux[rows])).view(self.dtype), torch.from_numpy(np.array(self.final[rows])).view(self.dtype))

    def write(self, row: int, aux: torch.Tensor, final: torch.Tensor) -> None:
        rows = self.rows(row)
        self.aux[rows] = aux.to(self.dtype).contiguous().view(getattr(torch, np.dtype(self.storage).name)).numpy()
        self.final[rows] = final.to(self.dtype).contiguous().view(getattr(torch, np.dtype(self.storage).name)).numpy()
        self.filled[row] = True

    def flush(self) -> None:
        if not self.writable:  # another process fills this cache: see what it has made durable since
            if self.filled_path.is_file() and hasattr(self, "aux"):
                self.filled = np.load(self.filled_path, allow_pickle=False)
            return
        self.aux.flush()
        self.final.flush()
        np.save(self.filled_path, self.filled)


class FeatureCache:
    """Aux and final hidden states of training sequences, by (shard, row), filled on first use.

    Args:
        folder: the cache folder (see :func:`cache_folder`).
        data: the folder of the data shards (their sizes detect a changed shard).
        lengths: per shard name, each row's token count after the cut.
        widths: (3H, H).
        writable: False to read what another process (one training) fills and never write: two trainings
            can then share one cache; :meth:`flush` re-reads which sequences it has made durable.
    """

    def __init__(self, folder: Path, data: Path, lengths: dict[str, list[int]], widths: tuple[int, int], dtype: torch.dtype, writable: bool = True) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.writable = writable
        self.shards = {name: _Shard(folder, name, (Path(data) / name).stat().st_size, rows, widths, dtype, writable) for name, rows in lengths.items()}

    def has(self, shard: str, row: int) -> bool:
        return bool(self.shards[shard].filled[row])

    def read(self, keys: list[tuple[str, int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded (with zeros) aux ``[B, width, 3H]`` and final ``[B, width, H]`` states of cached sequences."""
        pairs = [self.shards[shard].read(row) for shard, row in keys]
        pad = [(torch.nn.functional.pad(a, (0, 0, 0, width - len(a))), torch.nn.functional.pad(f, (0, 0, 0, width - len(f)))) for a, f in pairs]
        return torch.stack([a for a, _ in pad]), torch.stack([f for _, f in pad])

    def write(self, keys: list[tuple[str, int]], aux: torch.Tensor, final: torch.Tensor) -> None:
        """Store each sequence's states (``[B, T, ·]``, right-padded; each row keeps its own length); a read-only cache stores nothing."""
        if not self.writable:
            return
        for index, (shard, row) in enumerate(keys):
            length = self.shards[shard].rows(row).stop - self.shards[shard].rows(row).start
            self.shards[shard].write(row, aux[index, :length], final[index, :length])

    def flush(self) -> None:
        """Make every write durable, then mark the written sequences filled (read-only: re-read the marks)."""
        for shard in self.shards.values():
            shard.flush()

    def filled_share(self) -> float:
        total = sum(len(s.filled) for s in self.shards.values())
        return sum(int(s.filled.sum()) for s in self.shards.values()) / max(1, total)
