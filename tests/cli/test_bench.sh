# Smoke test of the benchmark tools: zshard-bench at np 2 and 4 on tiny prints the table and writes valid
# JSON with every strategy the world allows, zshard-commbench finds no wrong element and writes valid JSON
# (with Open MPI, the raw non-blocking column's Iallreduce algorithm named: libnbc's own or the user's),
# zshard-mem prints the ZeRO table and checks the bench JSON (a tied Llama that defers its head's gradient:
# exactly; bf16 parameters with fp32 reductions), zshard-project prints its table, and projects the communication modes or refuses them.
source "$(dirname "$0")/lib.sh"
BIN="$ZSHARD_BIN"

check() {  # check NAME COMMAND...: the command must succeed
  local name=$1
  shift
  if "$@" >"$WORK/out" 2>"$WORK/err"; then echo "ok   $name"; else
    echo "FAIL $name (exit $?)"; cat "$WORK/out" "$WORK/err"; failures=$((failures + 1)); fi
}

check "bench np 2" timeout 120 "${MPIRUN[@]}" -np 2 "$BIN/zshard-bench" --model tiny --warmup-steps 1 --steps 2 \
  --json "$WORK/bench.json"
check "bench JSON" python3 -c "
import json, sys
d = json.load(open('$WORK/bench.json'))
got = [r['strategy'] for r in d['results']]
assert got == ['ddp', 'zero1', 'zero2', 'zero3'], got  # hybrid needs a group between 1 and the world
for r in d['results']:
    assert r['world'] == 2 and r['step_ms']['median'] > 0 and r['tokens_per_s'] > 0
ddp = d['results'][0]['model_states_bytes']
assert ddp['measured'] == ddp['theory'], ddp  # 16 bytes per parameter, nothing sharded
# The memory report's communication per step is over the timed steps too, not the warm-up's.
for r in d['results']:
    timed, report = r['comm_ms_per_step']['exposed'], r['memory_report']['ranks'][0]['comm_exposed_ms_per_step']
    assert abs(timed - report) <= 1e-9 + 1e-9 * timed, (r['strategy'], timed, report)
"
check "mem vs bench" "$BIN/zshard-mem" --check "$WORK/bench.json"

# A tied Llama whose ranks have fewer tokens than channels (32 of 64) defers its head's weight gradient to
# the embedding's backward; the estimate follows it to the byte.
check "bench tied llama" timeout 120 "${MPIRUN[@]}" -np 2 "$BIN/zshard-bench" --model llama-tiny \
  --config tie_embeddings=1,vocab=4096 --batch 2 --seq 32 --strategies zero2,zero3 --warmup-steps 1 --steps 1 \
  --json "$WORK/tied.json"
check "mem vs bench tied llama" "$BIN/zshard-mem" --check "$WORK/tied.json"
for s in zero2 zero3; do
  grep -Eq "^$s .* 1\.000  ok$" "$WORK/out" ||
    { echo "FAIL mem vs bench tied llama: $s's peak is not the estimate"; cat "$WORK/out"; failures=$((failures + 1)); }
done

# bf16 parameters reduced in fp32, zshard-train's default beside them: each reduction first converts its
# unit's gradient into an fp32 buffer, which the estimate counts (without it, 67-82% of the peak). The
# head's fp32 copies of its weight (a 64 MiB block) are counted where they run: at 2x64 per rank (as many
# tokens as channels) before any reduction, beside the gradients open by then; at 2x16 its weight gradient
# is deferred to the embedding's backward, beside the other units' reductions (summed with every
# communication buffer: 1.18-1.29 of the measure).
for seq in 16 64; do
  check "bench bf16 params, fp32 reduce, seq $seq" timeout 120 "${MPIRUN[@]}" -np 2 "$BIN/zshard-bench" --model gpt2 \
    --layers 1 --dim 128 --heads 4 --param-dtype bf16 --batch 4 --seq $seq --warmup-steps 1 --steps 2 \
    --json "$WORK/bf16.json"
  check "mem vs bench bf16 params, fp32 reduce, seq $seq" "$BIN/zshard-mem" --check "$WORK/bf16.json"
done

# --rank-batches even,auto: both splits per strategy, the auto one after re-splits, with the ideal step.
check "bench even,auto" timeout 120 "${MPIRUN[@]}" -np 2 "$BIN/zshard-bench" --model tiny --strategies ddp \
  --rank-batches even,auto --rebalance-every 1 --warmup-steps 1 --steps 2 --json "$WORK/balance.json"
grep -Eq "^ *ddp/auto " "$WORK/out" || { echo "FAIL bench even,auto: no ddp/auto row"; cat "$WORK/out"; failures=$((failures + 1)); }
check "bench even,auto JSON" python3 -c "
import json
d = json.load(open('$WORK/balance.json'))
assert d['rank_batch_splits'] == ['even', 'auto'] and d['rebalance_every'] == 1, d['rank_batch_splits']
assert [r['rank_batches'] for r in d['results']] == ['even', 'auto']
for r in d['results']:
    assert sum(r['split']) == d['batch'] and min(r['split']) >= 1, r['split']
    assert len(r['measured_seq_per_s']) == 2 and min(r['measured_seq_per_s']) > 0 and r['ideal_step_ms'] > 0
    assert r['rank_batch_max'] >= max(r['split']), r
"
check "mem vs bench even,auto" "$BIN/zshard-mem" --check "$WORK/balance.json"

# np 4 (oversubscribed on small machines): all five strategies, hybrid with shard groups of 2.
check "bench np 4" timeout 300 "${MPIRUN[@]}" -np 4 "$BIN/zshard-bench" --model tiny --warmup-steps 1 --steps 1 \
  --json "$WORK/bench4.json"
for s in ddp zero1 zero2 zero3 hybrid; do
  grep -Eq "^ *$s " "$WORK/out" || { echo "FAIL bench np 4: no table row for $s"; cat "$WORK/out"; failures=$((failures + 1)); }
done
check "bench np 4 JSON" python3 -c "
import json
d = json.load(open('$WORK/bench4.json'))
got = [r['strategy'] for r in d['results']]
assert got == ['ddp', 'zero1', 'zero2', 'zero3', 'hybrid'], got
for r in d['results']:
    assert r['world'] == 4 and r['step_ms']['median'] > 0 and r['tokens_per_s'] > 0, r['strategy']
    ms = r['model_states_bytes']
    assert ms['measured'] == ms['theory'], (r['strategy'], ms)
"
check "mem vs bench np 4" "$BIN/zshard-mem" --check "$WORK/bench4.json"
# The memory modes reach the check: frozen layers and whole units kept after forward (which it estimated as
# a plain run, 3.4 and 0.74 of the measured peaks), and int8 gathers.
check "bench np 4 with memory modes" timeout 300 "${MPIRUN[@]}" -np 4 "$BIN/zshard-bench" --model tiny --layers 8 \
  --batch 4 --seq 16 --warmup-steps 1 --steps 1 --strategies ddp,zero3,hybrid --freeze 'h.[0-3].*' \
  --reshard-after-forward false --quantize-gathers int8 --json "$WORK/modes.json"
check "mem vs bench with memory modes" "$BIN/zshard-mem" --check "$WORK/modes.json"
# The auto split's checks take no strategy's flags (they refused --shard-group beside hybrid).
check "bench np 4 auto hybrid --shard-group 2" timeout 120 "${MPIRUN[@]}" -np 4 "$BIN/zshard-bench" --model tiny \
  --strategies hybrid --shard-group 2 --rank-batches auto --rebalance-every 1 --warmup-steps 0 --steps 1

check "commbench np 2" timeout 120 env -u OMPI_MCA_coll_libnbc_iallreduce_algorithm "${MPIRUN[@]}" -np 2 \
  "$BIN/zshard-commbench" --max-size 64KiB --round-ms 5 --rounds 1 --json "$WORK/comm.json"
grep -q "wrong elements: 0" "$WORK/out" || { echo "FAIL commbench: wrong elements"; failures=$((failures + 1)); }
cp "$WORK/out" "$WORK/comm.out"
check "commbench JSON" python3 -c "
import json
d = json.load(open('$WORK/comm.json'))
assert d['world'] == 2 and d['backend'] == 'mpi', d
rows = d['rows']
assert sorted({r['op'] for r in rows}) == ['all_gather', 'all_reduce', 'reduce_scatter'], rows
for r in rows:
    assert r['wrong'] == 0 and r['raw_wrong'] == 0 and r['busbw'] > 0 and r['raw_busbw'] > 0 and r['busbw_ratio'] > 0, r
# Open MPI: the raw non-blocking column's algorithm, libnbc's own choice unless set; other MPIs: ''.
assert d['libnbc_iallreduce_algorithm'] in ('default', ''), d['libnbc_iallreduce_algorithm']
"
# The all-to-all that quantized reductions exchange through, on 3 ranks: each block lands at its rank.
# The communication modes reach the strategies that take them and leave the others (hybrid is checked with
# its own options): zero3 alone moves backward's gathers inside pairs, the others' bytes are their own.
check "bench --secondary-shard 2 with every strategy" timeout 120 "${MPIRUN[@]}" -np 4 "$BIN/zshard-bench" \
  --model tiny --warmup-steps 0 --steps 1 --secondary-shard 2
grep -Eq "^zero3 +4 +4 .* 0\.95/0\.95 " "$WORK/out" && grep -Eq "^ddp +4 +1 " "$WORK/out" ||
  { echo "FAIL bench --secondary-shard 2: no zero3 row with its paired bytes"; cat "$WORK/out"; failures=$((failures + 1)); }
check "commbench all_to_all np 3" timeout 120 "${MPIRUN[@]}" -np 3 "$BIN/zshard-commbench" --ops all_to_all \
  --min-size 12 --max-size 48KiB --factor 8 --round-ms 5 --rounds 1
grep -q "wrong elements: 0" "$WORK/out" && grep -q "^# all_to_all" "$WORK/out" ||
  { echo "FAIL commbench all_to_all: not run, or wrong elements"; failures=$((failures + 1)); }
# Small sizes that round to whole floats per rank alike are measured once: 3, 6 and 12 bytes are all 8 at np 2.
check "commbench small sizes" timeout 120 "${MPIRUN[@]}" -np 2 "$BIN/zshard-commbench" --ops all_gather \
  --min-size 3 --max-size 16 --round-ms 1 --rounds 1
rows=$(grep -cE "^ +8 +2 +float " "$WORK/out")
[ "$rows" = 1 ] || { echo "FAIL commbench small sizes: $rows rows of 8 bytes, want 1"; cat "$WORK/out"; failures=$((failures + 1)); }
# The raw MPI calls count floats in an int: a larger buffer wrapped the count.
"$BIN/zshard-commbench" --max-size 9GiB >"$WORK/out" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q "^zshard-commbench: error: --max-size 9GiB is more than MPI's int count of floats" "$WORK/out" ||
  { echo "FAIL commbench --max-size 9GiB: exit $rc, want 2 and the int count named"; cat "$WORK/out"; failures=$((failures + 1)); }
# A user's own choice of the algorithm reaches the raw column, and is named.
if grep -q "libnbc iallreduce algorithm" "$WORK/comm.out"; then
  check "commbench user algorithm" timeout 120 env OMPI_MCA_coll_libnbc_iallreduce_algorithm=2 "${MPIRUN[@]}" \
    -np 2 "$BIN/zshard-commbench" --ops all_reduce --max-size 1KiB --round-ms 1 --rounds 1
  grep -q "libnbc iallreduce algorithm binomial" "$WORK/out" ||
    { echo "FAIL commbench: the user's OMPI_MCA_coll_libnbc_iallreduce_algorithm=2 not named"; cat "$WORK/out"; failures=$((failures + 1)); }
fi

check "mem 7.5e9" "$BIN/zshard-mem" --params 7.5e9 --dtype mixed --world 1,4,16,64,1024
grep -Eq "zero3 +64 +64 +.*1\.88 GB" "$WORK/out" || { echo "FAIL mem: no 1.88 GB row"; cat "$WORK/out"; failures=$((failures + 1)); }
cp "$WORK/out" "$WORK/mem.out"
check "mem's columns end under their headers" python3 -c "
lines = open('$WORK/mem.out').read().splitlines()
head = next(l for l in lines if l.startswith('strategy'))
row = next(l for l in lines if l.startswith('zero3') and ' 1024 ' in l)
assert head.index('N') + 1 == row.index(' 1024 ') + 5, (head, row)
assert len(head.rstrip()) == len(row.rstrip()), (head, row)  # the last column, total, too
"
check "project" "$BIN/zshard-project" --compute-ms 100 --params 124e6 --units 14 --max-world 64
grep -Eq "^ +64 " "$WORK/out" || { echo "FAIL project: no N=64 row"; failures=$((failures + 1)); }
check "bench zero3 alone" "$BIN/zshard-bench" --model tiny --strategies zero3 --warmup-steps 0 --steps 1 \
  --json "$WORK/zero3-only.json"
expect_failure "project --bench without a ddp result" 2 \
  "^zshard-project: error: --bench .*zero3-only.json: no ddp result with a positive step time" -- \
  "$BIN/zshard-project" --bench "$WORK/zero3-only.json"
# Hybrid asked for where its groups would be ddp's or zero3's: the refusal names which, and what runs.
expect_failure "bench np 3 hybrid over default groups of one" 2 \
  "^zshard-bench: error: --strategies hybrid: by default, groups of one rank are ddp; give groups between 1 and the world, e.g. --shard-group 2,1$" \
  -- "${MPIRUN[@]}" -np 3 "$BIN/zshard-bench" --model tiny --strategies hybrid --steps 1
expect_failure "bench np 2 hybrid --shard-group 2" 2 \
  "^zshard-bench: error: --shard-group 2: one group of the whole world is zero3; a world of 2 has no hybrid$" \
  -- "${MPIRUN[@]}" -np 2 "$BIN/zshard-bench" --model tiny --strategies hybrid --shard-group 2 --steps 1
# Unequal groups: the ranks of the small one issue other collectives than the large one's, and the replay
# of them without compute must still issue the same ones on every rank (it aborted with MPI_ERR_TRUNCATE).
check "bench np 3 hybrid --shard-group 2,1" timeout 120 "${MPIRUN[@]}" -np 3 "$BIN/zshard-bench" --model tiny \
  --strategies hybrid --shard-group 2,1 --warmup-steps 0 --steps 1 --json "$WORK/bench21.json"
check "bench np 3 hybrid 2,1: every rank's replay measured" python3 -c "
import json
r = json.load(open('$WORK/bench21.json'))['results'][0]
assert r['shard_group_sizes'] == [2, 1] and r['comm_ms_per_step']['total'] > 0 < r['comm_ms_per_step']['latency'], r"
# Unequal nodes: hybrid rows per node size in zshard-mem, a cluster table in zshard-project.
check "mem 4,2" "$BIN/zshard-mem" --model gpt2 --strategy zero3,hybrid --shard-group 4,2 --batch 12
grep -Eq "^hybrid +6 +4 .*124\.44 MB" "$WORK/out" && grep -Eq "^hybrid +6 +2 .*248\.88 MB" "$WORK/out" ||
  { echo "FAIL mem 4,2: no row per group size"; cat "$WORK/out"; failures=$((failures + 1)); }
check "project nodes 4,2" "$BIN/zshard-project" --compute-ms 100 --params 124000000 --units 14 --max-world 8 --nodes 4,2
grep -Eq "^ +hybrid +[0-9.]+ " "$WORK/out" && grep -q "cluster of nodes 4,2 (6 ranks" "$WORK/out" ||
  { echo "FAIL project --nodes: no cluster table"; cat "$WORK/out"; failures=$((failures + 1)); }
# The communication modes: zero3's bytes those of comm_volume (int8 gathers, int4 reductions) with
# backward's gathers inside the nodes, at each link's bandwidth; a mode that no strategy listed takes, or
# a secondary shard on nodes of one rank, refused in the runtime's words.
check "project modes" "$BIN/zshard-project" --compute-ms 100 --params 1e9 --units 10 --max-world 16 \
  --quantize-gathers int8 --quantize-reductions int4 --secondary-shard host --inter-all-gather-gbs 11 --nic-per host \
  --json "$WORK/project_modes.json"
check "project modes: comm_volume's bytes, backward's gathers on the intra link" python3 -c "
import json
d = json.load(open('$WORK/project_modes.json'))
assert (d['quantize_gathers'], d['quantize_reductions'], d['secondary_shard'], d['nic_per']) == ('int8', 'int4', 'host', 'host'), d
assert d['inter']['all_gather_gbs'] == 11 and d['inter']['reduce_scatter_gbs'] == 22, d['inter']
row = d['rows'][4]
assert row['world'] == 16  # two nodes of 8
b, psi = row['zero3']['comm_bytes'], 1e9
assert abs(b['gather'] - psi * (1 + 4 / 256) * 15 / 16) < 1, b  # forward's, int8 across the world
assert abs(b['secondary'] - psi * 4 * 7 / 8) < 1, b  # backward's, fp32 inside a node
assert abs(b['reduce'] - psi * (0.5 + 4 / 64) * 15 / 16) < 1, b  # int4 in blocks of 64
# ib (10 us, 22 GB/s; all-gathers at 11) between the nodes, nvlink (3 us, 300 GB/s) inside: 10 units.
ms = (b['gather'] / 11e9 + b['reduce'] / 22e9 + b['secondary'] / 300e9) * 1e3 + 2 * 10 * 15 * 0.010 + 10 * 7 * 0.003
assert abs(row['zero3']['comm_ms'] - ms) < 1e-6, (row['zero3']['comm_ms'], ms)
assert row['ddp']['comm_bytes']['gather'] == 0 and row['hybrid']['comm_bytes']['secondary'] == 0, row"
expect_failure "project: a mode no strategy listed takes" 2 \
  "^zshard-project: error: --quantize-reductions is only for --strategy zero1, zero2, zero3 or hybrid \(ddp all-reduces: no rank owns a shard to sum\)$" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 1e8 --strategies ddp --quantize-reductions int8
expect_one_line "project: a mode no strategy listed takes" "."
expect_failure "project --secondary-shard N" 2 "--secondary-shard 4: zshard-project keeps the secondary shard per node" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 1e8 --secondary-shard 4
expect_failure "project --secondary-shard host on nodes of one rank" 2 \
  "--secondary-shard host: every host runs one rank, so each would keep whole units" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 1e8 --nodes 1,1 --secondary-shard host
expect_one_line "project --secondary-shard host on nodes of one rank" "."
expect_failure "mem groups that do not hold the world" 2 "--shard-group 4,2: the groups hold 6 ranks, the world has 8" -- \
  "$BIN/zshard-mem" --model gpt2 --strategy hybrid --shard-group 4,2 --world 8
expect_failure "mem bad size" 2 "--device-mem" -- "$BIN/zshard-mem" --model gpt2 --device-mem 80furlongs
expect_failure "mem batch below the world" 2 "^zshard-mem: error: --batch 3 is smaller than the world size 4$" -- \
  "$BIN/zshard-mem" --model tiny --batch 3 --world 2,4
python3 -c "
import json
d = json.load(open('$WORK/bench.json'))
json.dump(dict(d, results=[]), open('$WORK/no-results.json', 'w'))
json.dump(dict(d, results=[dict(r, world=-3) for r in d['results']]), open('$WORK/world-3.json', 'w'))"
expect_failure "mem --check of no results" 2 "^zshard-mem: error: --check .*no-results.json: no results to check$" -- \
  "$BIN/zshard-mem" --check "$WORK/no-results.json"
expect_one_line "mem --check of no results" "no results"
expect_failure "mem --check of a world of -3" 2 "^zshard-mem: error: --check .*world-3.json: a result's world is -3, not in \[1, 1048576\]$" -- \
  "$BIN/zshard-mem" --check "$WORK/world-3.json"
# A plan no row can have is refused before the table's first line.
for bad in host 3; do
  expect_failure "mem --secondary-shard $bad at world 4" 2 "^zshard-mem: error: --secondary-shard" -- \
    "$BIN/zshard-mem" --model tiny --world 4 --strategy zero3 --secondary-shard $bad
  [ ! -s "$WORK/out" ] || { echo "FAIL mem --secondary-shard $bad: printed before its error"; cat "$WORK/out"; failures=$((failures + 1)); }
done
expect_failure "project --check of no file" 2 "^zshard-project: error: --check .*no-such.json: cannot read" -- \
  "$BIN/zshard-project" --compute-ms 100 --params 1e8 --check "$WORK/no-such.json"
[ ! -s "$WORK/out" ] || { echo "FAIL project --check of no file: printed before its error"; cat "$WORK/out"; failures=$((failures + 1)); }
# --check: Karp-Flatt at the largest world whatever the files' order; a file of other work is refused; a
# --bench of two micro-steps has zero3 gather twice (files made from bench.json, their ddp times set).
python3 -c "
import json
d = json.load(open('$WORK/bench.json'))
ddp = d['results'][0]
for world, ms in ((1, 12.0), (2, 7.0), (4, 5.0)):
    r = dict(ddp, world=world, step_ms=dict(ddp['step_ms'], median=ms))
    json.dump(dict(d, world=world, results=[r]), open('$WORK/np%d.json' % world, 'w'))
json.dump(dict(d, world=2, batch=d['batch'] * 2, results=[dict(ddp, world=2)]), open('$WORK/np2-other.json', 'w'))
json.dump(dict(d, world=2, batch=d['batch'] // 2, grad_accum=2, results=[dict(ddp, world=2)]), open('$WORK/np2-split.json', 'w'))
json.dump(dict(d, world=1, grad_accum=2, results=[dict(ddp, world=1)]), open('$WORK/np1-accum2.json', 'w'))"
for order in np2.json,np4.json np4.json,np2.json; do
  check "project --check $order" "$BIN/zshard-project" --bench "$WORK/np1.json" --scaling strong --max-world 4 \
    --check "$WORK/${order%%,*}","$WORK/${order##*,}"
  grep -o "Amdahl s=[0-9.]*" "$WORK/out" >"$WORK/serial-$order"
done
# Karp-Flatt at np 4: 12 / 5 = 2.4 times faster, s = (1/2.4 - 1/4) / (1 - 1/4) = 0.222 (np 2's is 0.167).
check "project --check: the serial fraction of the largest world, in either order" \
  test "$(cat "$WORK/serial-np2.json,np4.json" "$WORK/serial-np4.json,np2.json" | grep -cx "Amdahl s=0.222")" = 2
expect_failure "project --check of other work" 2 \
  "^zshard-project: error: --check .*np2-other.json: measured at a step of sequences [0-9]+, the projection's is [0-9]+ \(strong scaling compares the same work\)$" -- \
  "$BIN/zshard-project" --bench "$WORK/np1.json" --scaling strong --check "$WORK/np2-other.json"
expect_failure "project --check of the same sequences in other micro-steps" 2 \
  "^zshard-project: error: --check .*np2-split.json: measured at --grad-accum 2, the projection's is 1 \(strong scaling compares the same work\)$" -- \
  "$BIN/zshard-project" --bench "$WORK/np1.json" --scaling strong --check "$WORK/np2-split.json"
# Strong scaling ends where a rank would hold less than a sequence of the micro-step; a file's counts are
# refused as the file writes them, and another tool's JSON as not zshard-bench's.
check "project strong scaling past the batch" "$BIN/zshard-project" --compute-ms 100 --params 1e8 --batch 4 \
  --scaling strong --max-world 64
[ "$(grep -cE "^ +(1|2|4) +[0-9]" "$WORK/out")" = 3 ] && ! grep -qE "^ +8 +[0-9]" "$WORK/out" &&
  grep -q "no row past N = 4" "$WORK/out" ||
  { echo "FAIL project strong scaling: rows past the batch of 4"; cat "$WORK/out"; failures=$((failures + 1)); }
python3 -c "
import json
d = json.load(open('$WORK/np1.json'))
json.dump(dict(d, model=dict(d['model'], params=1e300)), open('$WORK/huge-params.json', 'w'))"
expect_failure "project --bench of params 1e300" 2 \
  "^zshard-project: error: --bench .*huge-params.json: model params is 1e\+300, not a whole number up to" -- \
  "$BIN/zshard-project" --bench "$WORK/huge-params.json"
"$BIN/zshard-project" --bench "$WORK/np1.json" --max-world 2 --json "$WORK/proj1.json" >/dev/null
check "project --bench of two micro-steps" "$BIN/zshard-project" --bench "$WORK/np1-accum2.json" --max-world 2 \
  --json "$WORK/proj2.json"
grep -q "for [0-9]* x 2 sequences" "$WORK/out" ||
  { echo "FAIL project --bench of two micro-steps: the header does not say x 2"; cat "$WORK/out"; failures=$((failures + 1)); }
check "... zero3 gathers and reduces in each micro-step" python3 -c "
import json
one, two = (json.load(open('$WORK/proj%d.json' % k))['rows'][1]['zero3']['comm_bytes'] for k in (1, 2))
assert two['gather'] == 2 * one['gather'] and two['reduce'] == 2 * one['reduce'], (one, two)"
expect_failure "mem grad-accum 0" 2 "--grad-accum must be >= 1, got 0" -- "$BIN/zshard-mem" --model tiny --grad-accum 0
# --grad-accum adds the accumulation scratch (comm) and nothing else, as zshard-train measures it.
"$BIN/zshard-mem" --model tiny --world 2 --strategy zero2 --json "$WORK/accum1.json" >/dev/null
"$BIN/zshard-mem" --model tiny --world 2 --strategy zero2 --grad-accum 2 --json "$WORK/accum2.json" >/dev/null
check "mem --grad-accum 2 counts the scratch" python3 -c "
import json
one, two = json.load(open('$WORK/accum1.json'))['rows'][0], json.load(open('$WORK/accum2.json'))['rows'][0]
assert two['comm_buffer_bytes'] > one['comm_buffer_bytes'], (one, two)
assert two['total_bytes'] - one['total_bytes'] == two['comm_buffer_bytes'] - one['comm_buffer_bytes'], (one, two)
"
finish
