# shellcheck shell=bash
# Helpers of the zshard-run tests (sourced after lib.sh and checkpoint_lib.sh).
RUN="$ZSHARD_BIN/zshard-run"

# field KEY: the value of KEY in the one-line JSON object on stdin ("hostb" quotes and all for a string).
field() { sed -n "s/.*\"$1\":\(\"[^\"]*\"\|\[[^]]*\]\|[^,}]*\).*/\1/p"; }

# steps FILE: the steps of a --log-json file, space separated, in file order.
steps() { grep -o '"step":[0-9]*' "$1" | cut -d: -f2 | tr '\n' ' '; }

# step_logged STEP FILE: FILE (a --step-log) holds STEP's record.
step_logged() { grep -qs "\"step\":$1," "$2"; }
