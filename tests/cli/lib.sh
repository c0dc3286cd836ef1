# Shared helpers for the command-line tests (sourced by tests/cli/test_*.sh).
set -u
TRAIN="$ZSHARD_BIN/zshard-train"
MPIRUN=("$MPIEXEC" --oversubscribe --bind-to none)
failures=0
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# expect_failure NAME EXIT_CODE REGEX -- COMMAND...: the command must exit with EXIT_CODE ("nonzero" for
# any non-zero code) within 60 s, and its stderr must match REGEX.
expect_failure() {
  local name=$1 want=$2 regex=$3
  shift 4
  local start=$SECONDS
  timeout 60 "$@" >"$WORK/out" 2>"$WORK/err"
  local code=$? took=$((SECONDS - start))
  local ok=1
  if [ "$code" = 124 ]; then ok=0; echo "FAIL $name: still running after 60 s (hang)";
  elif [ "$want" = nonzero ] && [ "$code" = 0 ]; then ok=0; echo "FAIL $name: exit 0, want non-zero";
  elif [ "$want" != nonzero ] && [ "$code" != "$want" ]; then ok=0; echo "FAIL $name: exit $code, want $want"; fi
  if ! grep -Eq -- "$regex" "$WORK/err"; then ok=0; echo "FAIL $name: stderr does not match /$regex/:"; cat "$WORK/err"; fi
  if [ $ok = 1 ]; then echo "ok   $name (exit $code, ${took}s)"; else failures=$((failures + 1)); fi
}

# expect_one_line NAME REGEX: the last command's stderr has exactly one line matching REGEX.
expect_one_line() {
  local n
  n=$(grep -Ec -- "$2" "$WORK/err")
  if [ "$n" != 1 ]; then echo "FAIL $1: $n lines match /$2/, want exactly one"; failures=$((failures + 1)); fi
}

finish() {
  echo "$failures failed"
  [ "$failures" = 0 ]
}

# comm_as_theory: every "communication per step per rank" line of the memory report in $WORK/out (one per
# prediction: unequal shard or secondary groups reduce and gather over different numbers of ranks) has the
# measured bytes within 0.2% of the theory, which counts real elements where the wire also carries each
# unit's padding (tests/mpi/test_comm_volume.cpp), and there is one line at least.
comm_as_theory() {
  grep '^communication per step per rank' "$WORK/out" | awk '
    { n++; m = $0; sub(/.*measured /, "", m); t = $0; sub(/.*theory /, "", t)
      split(m, mp, "[ ,]+"); split(t, tp, "[ ,]+")
      if (mp[2] != tp[2] || (mp[1] - tp[1]) ^ 2 > (0.002 * tp[1] + 0.001) ^ 2) bad++ }
    END { exit !(n >= 1 && bad == 0) }'
}
