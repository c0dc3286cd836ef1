# shellcheck shell=bash
# The one-call plan for a GPU machine (scripts/gpu-acceptance.sh), tested where there is no GPU: its dry run
# lists every step in order with its time limit within the budget, reports each GPU step SKIP, round-trips
# a synthetic build through the archive code, lists where setup looks for the CUDA libraries, the tiny
# step's runs and comparisons, which it runs on this build with cpu in place of cuda, and the gpt2 step's
# runs (fused attention the base, blocks a switch), writes the summary and results files the device tool
# returns (at most 8 files), and exits 0; nothing is built. `prepare` refuses a build archive of other
# sources than the tree that is sent. Its usage errors exit 2.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
PLAN="$ZSHARD_SRC/scripts/gpu-acceptance.sh"
STEPS=(setup build cuda-ops tiny memcheck gpt2 torch-peer nccl profile mpi llama)

start=$SECONDS
OUT="$WORK/out-dir" ZSHARD_GPU_DRY_BUILD="$ZSHARD_BIN" expect_ok "dry run" bash "$PLAN" --dry-run
cp "$WORK/out" "$WORK/plan"
expect_true "the dry run takes seconds (it builds and runs nothing heavy)" test $((SECONDS - start)) -lt 60
expect_true "every step, in order, with its time limit" python3 - "$WORK/plan" "${STEPS[@]}" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
want = sys.argv[2:]
got = re.findall(r"^---- (\S+) \(limit (\d+)s\): \S", text, re.M)
assert [n for n, _ in got] == want, got
assert all(0 < int(limit) <= 400 for _, limit in got), got
verdicts = re.findall(r"^(\S+)\s+(PASS|FAIL|SKIP)\s+\d+s", text, re.M)
assert [n for n, _ in verdicts][:len(want)] == want, verdicts
assert all(v == "SKIP" for _, v in verdicts), verdicts
assert "archive round trip of a synthetic build in" in text and "parts: ok" in text, text
PY
expect_true "the limits add up to what the dry run, the script's header and docs/cuda.md say; the steps up to gpt2 (the build aside) get their whole limits within the budget" \
  python3 - "$WORK/plan" "$PLAN" "$ZSHARD_SRC/docs/cuda.md" <<'PY'
import re, sys
text, header, doc = (open(p).read() for p in sys.argv[1:])
doc = " ".join(doc.split())  # however its lines are filled
limits = {n: int(l) for n, l in re.findall(r"^---- (\S+) \(limit (\d+)s\)", text, re.M)}
total = sum(limits.values())
assert f"the limits add up to {total}s, the budget is 400s" in text, (total, text)
assert f"limits add up to {total - limits['build']} s, {total} s with the build's" in header, total
assert f"add up to {total - limits['build']} s ({total} s with the build's)" in doc, total
first = ["setup", "cuda-ops", "tiny", "memcheck", "gpt2"]
assert sum(limits[n] for n in first) <= 400 - 15, limits
PY
expect_true "setup lists where it looks for the CUDA libraries: the toolkit's, then PyTorch's nvidia/*/lib" \
  grep -qE "^  CUDA libraries searched in: ${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}/lib64 .*/nvidia/\*/lib" "$WORK/plan"
expect_true "tiny lists its runs: the optimizer offloaded, checkpointed blocks, saves resumed on the other device" \
  python3 - "$WORK/plan" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
runs = dict(re.findall(r"^  train (\S+): \$BUILD/zshard-train --model tiny (.*)$", text, re.M))
for d in ("fp32", "bf16"):
    assert f"--device cuda --param-dtype {d} --offload optimizer" in runs[f"gpu-offload-{d}"], runs
    assert f"--device cuda --param-dtype {d} --activation-checkpointing blocks" in runs[f"gpu-recompute-{d}"], runs
assert "--device cuda --param-dtype fp32 --save-dir $LOGS/save-gpu --save-every 10" in runs["gpu-fp32"], runs
assert "--device cpu --param-dtype fp32 --save-dir $LOGS/save-cpu --save-every 10" in runs["cpu-fp32"], runs
assert "--device cpu --param-dtype fp32 --resume $LOGS/save-gpu/step-00000010" in runs["resumed-on-cpu"], runs
assert "--device cuda --param-dtype fp32 --resume $LOGS/save-cpu/step-00000010" in runs["resumed-on-gpu"], runs
compares = dict(re.findall(r"^  compare ([^:]+): python3 scripts/gpu_compare.py (.*)$", text, re.M))
assert compares["offloaded fp32 vs cpu"].startswith("losses $LOGS/tiny_gpu-offload-fp32.jsonl $LOGS/tiny_cpu-fp32.jsonl"), compares
assert compares["checkpointed fp32 vs not"].startswith("losses $LOGS/tiny_gpu-recompute-fp32.jsonl $LOGS/tiny_gpu-fp32.jsonl"), compares
assert compares["saved on cuda, resumed on cpu"] == "resumed $LOGS/tiny_resumed-on-cpu.jsonl $LOGS/tiny_cpu-fp32.jsonl 1e-4", compares
assert compares["saved on cpu, resumed on cuda"] == "resumed $LOGS/tiny_resumed-on-gpu.jsonl $LOGS/tiny_gpu-fp32.jsonl 1e-4", compares
PY
expect_true "gpt2 lists its runs at batch 8: fused attention the base, blocks attention a switch measured against it" \
  python3 - "$WORK/plan" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
runs = re.findall(r"^  \$BUILD/zshard-bench --model gpt2 .*--batch 8 .*--json \$LOGS/(\S+) (.*)$", text, re.M)
flags = dict(runs)
assert flags["gpt2_b8.json"] == "--attention fused", runs
assert flags["gpt2_b8_attention=blocks.json"] == "--attention blocks", runs
assert flags["gpt2_b8_offload=optimizer.json"] == "--attention fused --offload optimizer", runs
PY
expect_true "tiny's runs and comparisons, run on this build with cpu for cuda, all pass" python3 - "$WORK/out-dir/results.json" "$WORK/plan" <<'PY'
import json, re, sys
note = next(s["note"] for s in json.load(open(sys.argv[1]))["steps"] if s["step"] == "tiny")
listed = re.findall(r"^  compare ([^:]+):", open(sys.argv[2]).read(), re.M)
assert "with cpu for cuda, on this machine:" in note and "FAIL" not in note and "failed" not in note, note
assert [w for w in listed if f"{w}: 0.0e+00 (tol " in note] == listed, (listed, note)
PY
expect_true "results.json lists the steps, each SKIP with a note" python3 - "$WORK/out-dir/results.json" "${STEPS[@]}" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["mode"] == "dry" and doc["budget_s"] == 400, doc
assert [s["step"] for s in doc["steps"]] == sys.argv[2:], doc
assert all(s["status"] == "SKIP" and s["note"] for s in doc["steps"]), doc
PY
expect_true "what comes back: summary, results, logs, at most 8 files" \
  test "$(ls "$WORK/out-dir" | sort | tr '\n' ' ')" = "logs.tar.gz results.json summary.txt "
expect_true "the summary has a line per step" test "$(grep -cE '^[a-z0-9-]+ +SKIP' "$WORK/out-dir/summary.txt")" = 11
OUT="$WORK/out-named" ZSHARD_GPU_STEPS=async-save expect_ok "a dry run naming async-save" bash "$PLAN" --dry-run
expect_true "async-save is in the plan only when named, last" \
  test "$(grep -oE '^---- \S+' "$WORK/out" | tail -1)" = "---- async-save"
OUT="$WORK/out-host" ZSHARD_GPU_STEPS=finetune-host expect_ok "a dry run naming finetune-host" bash "$PLAN" --dry-run
expect_true "finetune-host is in the plan only when named, last, the others left out" \
  python3 - "$WORK/out" "$WORK/plan" <<'PY'
import re, sys
named, plain = (open(p).read() for p in sys.argv[1:])
assert re.findall(r"^---- (\S+)", named, re.M)[-1] == "finetune-host", named
assert "finetune-host" not in re.findall(r"^---- (\S+)", plain, re.M), plain
assert re.search(r"^tiny\s+OMIT", named, re.M), named
PY
expect_failure "unknown argument" 2 "usage: .*--dry-run" -- bash "$PLAN" --bogus
expect_failure "a budget that is no number" 2 "ZSHARD_GPU_BUDGET_S: not a whole number of seconds: 7m" -- \
  env ZSHARD_GPU_BUDGET_S=7m bash "$PLAN" --dry-run
expect_failure "a dry-run build without zshard-train" 2 "ZSHARD_GPU_DRY_BUILD: no zshard-train in $WORK" -- \
  env ZSHARD_GPU_DRY_BUILD="$WORK" bash "$PLAN" --dry-run
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

# prepare, on a small git tree with the plan's scripts: the build archive in .gpubuild must be keyed by
# the files a call sends, as the GPU machine, which has no .git, computes the key.
tree=$WORK/tree
mkdir -p "$tree/scripts" "$tree/kernels" "$tree/tests/unit" "$tree/.gpudeps"
cp "$ZSHARD_SRC"/scripts/gpu-acceptance.sh "$ZSHARD_SRC"/scripts/gpu-archive.sh "$tree/scripts/"
echo "project(x)" >"$tree/CMakeLists.txt"
echo "int f();" >"$tree/kernels/f.cpp"
printf '*.orig\n/.gpudeps/\n/.gpubuild/\n' >"$tree/.gitignore"
touch "$tree/.gpudeps/MANIFEST"
git -C "$tree" init -q && git -C "$tree" add -A
archive() {  # KEY: a build archive of the sources KEY in the tree's .gpubuild
  rm -rf "$tree/.gpubuild" && mkdir -p "$tree/.gpubuild" && echo "$1" >"$WORK/SOURCE_KEY"
  tar -C "$WORK" -czf "$tree/.gpubuild/build-gpu.tar.gz.00" SOURCE_KEY
}
archive 0000000000000000
expect_failure "prepare refuses an archive of other sources" 1 \
  "prepare: .gpubuild is a build of other sources \(0000000000000000\) than this tree's \([0-9a-f]{16}\)" -- \
  bash "$tree/scripts/gpu-acceptance.sh" prepare
key=$(grep -oE "this tree's \([0-9a-f]{16}\)" "$WORK/err" | tr -dc '0-9a-f' | tail -c 16)
archive "$key"
echo "int g();" >"$tree/kernels/f.cpp.orig"  # ignored: not sent, not hashed
ZSHARD_GPU_BUDGET_S=200 ZSHARD_GPU_STEPS="nccl mpi" expect_ok "prepare takes an archive of the tree's sources" \
  bash "$tree/scripts/gpu-acceptance.sh" prepare
expect_true "prepare prints the call with its budget, steps and a time-out just above the budget" grep -qxF \
  "run(command=\"ZSHARD_GPU_BUDGET_S=200 ZSHARD_GPU_STEPS='nccl mpi' bash scripts/gpu-acceptance.sh\", carry=[\".gpudeps\", \".gpubuild\"], timeout_s=250)" \
  "$WORK/out"
expect_failure "prepare refuses a budget that does not fit a command" 2 \
  "prepare: ZSHARD_GPU_BUDGET_S=560 does not fit a command's 600 s with 50 s to spare" -- \
  env ZSHARD_GPU_BUDGET_S=560 bash "$tree/scripts/gpu-acceptance.sh" prepare
# The tree as a call sends it (no .git, no ignored file) has the same key.
mkdir -p "$WORK/sent" && git -C "$tree" ls-files -z --cached --others --exclude-standard |
  tar -C "$tree" --null -T - -cf - | tar -C "$WORK/sent" -xf -
cp -r "$tree/.gpudeps" "$tree/.gpubuild" "$WORK/sent/"
expect_ok "the sent tree, without .git, has the same key" bash "$WORK/sent/scripts/gpu-acceptance.sh" prepare
echo "int h();" >>"$tree/kernels/f.cpp"
expect_failure "prepare refuses the archive once a source changed" 1 "prepare: .gpubuild is a build of other sources" -- \
  bash "$tree/scripts/gpu-acceptance.sh" prepare
finish
