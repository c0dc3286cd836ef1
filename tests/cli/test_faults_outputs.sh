# Faults around what a run reads and writes, and bad input to every tool:
# - a loss driven to NaN mid-run stops every rank before the optimizer step, and the newest checkpoint
#   holds only finite values; --lr inf and NaN weights in --init-from are refused;
# - every output flag of every tool, pointed at a read-only directory and at a full disk (small tmpfs
#   mounts, skipped with the reason where mounting is not allowed): one line, non-zero exit, no file left;
# - zshard-export onto its own checkpoint; a run that cannot fit, refused before it allocates;
# - tool flags that used to crash (SIGFPE), hang, overflow or be silently ignored.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
BIN="$ZSHARD_BIN"
RO="$WORK/ro" FULL="$WORK/full"
mkdir -p "$RO" "$FULL"
trap 'umount "$RO" "$FULL" "$WORK/tight" 2>/dev/null; rm -rf "$WORK"' EXIT

# expect_clean_failure NAME DIR REGEX -- COMMAND...: non-zero exit, stderr one line matching REGEX, and
# nothing in DIR but what was there before (a full disk keeps its filler).
expect_clean_failure() {
  local name=$1 dir=$2 regex=$3
  shift 4
  local before after
  before=$(ls -A "$dir")
  expect_failure "$name" nonzero "$regex" -- "$@"
  if [ "$(wc -l <"$WORK/err")" != 1 ]; then
    echo "FAIL $name: stderr has $(wc -l <"$WORK/err") lines, want 1"; failures=$((failures + 1)); fi
  after=$(ls -A "$dir")
  if [ "$before" != "$after" ]; then
    echo "FAIL $name: left behind: $(comm -13 <(echo "$before") <(echo "$after") | tr '\n' ' ')"
    failures=$((failures + 1))
  fi
}

# ---- non-finite values ----
expect_failure "--lr inf" 2 "^zshard-train: error: --lr must be a finite number in \[0, 1\], got inf$" -- "$TRAIN" --lr inf
expect_one_line "--lr inf" "--lr"
D="$WORK/nan"
for strategy in ddp zero3; do
  rm -rf "$D"
  ZSHARD_TEST_NAN_STEP=5 expect_every_rank_fails "loss driven to NaN at step 5 ($strategy)" 1 \
    "^zshard-train: error: step 5: non-finite loss \(loss nan, gradient norm nan\); stopped before the optimizer" \
    -- --strategy $strategy "${ARGS[@]}" --steps 10 --save-dir "$D" --save-every 2 --log-json "$WORK/nan.json"
  expect_true "the newest checkpoint is step 4's ($strategy)" test "$(ls "$D")" = "$(printf 'step-00000002\nstep-00000004')"
  expect_true "the log holds the four good steps ($strategy)" test "$(wc -l <"$WORK/nan.json")" = 4
  expect_true "every value of the newest checkpoint is finite ($strategy)" python3 -c "
import glob, json, math, struct, sys
for path in glob.glob('$D/step-00000004/rank-*.safetensors'):
    data = open(path, 'rb').read()
    n = struct.unpack('<Q', data[:8])[0]
    floats = struct.unpack('<%df' % ((len(data) - 8 - n) // 4), data[8 + n:])
    bad = [x for x in floats if not math.isfinite(x)]
    if bad: sys.exit(path + ': non-finite values')
"
done
"$TRAIN" "${ARGS[@]}" --steps 1 --save "$WORK/w.safetensors" >/dev/null
python3 -c "
import struct
data = bytearray(open('$WORK/w.safetensors', 'rb').read())
n = struct.unpack('<Q', data[:8])[0]
data[8 + n + 4 * 10:8 + n + 4 * 11] = struct.pack('<f', float('nan'))
open('$WORK/nan.safetensors', 'wb').write(data)
"
expect_failure "NaN in --init-from" 1 "nan.safetensors: tensor '.*' holds a non-finite value \(nan at element 10\)" -- \
  "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" --steps 1 --init-from "$WORK/nan.safetensors"
expect_one_line "NaN in --init-from" "non-finite"

# ---- outputs: a read-only directory and a full disk ----
"$TRAIN" "${ARGS[@]}" --steps 1 --save-dir "$WORK/ck" >/dev/null
echo '{}' >"$WORK/empty.json"
"$BIN/zshard-bench" --model tiny --warmup-steps 0 --steps 1 --strategies ddp --json "$WORK/bench.json" >/dev/null
# name COMMAND... with OUT standing for the output path
OUTPUTS=(
  "train --log-json|$TRAIN ${ARGS[*]} --steps 1 --log-json OUT"
  "train --mem-report|$TRAIN ${ARGS[*]} --steps 1 --mem-report OUT"
  "train --save|$TRAIN ${ARGS[*]} --steps 1 --save OUT"
  "train --save-dir|$TRAIN ${ARGS[*]} --steps 1 --save-dir OUT"
  "bench --json|$BIN/zshard-bench --model tiny --warmup-steps 0 --steps 1 --strategies ddp --json OUT"
  "commbench --json|$BIN/zshard-commbench --max-size 4KiB --rounds 1 --json OUT"
  "mem --json|$BIN/zshard-mem --model gpt2 --json OUT"
  "project --json|$BIN/zshard-project --bench $WORK/bench.json --json OUT"
  "export|$BIN/zshard-export $WORK/ck/step-00000001 OUT"
)
run_outputs() {  # run_outputs KIND DIR REGEX
  local entry name cmd
  for entry in "${OUTPUTS[@]}"; do
    name=${entry%%|*} cmd=${entry#*|}
    # shellcheck disable=SC2086  # the command line splits on spaces (no path here has one)
    expect_clean_failure "$name into a $1" "$2" "$3" -- ${cmd//OUT/$2/out}
  done
}
# An existing --save-dir that takes no files fails at set-up too, not at the first save after training.
save_into_read_only() {  # save_into_read_only REGEX
  expect_clean_failure "train --save-dir, the read-only directory itself" "$RO" "^zshard-train: error: --save-dir $RO: cannot write into it \($1\)$" \
    -- "$TRAIN" "${ARGS[@]}" --steps 1 --save-dir "$RO"
  expect_true "the read-only --save-dir is refused before any step" test "$(grep -c '^step ' "$WORK/out")" = 0
}
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o ro,size=64k tmpfs "$RO" 2>"$WORK/mount.err"; then
  run_outputs "read-only directory" "$RO" "Read-only file system"
  save_into_read_only "Read-only file system"
elif [ "$(id -u)" != 0 ]; then
  chmod 555 "$RO"
  run_outputs "read-only directory" "$RO" "Permission denied"
  save_into_read_only "Permission denied"
else
  echo "skip read-only directory: cannot mount a read-only tmpfs ($(cat "$WORK/mount.err"))"
fi
if mount -t tmpfs -o size=256k tmpfs "$FULL" 2>"$WORK/mount.err"; then
  dd if=/dev/zero of="$FULL/fill" bs=4k 2>/dev/null  # until the disk is full: no page is left
  run_outputs "full disk" "$FULL" "(No space left on device|cannot create)"
else
  echo "skip full disk: cannot mount a small tmpfs ($(cat "$WORK/mount.err"))"
fi

# ---- a manifest that cannot be written takes its step's rank files with it ----
# The disk is filled to leave the pages of one more save's rank files (the same sizes as step 2's), so
# that they are written and the manifest after them is not.
TIGHT="$WORK/tight"
mkdir -p "$TIGHT"
if mount -t tmpfs -o size=4m tmpfs "$TIGHT" 2>"$WORK/mount.err"; then
  "${MPIRUN[@]}" -np 2 "$TRAIN" "${ARGS[@]}" --strategy zero3 --steps 2 --save-dir "$TIGHT/ck" --save-every 2 \
    --save-mode sync >/dev/null
  pages=0
  for f in "$TIGHT"/ck/step-00000002/rank-*.safetensors; do pages=$((pages + ($(stat -c %s "$f") + 4095) / 4096)); done
  dd if=/dev/zero of="$TIGHT/fill" bs=4k count=$(($(stat -f -c %a "$TIGHT") - pages)) 2>/dev/null
  expect_every_rank_fails "the manifest of step 4 meets a full disk" 1 \
    "step-00000004/manifest.json: cannot write \(No space left on device\)" \
    -- "${ARGS[@]}" --strategy zero3 --steps 4 --save-dir "$TIGHT/ck" --save-every 2 --save-mode sync --resume latest
  expect_true "step 4's rank files are gone with it" test "$(ls "$TIGHT/ck")" = step-00000002
  expect_ok "step 2 still resumes" "$TRAIN" "${ARGS[@]}" --steps 3 --resume "$TIGHT/ck/step-00000002"
  umount "$TIGHT"
else
  echo "skip a manifest on a full disk: cannot mount a small tmpfs ($(cat "$WORK/mount.err"))"
fi

# ---- a tool never writes over its inputs ----
expect_failure "export into its checkpoint" 2 "lies inside .*step-00000001 \(checkpoint\): refusing to write into an input" -- \
  "$BIN/zshard-export" "$WORK/ck/step-00000001" "$WORK/ck/step-00000001/rank-00000.safetensors"
expect_ok "the checkpoint is intact" "$TRAIN" "${ARGS[@]}" --steps 2 --resume "$WORK/ck/step-00000001"
# The stop file is removed once it appears: naming an input (or a directory) would lose it.
head -c 4000 "$(dirname "$0")/../../README.md" >"$WORK/text.txt"
expect_failure "--stop-file naming --data" 2 \
  "^zshard-train: error: --stop-file .*text.txt names the same file as --data: refusing to remove it$" -- \
  "$TRAIN" "${ARGS[@]}" --steps 2 --data "$WORK/text.txt" --stop-file "$WORK/text.txt"
expect_true "the data is still there" test -s "$WORK/text.txt"
expect_failure "--stop-file naming the --save-dir it makes" 2 \
  "^zshard-train: error: --stop-file .*new-ck names the --save-dir or a directory above it, which set-up makes$" -- \
  "$TRAIN" "${ARGS[@]}" --steps 2 --save-dir "$WORK/new-ck/" --stop-file "$WORK/new-ck"
expect_failure "--stop-file naming a directory above the --save-dir" 2 \
  "^zshard-train: error: --stop-file .*new-ck names the --save-dir or a directory above it" -- \
  "$TRAIN" "${ARGS[@]}" --steps 2 --save-dir "$WORK/new-ck/ck" --stop-file "$WORK/new-ck"
expect_true "... and made nothing" test ! -e "$WORK/new-ck"
# A committed step's manifest named as the stop file was taken for a request and removed, and with it the
# checkpoint.
expect_failure "--stop-file inside a checkpoint the run writes" 2 \
  "^zshard-train: error: --stop-file .*new-ck/step-00000001/manifest.json: inside what the run writes under --save-dir" -- \
  "$TRAIN" "${ARGS[@]}" --steps 2 --save-dir "$WORK/new-ck" --stop-file "$WORK/new-ck/step-00000001/manifest.json"
expect_failure "--stop-file named as a checkpoint" 2 "inside what the run writes under --save-dir" -- \
  "$TRAIN" "${ARGS[@]}" --steps 2 --save-dir "$WORK/new-ck" --stop-file "$WORK/new-ck/step-00000002"
# An output named as a checkpoint the run writes: the save failed after training (--log-json), or the
# weights did after the save (--save).
for flag in --log-json --save; do
  expect_failure "$flag named as a checkpoint" 2 \
    "^zshard-train: error: $flag .*new-ck/step-00000001: inside what the run writes under --save-dir" -- \
    "$TRAIN" "${ARGS[@]}" --steps 1 --save-dir "$WORK/new-ck" "$flag" "$WORK/new-ck/step-00000001"
done
expect_true "... and made nothing" test ! -e "$WORK/new-ck"
mkdir -p "$WORK/stop-dir"
expect_failure "--stop-file under a file" 2 \
  "^zshard-train: error: --stop-file .*text.txt/stop: .*text.txt is a file, so the stop file could never appear$" -- \
  "$TRAIN" "${ARGS[@]}" --steps 2 --stop-file "$WORK/text.txt/stop"
expect_failure "--stop-file naming a directory" 2 \
  "^zshard-train: error: --stop-file .*stop-dir: is a directory \(the stop file is one the run removes once it appears\)$" -- \
  "$TRAIN" "${ARGS[@]}" --steps 2 --stop-file "$WORK/stop-dir"
expect_failure "--log-json naming the --trace-dir" 2 \
  "^zshard-train: error: --log-json .*traces names the --trace-dir, where the ranks' traces go$" -- \
  "$TRAIN" "${ARGS[@]}" --steps 2 --trace-dir "$WORK/traces" --log-json "$WORK/traces"
mkdir -p "$WORK/traces"
expect_ok "a file beside the traces in an existing --trace-dir" "$TRAIN" "${ARGS[@]}" --steps 2 \
  --trace-dir "$WORK/traces" --log-json "$WORK/traces/log.json"
expect_failure "--json over --check" 2 "names the same file as --check" -- \
  "$BIN/zshard-mem" --check "$WORK/bench.json" --json "$WORK/bench.json"
expect_failure "tune --json over --data" 2 "^zshard-tune: error: --json .*text.txt names the same file as --data: refusing to overwrite it$" -- \
  "$BIN/zshard-tune" --model tiny --np 2 --data "$WORK/text.txt" --json "$WORK/text.txt"
expect_true "the data is still the text" grep -q zshard "$WORK/text.txt"
expect_failure "--save over --init-from" 2 "--save .*w.safetensors names the same file as --init-from" -- \
  "$TRAIN" --init-from "$WORK/w.safetensors" --save "$WORK/w.safetensors"

# ---- a run that cannot fit is refused before it allocates ----
start=$(date +%s.%N)
expect_failure "gpt2-xl batch 64 seq 1024 cannot fit" 1 \
  "does not fit in memory: this rank needs about .* GB .* it can use .*; .*nearest that fits: --strategy zero3" -- \
  "$TRAIN" --model gpt2-xl --batch 64 --seq 1024
expect_one_line "gpt2-xl batch 64 seq 1024 cannot fit" "does not fit"
expect_true "refused within 5 s" test "$(echo "$(date +%s.%N) - $start < 5" | bc)" = 1

# ---- tool flags: each refused with exit 2 and one line naming the flag ----
expect_failure "mem --world 0 (was SIGFPE)" 2 "--world entries must be in \[1, 1048576\], got 0" -- \
  "$BIN/zshard-mem" --model gpt2 --world 0
expect_failure "project --max-world 2e9 (was SIGFPE)" 2 "--max-world must be at most 1048576" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 100000000 --max-world 2000000000
expect_failure "project --serial-fraction 2" 2 "--serial-fraction must be in \[0, 1\]" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 100000000 --serial-fraction 2
expect_failure "project --params 0.5" 2 "--params: must be in \[1, 1e15\]" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 0.5
expect_failure "project --params nan" 2 "--params" -- "$BIN/zshard-project" --compute-ms 100 --params nan
expect_failure "project --batch 0" 2 "--batch must be >= 1" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 100000000 --batch 0
expect_failure "project --bandwidth-gbs 0" 2 "--bandwidth-gbs must be a finite number > 0" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 100000000 --bandwidth-gbs 0
expect_failure "project --bench without fields" 2 "--bench .*empty.json: not a zshard-bench result \(key 'results' not found\)" -- \
  "$BIN/zshard-project" --bench "$WORK/empty.json"
expect_failure "mem --check without fields" 2 "--check .*empty.json: not a zshard-bench result \(key 'model' not found\)" -- \
  "$BIN/zshard-mem" --check "$WORK/empty.json"
expect_failure "train --seed -1" 2 "--seed: must be >= 0, got -1" -- "$TRAIN" --seed -1
expect_failure "train --min-lr above --lr" 2 "--min-lr must be .* \(at most --lr\)" -- "$TRAIN" --min-lr 1
expect_failure "train --data DIRECTORY" 2 "--data $WORK: is a directory" -- "$TRAIN" --data "$WORK"
# Empty items of comma lists were dropped silently ("2,1," read as 2,1), every list flag alike.
expect_failure "train --shard-group 2,1," 2 "--shard-group: empty item in the list '2,1,'" -- \
  "$TRAIN" --strategy hybrid --shard-group 2,1,
# Quantized parameter gathers where no parameters are gathered, or in a format zshard does not send.
expect_failure "train --quantize-gathers with zero2" 2 "--quantize-gathers is only for --strategy zero3 or hybrid" -- \
  "$TRAIN" --strategy zero2 --quantize-gathers int8
expect_one_line "train --quantize-gathers with zero2" "only for"
expect_failure "train --quantize-gathers int4" 2 "--quantize-gathers int4: 4-bit parameter gathers are not supported" -- \
  "$TRAIN" --strategy zero3 --quantize-gathers int4
# Quantized gradient reductions where no rank owns a shard to sum, or in a format zshard does not send.
expect_failure "train --quantize-reductions with ddp" 2 "--quantize-reductions is only for --strategy zero1, zero2, zero3 or hybrid" -- \
  "$TRAIN" --strategy ddp --quantize-reductions int8
expect_one_line "train --quantize-reductions with ddp" "only for"
# Groups of one carry nothing to quantize: a world of one, hybrid's default groups on 3 ranks.
expect_failure "train --quantize-gathers at np 1" 2 \
  "^zshard-train: error: --quantize-gathers int8: every shard group here is one rank \(1 rank\), so nothing is gathered" -- \
  "$TRAIN" --strategy zero3 --quantize-gathers int8
expect_failure "train --quantize-reductions over hybrid's groups of one" 2 \
  "--quantize-reductions int8: every shard group here is one rank \(3 ranks in groups of 1\)" -- \
  "${MPIRUN[@]}" -np 3 "$TRAIN" --strategy hybrid --batch 6 --quantize-reductions int8
expect_one_line "train --quantize-reductions over hybrid's groups of one" "every shard group here is one rank"
# Where a run starts, not where the tools plan: zshard-mem's table of a world of one, zshard-bench's probe of
# hybrid's groups (of one at np 2: hybrid does not run there) beside quantized zero3.
expect_ok "mem: quantized gathers in a world of one's row" "$BIN/zshard-mem" --model tiny --strategy zero3 \
  --quantize-gathers int8
expect_ok "bench at np 2 with quantized gathers" "${MPIRUN[@]}" -np 2 "$BIN/zshard-bench" --model tiny \
  --warmup-steps 0 --steps 1 --quantize-gathers int8
expect_failure "train --quantize-reductions fp8" 2 "--quantize-reductions: unknown value 'fp8' [(]valid: none, int8, int4[)]" -- \
  "$TRAIN" --strategy zero2 --quantize-reductions fp8
expect_failure "mem --world 2,,4" 2 "--world: empty item in the list '2,,4'" -- "$BIN/zshard-mem" --model tiny --world 2,,4
expect_failure "bench --strategies ddp,,zero3" 2 "--strategies: empty item in the list 'ddp,,zero3'" -- \
  "$BIN/zshard-bench" --strategies ddp,,zero3
# The run's inputs are checked before the table's header, not at the first strategy's set-up.
for bad in "--seq 100000|--seq 100000 exceeds the model's context" "--data $WORK/no-such.txt|--data .*no-such.txt: no such file" \
           "--init-from $WORK/no-such.safetensors|--init-from .*no-such.safetensors: no such file"; do
  expect_failure "bench ${bad%%|*}" 2 "^zshard-bench: error: ${bad##*|}" -- \
    "$BIN/zshard-bench" --model tiny --warmup-steps 0 --steps 1 --strategies ddp ${bad%%|*}
  [ ! -s "$WORK/out" ] || { echo "FAIL bench ${bad%%|*}: printed before its error"; cat "$WORK/out"; failures=$((failures + 1)); }
done
expect_failure "project --nodes 4,,2" 2 "--nodes: empty item in the list '4,,2'" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 1e8 --nodes 4,,2
expect_one_line "project --nodes 4,,2" "empty item"
# Sums and common multiples of group sizes overflowed int: a negative world, negative unit paddings.
expect_failure "project --nodes past 2^31 ranks (printed a negative world)" 2 \
  "--nodes: 2147483648 ranks in all, more than 1048576" -- "$BIN/zshard-project" --compute-ms 100 --params 1e8 \
  --nodes "$(printf '1048576%.0s,' $(seq 2047))1048576"
expect_failure "mem --shard-group 2,3,5,...,31 (its common multiple overflowed int)" 2 \
  "--shard-group 2,3,5,7,11,13,17,19,23,29,31: .*least common multiple of these exceeds 1048576" -- \
  "$BIN/zshard-mem" --model tiny --strategy hybrid --shard-group 2,3,5,7,11,13,17,19,23,29,31
expect_one_line "mem --shard-group 2,3,5,...,31 (its common multiple overflowed int)" "least common multiple"
expect_failure "train --data /dev/zero (was std::bad_alloc)" 2 "--data /dev/zero: is a character device" -- \
  "$TRAIN" --data /dev/zero
expect_one_line "train --data /dev/zero (was std::bad_alloc)" "/dev/zero"
expect_failure "bench train-only flag" 2 "--save-dir" -- "$BIN/zshard-bench" --save-dir "$WORK/x"
expect_failure "bench train-only --stop-file" 2 "--stop-file" -- "$BIN/zshard-bench" --stop-file "$WORK/x"
expect_failure "bench hybrid on 2 ranks" 2 "--strategies hybrid: by default, groups of one rank are ddp; a world of 2 has no hybrid" -- \
  "${MPIRUN[@]}" -np 2 "$BIN/zshard-bench" --strategies hybrid
expect_one_line "bench hybrid on 2 ranks" "--strategies"
expect_failure "commbench --min-size 0.5 (was a hang)" 2 "--min-size must be at least 1 byte" -- \
  "$BIN/zshard-commbench" --min-size 0.5 --max-size 4KiB --rounds 1
expect_failure "train --lr '' (trained at 0)" 2 "--lr: empty value \(leave the flag out for its default\)" -- "$TRAIN" --lr ""
expect_failure "export '' output" 2 "output: empty value \(the argument is required\)" -- "$BIN/zshard-export" "$WORK/ck/step-00000001" ""
expect_failure "train --seed 2^64 (was clamped)" 2 "--seed: must be below 2\^64" -- "$TRAIN" --seed 18446744073709551616
expect_every_rank_fails "train --batch 2^31-1 (was bad_alloc before the memory check)" 1 "does not fit in memory" -- \
  --batch 2147483647 --steps 1
expect_failure "mem --dim 2^30 (int64 overflow)" 2 "parameters, more than 1e\+15" -- "$BIN/zshard-mem" --model tiny --dim 1073741824
expect_failure "mem --layers 2^30 (built units for hours)" 2 "layers must be at most 65536" -- \
  "$BIN/zshard-mem" --model tiny --layers 1073741824
# Flags that did nothing in the combination given.
expect_failure "mem --shard-group without hybrid" 2 "--shard-group is only for --strategy hybrid" -- \
  "$BIN/zshard-mem" --model tiny --world 4 --shard-group 2
expect_failure "mem --max-inflight with ddp" 2 "--max-inflight is only for --strategy zero3 or hybrid" -- \
  "$BIN/zshard-mem" --model tiny --strategy ddp --max-inflight 4
expect_failure "mem --params with --layers" 2 "--layers excludes --params" -- "$BIN/zshard-mem" --params 1e9 --layers 4
expect_failure "mem --params -5" 2 "--params must be in \(0, 1e15\], got -5" -- "$BIN/zshard-mem" --params -5
expect_failure "mem --check with --json" 2 "--check prints its comparison and writes no JSON" -- \
  "$BIN/zshard-mem" --check "$WORK/bench.json" --json "$WORK/check.json"
expect_failure "mem --check with --world" 2 "--world excludes --check" -- "$BIN/zshard-mem" --check "$WORK/bench.json" --world 8
expect_failure "mem --check DIRECTORY" 2 "--check $WORK: is a directory" -- "$BIN/zshard-mem" --check "$WORK"
mkfifo "$WORK/json.fifo"  # a read would wait for a writer that never comes
expect_failure "mem --check FIFO" 2 "^zshard-mem: error: --check $WORK/json.fifo: is a FIFO \(named pipe\), not a JSON file$" -- \
  "$BIN/zshard-mem" --check "$WORK/json.fifo"
expect_failure "project --bench FIFO" 2 "^zshard-project: error: --bench $WORK/json.fifo: is a FIFO" -- \
  "$BIN/zshard-project" --bench "$WORK/json.fifo"
expect_failure "project --bench with --compute-ms" 2 "--bench excludes --compute-ms" -- \
  "$BIN/zshard-project" --bench "$WORK/bench.json" --compute-ms 5
expect_failure "project --inter-link bogus" 2 "--inter-link: bogus not in" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 100000000 --inter-link bogus
expect_failure "bench --log-every" 2 "--log-every" -- "$BIN/zshard-bench" --log-every 5
expect_failure "bench --shard-group without hybrid" 2 "--shard-group is only for hybrid" -- \
  "$BIN/zshard-bench" --strategies ddp --shard-group 2
expect_failure "bench --shard-group where hybrid cannot run" 2 "--shard-group 2: one group of the whole world is zero3" -- \
  "${MPIRUN[@]}" -np 2 "$BIN/zshard-bench" --shard-group 2
expect_failure "bench --max-inflight without zero3 or hybrid" 2 "--max-inflight is only for zero3 and hybrid" -- \
  "$BIN/zshard-bench" --strategies ddp,zero1 --max-inflight 4
# A later strategy's flags are checked before the first strategy runs: no ddp line, then the error.
for flags in "--max-inflight 0" "--secondary-shard 4" "--reshard-after-forward false --secondary-shard 2"; do
  # shellcheck disable=SC2086  # the flags split into words
  expect_failure "bench ddp,zero3 $flags: refused before ddp runs" 2 "^zshard-bench: error: --(max-inflight|secondary-shard)" -- \
    "${MPIRUN[@]}" -np 2 "$BIN/zshard-bench" --model tiny --steps 1 --warmup-steps 0 --strategies ddp,zero3 $flags
  expect_true "... nothing ran" eval '! grep -q "ddp even" "$WORK/out"'
done
expect_failure "bench --shard-group 4 at np 4 names --shard-group" 2 "^zshard-bench: error: --shard-group 4: one group of the whole world is zero3; give groups between 1 and the world, e.g. --shard-group 2$" -- \
  "${MPIRUN[@]}" -np 4 "$BIN/zshard-bench" --model tiny --strategies ddp,hybrid --shard-group 4
expect_failure "bench --strategies zero9 names --strategies" 2 \
  "^zshard-bench: error: --strategies: 'zero9' is not one of ddp,zero1,zero2,zero3,hybrid$" -- "$BIN/zshard-bench" --strategies zero9
expect_failure "tune --strategies zero9 names --strategies" 2 \
  "^zshard-tune: error: --strategies: 'zero9' is not one of ddp,zero1,zero2,zero3,hybrid$" -- \
  "$BIN/zshard-tune" --strategies zero9 --np 2 --global-batch 4
expect_failure "bench a strategy listed twice" 2 "^zshard-bench: error: --strategies: 'ddp' is listed twice$" -- \
  "$BIN/zshard-bench" --model tiny --strategies ddp,ddp
expect_failure "mem a world listed twice" 2 "^zshard-mem: error: --world: '8' is listed twice$" -- "$BIN/zshard-mem" --model tiny --world 8,8
expect_failure "commbench an op listed twice" 2 "^zshard-commbench: error: --ops: 'all_reduce' is listed twice$" -- \
  "$BIN/zshard-commbench" --ops all_reduce,all_reduce
finish
