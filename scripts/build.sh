#!/usr/bin/env bash
# Configures and builds zshard into ./build (the CUDA path too when nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${ZSHARD_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"
