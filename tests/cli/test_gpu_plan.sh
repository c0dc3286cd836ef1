# shellcheck shell=bash
# The one-call plan for a lent GPU (scripts/gpu-acceptance.sh), tested where there is no GPU: its dry run
# lists every step in order with its time limit, reports each GPU step SKIP, round-trips a synthetic build
# through the archive code, writes the summary and results files the device tool returns (at most 8
# files), and exits 0; nothing is built. Its usage errors exit 2.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
PLAN="$ZSHARD_SRC/scripts/gpu-acceptance.sh"
STEPS=(setup build cuda-ops nccl tiny mpi memcheck gpt2 llama torch-peer profile async-save)

start=$SECONDS
OUT="$WORK/out-dir" expect_ok "dry run" bash "$PLAN" --dry-run
cp "$WORK/out" "$WORK/plan"
expect_true "the dry run takes seconds (it builds and runs nothing heavy)" test $((SECONDS - start)) -lt 60
expect_true "every step, in order, with its time limit" python3 - "$WORK/plan" "${STEPS[@]}" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
want = sys.argv[2:]
got = re.findall(r"^---- (\S+) \(limit (\d+)s\): \S", text, re.M)
assert [n for n, _ in got] == want, got
assert all(0 < int(limit) <= 570 for _, limit in got), got
verdicts = re.findall(r"^(\S+)\s+(PASS|FAIL|SKIP)\s+\d+s", text, re.M)
assert [n for n, _ in verdicts][:len(want)] == want, verdicts
assert all(v == "SKIP" for _, v in verdicts), verdicts
assert "archive round trip of a synthetic build in" in text and "parts: ok" in text, text
PY
expect_true "results.json lists the steps, each SKIP with a note" python3 - "$WORK/out-dir/results.json" "${STEPS[@]}" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["mode"] == "dry" and doc["budget_s"] == 570, doc
assert [s["step"] for s in doc["steps"]] == sys.argv[2:], doc
assert all(s["status"] == "SKIP" and s["note"] for s in doc["steps"]), doc
PY
expect_true "what comes back: summary, results, logs, at most 8 files" \
  test "$(ls "$WORK/out-dir" | sort | tr '\n' ' ')" = "logs.tar.gz results.json summary.txt "
expect_true "the summary has a line per step" test "$(grep -cE '^[a-z0-9-]+ +SKIP' "$WORK/out-dir/summary.txt")" = 12
expect_failure "unknown argument" 2 "usage: .*--dry-run" -- bash "$PLAN" --bogus
expect_failure "keep-build without a folder" nonzero "keep-build needs the reply's files_at folder" -- \
  bash "$PLAN" keep-build
expect_failure "pack of a folder that is no build" 1 "pack: .* is not a CMake build folder" -- \
  bash "$PLAN" pack "$WORK"
# CI's own build is of this tree; whether or not nvcc built its CUDA path, a build of another tree is
# refused first.
mkdir -p "$WORK/other" && sed 's|^CMAKE_HOME_DIRECTORY:INTERNAL=.*|CMAKE_HOME_DIRECTORY:INTERNAL=/nonexistent|' \
  "$ZSHARD_BIN/CMakeCache.txt" >"$WORK/other/CMakeCache.txt"
expect_failure "pack of another tree's build" 1 "pack: .* is a build of another source tree" -- \
  bash "$PLAN" pack "$WORK/other"
finish
