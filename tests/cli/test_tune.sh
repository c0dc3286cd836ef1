# zshard-tune on tiny at np 2: a small search within a tight --time-budget picks a configuration whose
# measured peak fits the budget, runs no candidate the estimate rules out, and prints a zshard-train
# command line that trains; candidates with communication modes run with them. Bad input is one line and
# exit 2, a launcher that fails every run one line naming it and exit 1; a run past its time is ended with
# every process it started, and so is the search when the tool is told to stop.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
TUNE="$ZSHARD_BIN/zshard-tune"
# Every process the launcher starts (mpirun, then each rank) writes its pid here before it becomes itself.
cat >"$WORK/record.sh" <<SH
#!/bin/sh
echo \$\$ >>"$WORK/pids"
exec "\$@"
SH
chmod +x "$WORK/record.sh"
LAUNCH=(--launcher "$WORK/record.sh ${MPIRUN[*]} -np {np} $WORK/record.sh")
# tiny at 8x32 on 2 ranks: no configuration at one micro-step fits 3 MB without checkpointing.
SEARCH=(--model tiny --np 2 --global-batch 8 --seq 32 --strategies zero1,zero2,zero3 --offload none --max-inflight 2
  --reshard-after-forward true --rank-batches even --warmup-steps 1)

# no_orphans NAME: every process the launcher started has ended (a zombie has: it only waits to be reaped).
no_orphans() {
  local alive="" pid
  for pid in $(cat "$WORK/pids" 2>/dev/null); do
    if ps -o stat= -p "$pid" 2>/dev/null | grep -qv Z; then alive="$alive $pid"; fi
  done
  if [ -z "$alive" ]; then echo "ok   $1: no process left"; else
    echo "FAIL $1: still running:$alive"; ps -o pid,ppid,sid,args -p "${alive# }" || true; failures=$((failures + 1)); fi
  : >"$WORK/pids"
}

expect_ok "tune tiny np 2" "$TUNE" "${SEARCH[@]}" --mem-budget 3MB --steps 2 --top 2 --time-budget 100 --json "$WORK/tune.json" "${LAUNCH[@]}"
cp "$WORK/out" "$WORK/tune.out"
expect_true "a progress line per run, the table and the winner" python3 -c "
import re
out = open('$WORK/tune.out').read()
assert re.search(r'\[1\] \S+ .*\.\.\. [0-9.]+ ms, peak', out), out
assert 'fastest that fits:' in out and 'zshard-train --model tiny --seq 32 --strategy' in out, out"
expect_true "runs only what fits, within the budgets; the winner is the fastest measured" python3 -c "
import json
d = json.load(open('$WORK/tune.json'))
runs = [c for c in d['candidates'] if 'run' in c]
assert any(not c['fits'] for c in d['candidates']), 'the budget rules nothing out'
assert all(c['fits'] for c in runs), [c['label'] for c in runs if not c['fits']]
assert 2 <= len(runs) <= 3, len(runs)  # the calibrating run and the top 2
ok = [c for c in runs if c['run']['status'] == 'ok']
assert all(c['run']['peak_bytes'] <= d['budget_bytes'] == 3000000 for c in ok)
best = min(ok, key=lambda c: c['run']['step_ms'])
assert d['winner']['label'] == best['label'] and d['winner']['step_ms'] == best['run']['step_ms'], d['winner']
assert d['elapsed_s'] <= 100 and d['calibration']['measured']"
cmd=$(python3 -c "import json; print(json.load(open('$WORK/tune.json'))['winner']['command'])")
expect_ok "the winner's command line trains" sh -c "$cmd --steps 2 --log-every 1"
expect_true "... at the batch the search kept (8 sequences per step)" grep -Eq "batch [0-9]+x32( x[0-9]+)?, 2 steps" "$WORK/out"
no_orphans "after the search"

# The communication modes as dimensions: each candidate runs with its own (the bytes its run measured are
# those of its plan, and int8 gathers move fewer); a secondary group of 2 on 2 ranks, which the runtime
# refuses, is no candidate.
expect_ok "tune with communication modes" "$TUNE" --model tiny --np 2 --global-batch 8 --seq 32 --strategies zero2,zero3 \
  --grad-accum 1 --activation-checkpointing none --offload none --max-inflight 2 --reshard-after-forward true \
  --quantize-gathers none,int8 --quantize-reductions int4 --secondary-shard none,2 --rank-batches even --exhaustive \
  --repeats 1 --steps 1 --warmup-steps 0 --mem-budget 1GB --time-budget 100 --work-dir "$WORK/modes" \
  --json "$WORK/modes.json" "${LAUNCH[@]}"
expect_true "... each run with its candidate's modes" python3 -c "
import json
d = json.load(open('$WORK/modes.json'))
labels = sorted(c['label'] for c in d['candidates'])
assert labels == ['zero2 b8x1 reductions-int4', 'zero3 b8x1 gathers-int8 reductions-int4', 'zero3 b8x1 reductions-int4'], labels
measured = {}
for c in d['candidates']:
    assert c['run']['status'] == 'ok' and ['--quantize-reductions', 'int4'] == c['flags'][-2:], c
    b = json.load(open('$WORK/modes/' + c['run']['log'][:-len('.log')] + '.json'))['results'][0]['comm_bytes_per_step']
    assert abs(b['measured'] - b['theory']) < 256, (c['label'], b)
    measured[c['label']] = b['measured']
assert measured['zero3 b8x1 gathers-int8 reductions-int4'] < 0.5 * measured['zero3 b8x1 reductions-int4'], measured"
no_orphans "after the search with modes"

# Bad input: one line, exit 2, nothing launched.
expect_failure "budget too small" 2 "--mem-budget 1.00 MB fits no candidate: the smallest, [a-z0-9 ]+, needs [0-9.]+ MB" -- \
  "$TUNE" "${SEARCH[@]}" --mem-budget 1MB --steps 2 "${LAUNCH[@]}"
expect_one_line "budget too small" "fits no candidate"
# The candidates are planned for --hosts: a launcher that puts both ranks on this one host times other runs.
expect_failure "a launcher that places the ranks otherwise than --hosts" 2 \
  "^zshard-tune: error: --launcher placed the ranks on hosts of 2, but the candidates are planned for hosts of 1,1 \(--hosts" -- \
  "$TUNE" --model tiny --hosts 1,1 --global-batch 8 --seq 32 --strategies zero2,zero3 --offload none --max-inflight 2 \
  --reshard-after-forward true --rank-batches even --warmup-steps 1 --mem-budget 3MB --steps 2 --top 1 "${LAUNCH[@]}"
no_orphans "after the launcher's other placement"
expect_failure "batch not divisible" 2 "--global-batch: 7 sequences do not divide over 2 ranks" -- \
  "$TUNE" --np 2 --global-batch 7
expect_failure "grad-accum not divisible" 2 "--grad-accum 3 does not divide the 4 sequences per rank" -- \
  "$TUNE" --np 2 --global-batch 8 --grad-accum 1,3
expect_failure "tokens not whole sequences" 2 "--global-tokens 100 is not a whole number of --seq 32" -- \
  "$TUNE" --np 2 --global-tokens 100 --seq 32
expect_failure "no global batch" 2 "give the global batch" -- "$TUNE" --np 2
expect_failure "zero3's dimension without zero3" 2 \
  "^zshard-tune: error: --max-inflight is only for zero3 or hybrid, and --strategies has neither$" -- \
  "$TUNE" --np 2 --global-batch 8 --strategies ddp,zero2 --max-inflight 1,2
expect_failure "quantized reductions with ddp alone" 2 \
  "^zshard-tune: error: --quantize-reductions is only for zero1, zero2, zero3 or hybrid, and --strategies has none$" -- \
  "$TUNE" --np 2 --global-batch 8 --strategies ddp --quantize-reductions int8
expect_failure "under mpirun (each candidate failed with MPI's words)" 2 \
  "^zshard-tune: error: run this as one process, not under mpirun or srun: it starts each run itself \(--launcher; OMPI_COMM_WORLD_SIZE is set\)$" -- \
  "${MPIRUN[@]}" -np 1 "$TUNE" "${SEARCH[@]}"
# Checked before any candidate runs: not one failure per candidate, with nothing on stderr.
touch "$WORK/file"
expect_failure "missing --data" 2 "--data $WORK/no/tokens.bin: no such file" -- \
  "$TUNE" --model tiny --np 2 --global-batch 4 --seq 16 --mem-budget 1GB --data "$WORK/no/tokens.bin"
expect_failure "--work-dir under a file" 2 "--work-dir $WORK/file/runs: cannot create \(Not a directory\)" -- \
  "$TUNE" --model tiny --np 2 --global-batch 4 --seq 16 --mem-budget 1GB --work-dir "$WORK/file/runs"
expect_failure "a mode no candidate can run" 2 \
  "^zshard-tune: error: --strategies zero3: no candidate runs as asked: --secondary-shard 2: a secondary group of the whole world is the shard group itself" -- \
  "$TUNE" --model tiny --np 2 --global-batch 8 --seq 32 --strategies zero3 --secondary-shard 2 --mem-budget 1GB
expect_one_line "a mode no candidate can run" "."
expect_failure "--quantize-gathers int4" 2 "--quantize-gathers int4: 4-bit parameter gathers are not supported" -- \
  "$TUNE" --model tiny --np 2 --global-batch 8 --seq 32 --quantize-gathers none,int4 --mem-budget 1GB
expect_failure "unknown model" 2 "--model" -- "$TUNE" --model nope --np 2 --global-batch 8
expect_one_line "unknown model" "nope"
expect_failure "bad time budget" 2 "--time-budget must be a positive duration" -- \
  "$TUNE" --np 2 --global-batch 8 --time-budget 0
test -s "$WORK/pids" && { echo "FAIL bad input launched a run"; failures=$((failures + 1)); }

# A launcher that fails at once: the search says so, naming it, how it ended and the first line it said
# (past mpirun's rules of dashes), exit 1; one that fails only its first run leaves the search to go on.
printf '#!/bin/sh\necho ------\necho "no route to the cluster" >&2\necho "more words" >&2\nexit 3\n' >"$WORK/broken.sh"
chmod +x "$WORK/broken.sh"
expect_failure "a launcher that fails at once" 1 \
  "^zshard-tune: error: the launcher failed on each of the 3 candidates tried: '$WORK/broken.sh -np 2' exited with code 3: no route to the cluster$" \
  -- "$TUNE" "${SEARCH[@]}" --mem-budget 3MB --steps 2 --launcher "$WORK/broken.sh"
expect_one_line "a launcher that fails at once" "."
expect_failure "--launcher false" 1 \
  "^zshard-tune: error: the launcher failed on each of the 3 candidates tried: 'false -np 2' exited with code 1$" -- \
  "$TUNE" "${SEARCH[@]}" --mem-budget 3MB --steps 2 --launcher false
cat >"$WORK/flaky.sh" <<SH
#!/bin/sh
[ -e "$WORK/flaky.once" ] || { : >"$WORK/flaky.once"; exit 1; }
exec "\$@"
SH
chmod +x "$WORK/flaky.sh"
expect_ok "a launcher that fails its first run only" "$TUNE" "${SEARCH[@]}" --mem-budget 3MB --steps 1 --top 1 \
  --repeats 1 --time-budget 100 --launcher "$WORK/flaky.sh $WORK/record.sh ${MPIRUN[*]} -np {np} $WORK/record.sh"
expect_true "... finds the fastest after its failure" eval 'grep -q "\[1\] .* failed: exit" "$WORK/out" && grep -q "fastest that fits:" "$WORK/out"'
no_orphans "after a launcher's failures"

# A time budget shorter than one run: the run is ended, every process of it with it.
expect_failure "time budget too short for one run" 2 "--time-budget 3.0 s is too short for one run: .* was still running" -- \
  "$TUNE" "${SEARCH[@]}" --mem-budget 3MB --steps 1000000 --time-budget 3 "${LAUNCH[@]}"
expect_one_line "time budget too short for one run" "too short"
no_orphans "after the time budget ran out"

# Told to stop mid-run, the search ends its run and exits 130.
"$TUNE" "${SEARCH[@]}" --mem-budget 3MB --steps 1000000 --time-budget 300 "${LAUNCH[@]}" >"$WORK/out" 2>"$WORK/err" &
tuner=$!
for _ in $(seq 100); do [ "$(wc -l <"$WORK/pids" 2>/dev/null || echo 0)" -ge 3 ] && break; sleep 0.2; done
sleep 1
kill -TERM $tuner
wait $tuner
code=$?
if [ $code = 130 ] && grep -q "stopped by a signal" "$WORK/err"; then echo "ok   SIGTERM stops the search (exit 130)"; else
  echo "FAIL SIGTERM: exit $code"; cat "$WORK/out" "$WORK/err"; failures=$((failures + 1)); fi
no_orphans "after SIGTERM"
finish
