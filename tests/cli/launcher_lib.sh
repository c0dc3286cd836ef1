# shellcheck shell=bash
# Helpers of the zshard-run tests (sourced after lib.sh and checkpoint_lib.sh).
# shellcheck disable=SC2034  # for the tests that source this file
RUN="$ZSHARD_BIN/zshard-run"

# field KEY: the value of KEY in the one-line JSON object on stdin ("hostb" quotes and all for a string).
field() { sed -n "s/.*\"$1\":\(\"[^\"]*\"\|\[[^]]*\]\|[^,}]*\).*/\1/p"; }

# steps FILE: the steps of a --log-json file, space separated, in file order.
steps() { grep -o '"step":[0-9]*' "$1" | cut -d: -f2 | tr '\n' ' '; }

# step_logged STEP FILE: FILE (a --step-log) holds STEP's record.
step_logged() { grep -qs "\"step\":$1," "$2"; }

# ended_well NAME: zshard-run, started in the background as $run, exits 0; returns its exit code.
ended_well() {
  wait "$run"
  local code=$?
  expect_true "$1: the job ended well (exit $code)" test $code = 0
  return $code
}
