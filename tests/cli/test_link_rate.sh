# shellcheck shell=bash
# scripts/multihost.sh --link-rate: a bad rate is refused in one line, and a link shaped to 100mbit brings
# zshard-commbench's all-reduce bus bandwidth between two hosts down to about that rate, far below the
# unshaped link's. Exit 77 (skipped) where the hosts cannot be made.
# zshard-test-seconds: 15
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/checkpoint_lib.sh"
MULTIHOST=(bash "$ZSHARD_SRC/scripts/multihost.sh" --hosts "1,1")

for rate in 1gbps 1e9bit 5mbit 200gbit fast ""; do
  expect_failure "--link-rate '$rate'" 2 "^multihost: bad --link-rate '$rate': want 10mbit to 100gbit" -- \
    "${MULTIHOST[@]}" --link-rate "$rate" -- true
  expect_one_line "--link-rate '$rate'" "bad --link-rate"
done

# all_reduce_busbw NAME [MULTIHOST FLAGS...]: zshard-commbench's all-reduce bus bandwidth (GB/s) at 1 MiB
# between the two hosts, in $busbw. One rank per host, so every byte crosses the link; at 100mbit the
# sweep moves about 12 MiB each way (1 s).
all_reduce_busbw() {
  local name=$1
  shift
  rm -f "$WORK/comm.json"
  timeout 120 "${MULTIHOST[@]}" "$@" -- "$ZSHARD_BIN/zshard-commbench" --ops all_reduce --min-size 1MiB \
    --max-size 1MiB --rounds 1 --round-ms 200 --json "$WORK/comm.json" >"$WORK/out" 2>"$WORK/err"
  local code=$?
  if [ $code = 77 ]; then
    echo "skipped: $(cat "$WORK/err")"
    exit 77
  fi
  busbw=$(python3 -c 'import json, sys; print("%.6f" % json.load(open(sys.argv[1]))["rows"][0]["busbw"])' \
    "$WORK/comm.json" 2>/dev/null)
  expect_true "$name: commbench ran (exit $code), busbw $busbw GB/s" test $code = 0 -a -n "$busbw"
}
all_reduce_busbw "unshaped"
unshaped=$busbw
all_reduce_busbw "100mbit" --link-rate 100mbit
# At n = 2 the all-reduce's bus bandwidth is what crosses the link each way: 100mbit is 0.0125 GB/s.
# Bounds from a quarter of the rate to 1.5 times it, as a busy machine can slow the ranks and the
# bucket's burst (10 ms of the rate) can run ahead of it.
expect_true "100mbit: busbw $busbw GB/s within 0.25x to 1.5x of 0.0125" \
  test "$(echo "$busbw >= 0.003125 && $busbw <= 0.01875" | bc)" = 1
expect_true "100mbit: busbw $busbw GB/s at most half the unshaped $unshaped" \
  test "$(echo "$busbw <= $unshaped / 2" | bc -l)" = 1

# A host started again by the control script has its link shaped as before.
# shellcheck disable=SC2016  # expanded on the head host
expect_ok "restart hostb on a 100mbit link" "${MULTIHOST[@]}" --head --link-rate 100mbit -- sh -c '
  "$MULTIHOST_CONTROL" kill hostb && "$MULTIHOST_CONTROL" start hostb &&
  nsenter -t "$("$MULTIHOST_CONTROL" pids hostb | head -n 1)" -n tc qdisc show dev eth0'
expect_true "the restarted hostb sends through a 100mbit bucket" \
  grep -q "^qdisc tbf .* rate 100Mbit" "$WORK/out"

finish
