#!/usr/bin/env bash
# Configures and builds zshard into ./build (the CUDA path too when nvcc is found), with Ninja when it is
# installed and the build tree is new (an existing tree keeps the generator it was made with).
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
if [ ! -f build/CMakeCache.txt ] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release ${ZSHARD_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"
