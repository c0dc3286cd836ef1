#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (unit, MPI and command-line tests).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
source scripts/mpi-env.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 900
