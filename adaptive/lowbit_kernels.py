"""The low-bit products of the lean engines on CPUs with AVX512-BF16: each weight read once for up to 8 rows.

torch's CPU kernels for weight-only int4 (``_weight_int4pack_mm_for_cpu``) and int8 (``_weight_int8pack_mm``) work
in blocks of a few rows: verifying 5 tokens reads every int4 weight twice, and the int8 output head of the default
target (49,152 × 576) costs 2.1 ms for one row and 6.0 ms for eight. ``kernels/lowbit_matmul.cpp`` widens the
weights to bf16 numbers (int4: two nibbles with three vector instructions; int8: through float32, exactly) and
multiplies them with ``vdpbf16ps`` (32 products per instruction) in blocks of 8 rows, each row computed alone in the
same order whatever the block, so plain decoding and verification agree bit for bit.

It is built at first use with ``torch.utils.cpp_extension`` into ``$ADAPTIVE_CACHE/extensions``, once per torch installation (about 30 s;
``scripts/setup.sh`` builds it) where the CPU has AVX512-BF16 and a C++ compiler exists; elsewhere the low-bit
engines keep torch's kernels, and :func:`adaptive.engines.resolve_engine` says which ones run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from adaptive.models import cache_root

SOURCE = Path(__file__).parent / "kernels" / "lowbit_matmul.cpp"
TILE = 16
"""Output columns per packed tile."""
GROUP = 32
"""Inputs per group (Q4_1's block)."""


def obstacle() -> str | None:
    """Why the kernels cannot run here, or None."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "no /proc/cpuinfo to read the CPU's features from"
    if "avx512_bf16" not in flags:
        return "the CPU has no AVX512-BF16"
    return None


@functools.cache
def available() -> bool:
    """Build (once per torch installation: :func:`build_folder`) and load the kernels where they can run; True when
    ``torch.ops.adaptive`` has them."""
    if obstacle() is not None:
        return False
    folder = build_folder()
    folder.mkdir(parents=True, exist_ok=True)
    print(f"low-bit kernels: loading (built once into {folder}, about 30 s the first time)", file=sys.stderr, flush=True)
    try:
        load(
            "adaptive_lowbit_matmul",
            [str(stable_source(folder))],
            extra_cflags=["-O3", "-march=native"],
            build_directory=str(folder),
            is_python_module=False,
            verbose=bool(os.environ.get("ADAPTIVE_VERBOSE_BUILD")),
        )
    except (RuntimeError, OSError, ImportError) as error:  # no compiler, or a build error: torch's kernels stay
        print(f"low-bit kernels: not built ({error}); torch's kernels run instead", file=sys.stderr, flush=True)
        return False
    torch.library.register_fake("adaptive::int4_matmul")(_fake_int4)
    torch.library.register_fake("adaptive::int8_matmul")(_fake_int8)
    return True


def build_folder() -> Path:
    """``$ADAPTIVE_CACHE/extensions/<torch>``: one build per torch installation (its headers and libraries are in the
    build's command line, so two environments sharing a folder would rebuild each other's)."""
    digest = hashlib.sha256(f"{torch.__version__} {Path(torch.__file__).parent}".encode()).hexdigest()[:12]
    return cache_root() / "extensions" / f"torch-{digest}"


def stable_source(folder: Path) -> Path:
    """The kernels' source copied into ``folder`` (replaced only when its text changes): torch rebuilds whenever the
    source's path differs, and every checkout of the package has its own."""
    copy = folder / SOURCE.name
    text = SOURCE.read_bytes()
    if not copy.exists() or copy.read_bytes() != text:
        staged = folder / f"{SOURCE.name}.{os.getpid()}"
        staged.write_bytes(text)
        staged.replace(copy)  # atomic: a process building at the same time reads one whole file or the other
    return copy


def fits(rows: int, columns: int) -> bool:
    """Whether a matrix of ``rows`` outputs and ``columns`` inputs packs for the kernels."""
    return rows % TILE == 0 and columns % GROUP == 0


def _fake_int4(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], packed.shape[0] * TILE)


def _fake_int8(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], packed.shape[0] * TILE)


def _check(rows: int, columns: int) -> tuple[int, int]:
    if not fits(rows, columns):
        raise ValueError(f"the low-bit kernels need outputs in multiples of {TILE} and inputs in multiples of {GROUP}, got {rows} x {columns}")
    return rows // TILE, columns // GROUP


def pack_int4(levels: torch.Tensor, step: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``adaptive::int4_matmul``'s operand for weights ``(levels - 8) * step + offset`` (levels ``[N, K]`` in 0..15;
    step and offset ``[N, K/32]``, rounded to bf16): ``[N/16, K/32, 320]`` bytes, per tile of 16 columns and group of
    32 inputs the 256 bytes of nibbles the kernel's comment lays out, then the 16 steps and the 16 offsets in bf16."""
    tiles, groups = _check(*levels.shape)
    per_group = levels.to(torch.uint8).view(tiles, TILE, groups, GROUP).permute(0, 2, 1, 3)  # [tiles, groups, column, input]
    low, high = (half.reshape(tiles, groups, TILE, 8, 2).permute(0, 1, 3, 2, 4).reshape(tiles, groups, 8 * 2 * TILE) for half in per_group.split(16, -1))

    def tiled(values: torch.Tensor) -> torch.Tensor:
        return values.to(torch.bfloat16).view(tiles, TILE, groups).permute(0, 2, 1).contiguous().view(torch.uint8)

    return torch.cat((low | (high << 4), tiled(step), tiled(offset)), dim=-1).contiguous()


def pack_int8(weights: torch.Tensor) -> torch.Tensor:
    """``adaptive::int8_matmul``'s operand for int8 weights ``[N, K]``: ``[N/16, K/32, 512]``, per tile of 16 columns
    and group of 32 inputs 16 chunks of 32 bytes, byte b of chunk p holding column b / 2 at input 2p + b % 2."""
    tiles, groups = _check(*weights.shape)
    per_group = weights.view(tiles, TILE, groups, 16, 2).permute(0, 2, 3, 1, 4)  # [tiles, groups, pair, column, input]
    return per_group.reshape(tiles, groups, 16 * TILE * 2).contiguous()
