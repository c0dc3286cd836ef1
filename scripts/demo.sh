#!/usr/bin/env bash
# The main job: installs what is missing, builds, then trains the tiny GPT-2 on the embedded corpus
# as ddp and as zero3 on 4 ranks, side by side, each ending with its memory report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
source scripts/mpi-env.sh
for strategy in ddp zero3; do
  echo "=== mpirun -np 4 zshard-train --strategy $strategy ==="
  "${MPIRUN[@]}" -np 4 build/zshard-train --model tiny --strategy "$strategy" --steps "${STEPS:-300}" \
    --log-every 50 --mem-report "build/mem-$strategy.json"
done
