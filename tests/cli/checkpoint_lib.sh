# Helpers of the checkpoint command-line tests (sourced after lib.sh).
EXPORT="$ZSHARD_BIN/zshard-export"
ARGS=(--batch 8 --seq 32 --log-every 1000)

# expect_ok NAME COMMAND...: the command exits 0 within 120 s; its output stays in $WORK/out, $WORK/err.
expect_ok() {
  local name=$1
  shift
  if timeout 120 "$@" >"$WORK/out" 2>"$WORK/err"; then
    echo "ok   $name"
  else
    echo "FAIL $name: exit $?"
    cat "$WORK/err"
    failures=$((failures + 1))
  fi
}

# expect_true NAME TEST...: the test command succeeds.
expect_true() {
  local name=$1
  shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; failures=$((failures + 1)); fi
}

# same_losses NAME REFERENCE.json RUN.json TOL: every step of RUN (--log-json) has the reference's loss,
# as the same text when TOL is 0 (bit-identical doubles print alike), else within TOL relative.
same_losses() {
  if awk -v tol="$4" '
      { match($0, /"loss":[^,}]*/); loss = substr($0, RSTART + 7, RLENGTH - 7)
        match($0, /"step":[0-9]+/); step = substr($0, RSTART + 7, RLENGTH - 7) }
      FNR == NR { want[step] = loss; next }
      { n++
        d = loss - want[step]; if (d < 0) d = -d
        scale = want[step] < 0 ? -want[step] : want[step]
        if (!(step in want) || (tol == 0 ? loss != want[step] : d > tol * scale)) {
          bad++; print "  step " step ": loss " loss ", uninterrupted " want[step] } }
      END { exit (bad > 0 || n == 0) }' "$2" "$3"; then
    echo "ok   $1"
  else
    echo "FAIL $1 (losses differ, or none)"
    failures=$((failures + 1))
  fi
}

# The pids of a process's children (the ranks of an mpirun), one a line in pid order, without procps.
# /proc/PID/task/*/children is not used: the kernel documents it as reliable only for a stopped process.
children_of() {
  local stat rest
  for stat in /proc/[0-9]*/stat; do
    { read -r rest <"$stat"; } 2>/dev/null || continue  # gone since the glob
    rest=${rest##*) }  # past the command name, which may hold spaces and parentheses
    rest=${rest#* }    # past the state: the parent pid comes next
    [ "${rest%% *}" = "$1" ] && { stat=${stat#/proc/}; echo "${stat%/stat}"; }
  done | sort -n
}

# The processes of session SID (a job zshard-run started: mpirun and its ranks, whatever their process
# groups), one pid a line.
session_pids() {
  local stat rest
  for stat in /proc/[0-9]*/stat; do
    { read -r rest <"$stat"; } 2>/dev/null || continue
    rest=${rest##*) }
    read -r _ _ _ rest <<<"$rest"  # past the state, the parent pid and the process group
    [ "${rest%% *}" = "$1" ] && { stat=${stat#/proc/}; echo "${stat%/stat}"; }
  done
}

# The ranks under PID (mpirun's tree, remote daemons' included), as "PID WORLD_RANK" lines.
rank_pids() {
  local p r
  for p in $(children_of "$1"); do
    r=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$r" ] && echo "$p $r"
    rank_pids "$p"
  done
}

# wait_for SECONDS TEST...: polls until the test succeeds; false on timeout.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.05
  done
}

# expect_every_rank_fails NAME CODE REGEX -- ARGS...: zshard-train ARGS on 2 ranks ends within 60 s with
# exit code CODE on every rank and a stderr of one line, matching REGEX. mpirun's own status cannot show
# that every rank failed (one failing rank makes it non-zero, and it then kills the others), so each rank
# runs under a shell that records the rank's code and exits 0. RANK_PRELUDE, when set, is shell code that
# shell runs first, with the rank in $OMPI_COMM_WORLD_RANK and the command in "$@" (a rank's own flags).
expect_every_rank_fails() {
  local name=$1 want=$2 regex=$3
  shift 4
  rm -rf "$WORK/rc" && mkdir "$WORK/rc"
  local start=$SECONDS
  timeout 60 "${MPIRUN[@]}" -np 2 env RC="$WORK/rc" WORK="$WORK" \
    bash -c "${RANK_PRELUDE:-}"$'\n''"$@"; echo $? >"$RC/$OMPI_COMM_WORLD_RANK"' _ "$TRAIN" "$@" >"$WORK/out" 2>"$WORK/err"
  local code=$? took=$((SECONDS - start)) codes problem=""
  codes=$(cat "$WORK/rc/0" "$WORK/rc/1" 2>/dev/null | tr '\n' ' ')
  if [ "$code" = 124 ]; then problem="still running after 60 s (hang)"
  elif [ "$codes" != "$want $want " ]; then problem="rank exit codes: ${codes:-none}; want $want on both"
  elif [ "$(wc -l <"$WORK/err")" != 1 ] || ! grep -Eq -- "$regex" "$WORK/err"; then
    problem="stderr is not one line matching /$regex/"
  fi
  if [ -z "$problem" ]; then
    echo "ok   $name (exit $want on every rank, ${took}s)"
  else
    echo "FAIL $name: $problem"
    cat "$WORK/err"
    failures=$((failures + 1))
  fi
}
