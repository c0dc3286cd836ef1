# `cmake --install` gives a package that an outside project finds with find_package(zshard), builds its
# own model against and trains with it.
source "$(dirname "$0")/lib.sh"
cmake --install "$ZSHARD_BIN" --prefix "$WORK/prefix" >/dev/null || { echo "FAIL install"; exit 1; }
cmake -S "$ZSHARD_SRC/examples/own_model" -B "$WORK/example" -DCMAKE_PREFIX_PATH="$WORK/prefix" >"$WORK/log" 2>&1 \
  || { cat "$WORK/log"; echo "FAIL configure"; exit 1; }
cmake --build "$WORK/example" >"$WORK/log" 2>&1 || { cat "$WORK/log"; echo "FAIL build"; exit 1; }
"$WORK/example/own_model" || failures=$((failures + 1))
"${MPIRUN[@]}" -np 2 "$WORK/example/own_model" zero3 || failures=$((failures + 1))
"${MPIRUN[@]}" -np 2 "$WORK/example/own_model" ddp || failures=$((failures + 1))
finish
