# shellcheck shell=bash
# The build archive of scripts/gpu-acceptance.sh (sourced by it, which sets REPO, KEPT, TARGETS, BUDGET,
# ...): the built files the GPU steps run, split into parts, keyed by the sources; and the build machine's
# commands around a call (prepare, keep-build, pack), whose usage is in gpu-acceptance.sh's header.

# A hash of what the build reads, over the files a call sends: here git's tracked and untracked-not-ignored
# files (an ignored file here is not there); there, with no .git, every file.
source_key() {
  local paths=(CMakeLists.txt cmake include kernels comm shard models runtime tests/unit tests/support
               tests/CMakeLists.txt) f
  (cd "$REPO" || exit 1
   if [ "$(git rev-parse --show-toplevel 2>/dev/null)" -ef . ]; then
     git ls-files -z --cached --others --exclude-standard -- "${paths[@]}"
   else
     find "${paths[@]}" -type f -print0 2>/dev/null
   fi | while IFS= read -r -d '' f; do
     # A tracked file deleted here is not sent; a link is not hashed on either side.
     [ -f "$f" ] && [ ! -L "$f" ] && printf '%s\0' "$f"
   done | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
}
# archive_key DIR: the source key DIR's archive parts were made from, empty when there are none.
archive_key() {
  cat "$1"/build-gpu.tar.gz.* 2>/dev/null | tar -xzOf - SOURCE_KEY 2>/dev/null
}
# pack_build BUILD_DIR DEST_DIR KEY: BUILD_DIR's libraries and the targets' executables as DEST/build-gpu.tar.gz.NN
pack_build() {
  local dir=$1 dest=$2 key=$3 files t
  files=$(cd "$dir" && { ls libzshard_*.so* 2>/dev/null; for t in $TARGETS_LIST; do ls "$t" "tests/$t" 2>/dev/null; done; })
  [ -n "$files" ] || { echo "pack_build: nothing built in $dir" >&2; return 1; }
  echo "$key" >"$dir/SOURCE_KEY"
  # shellcheck disable=SC2086
  tar -C "$dir" -czf - SOURCE_KEY $files | split -b "$PART_BYTES" -d - "$dest/build-gpu.tar.gz."
  ls -l "$dest"/build-gpu.tar.gz.* | awk '{print "  " $NF ": " $5 " bytes"}'
}
# unpack_build SRC_DIR BUILD_DIR KEY: true when SRC's parts hold a build of these sources, unpacked
unpack_build() {
  local src=$1 dir=$2 key=$3
  ls "$src"/build-gpu.tar.gz.* >/dev/null 2>&1 || return 1
  mkdir -p "$dir"
  cat "$src"/build-gpu.tar.gz.* | tar -C "$dir" -xzf - || return 1
  [ "$(cat "$dir/SOURCE_KEY" 2>/dev/null)" = "$key" ]
}
export -f source_key archive_key pack_build unpack_build

# keep_build FILES_AT_DIR: the build archive a call returned, into .gpubuild for the next call.
keep_build() {
  local src=${1:?"keep-build needs the reply's files_at folder"}
  ls "$src"/build-gpu.tar.gz.* >/dev/null 2>&1 || { echo "keep-build: no build-gpu.tar.gz.* in $src" >&2; return 1; }
  rm -rf "$KEPT" && mkdir -p "$KEPT" && cp "$src"/build-gpu.tar.gz.* "$KEPT"/
  echo "keep-build: $(du -sh "$KEPT" | cut -f1) in $KEPT; carry it: carry=[\".gpudeps\", \".gpubuild\"]"
}

# pack CUDA_BUILD_DIR: the targets built there, archived into .gpubuild, keyed by this tree's sources.
pack() {
  local dir=${1:?"pack needs a CUDA build folder"} cache archs
  case $dir in /*) ;; *) dir=$CALLER_DIR/$dir ;; esac
  cache=$dir/CMakeCache.txt
  # The archive is keyed by this tree's sources: the build must be of this tree, with the CUDA path, in
  # Release (the gpt2 and profile figures) and for sm_90 (the default; an explicit list must hold 90).
  [ -f "$cache" ] || { echo "pack: $dir is not a CMake build folder" >&2; return 1; }
  [ "$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")" -ef "$REPO" ] ||
    { echo "pack: $dir is a build of another source tree, not of $REPO" >&2; return 1; }
  grep -q '^CMAKE_CUDA_FLAGS:STRING=' "$cache" ||  # in the cache once CUDA is enabled (ON, or AUTO with nvcc)
    { echo "pack: $dir is not a build with the CUDA path (-DZSHARD_CUDA=ON)" >&2; return 1; }
  grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$cache" || { echo "pack: $dir is not a Release build" >&2; return 1; }
  archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:STRING=//p' "$cache")
  [ -z "$archs" ] || [[ ";$archs;" == *";90"* ]] ||
    { echo "pack: $dir is built for CUDA architectures $archs, without sm_90" >&2; return 1; }
  cmake --build "$dir" --target "${TARGETS[@]}" || { echo "pack: building the targets in $dir failed" >&2; return 1; }
  rm -rf "$KEPT" && mkdir -p "$KEPT" && pack_build "$dir" "$KEPT" "$(source_key)"
}

CARRY_LIMIT=$((64 * 1024 * 1024))  # what the device tool carries in all
# prepare: what the call carries is of this tree and fits; prints the call.
prepare() {
  local kept_key tree_key tree deps kept_bytes=0 total carry cmd timeout_s
  # An archive of other sources would be rebuilt there, at the cost of most of the call: refused here.
  if [ -d "$KEPT" ]; then
    kept_key=$(archive_key "$KEPT") tree_key=$(source_key)
    [ "$kept_key" = "$tree_key" ] || {
      echo "prepare: .gpubuild is a build of other sources (${kept_key:-no key}) than this tree's ($tree_key): pack this tree again (pack BUILD) or delete .gpubuild" >&2
      return 1
    }
  else
    echo "prepare: no .gpubuild: the call builds first (up to ${BUILD_LIMIT} s of its ${BUDGET} s); pack BUILD where nvcc is spares that"
  fi
  [ -f .gpudeps/MANIFEST ] || bash scripts/gpu-bundle.sh || return 1
  # What a call sends: tracked and untracked-not-ignored files, and the carried folders.
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
  deps=$(du -sb .gpudeps | cut -f1)
  [ -d "$KEPT" ] && kept_bytes=$(du -sb "$KEPT" | cut -f1)
  total=$((tree + deps + kept_bytes))
  printf 'carry: tree %d + .gpudeps %d + .gpubuild %d = %d bytes of %d (%d%%)\n' "$tree" "$deps" "$kept_bytes" \
    "$total" "$CARRY_LIMIT" $((100 * total / CARRY_LIMIT))
  [ "$total" -le "$CARRY_LIMIT" ] || { echo "prepare: over the device tool's 64 MiB; drop .gpubuild or shrink the tree" >&2; return 1; }
  carry='".gpudeps"'
  [ -d "$KEPT" ] && carry='".gpudeps", ".gpubuild"'
  # The budget and step list given here are the call's; its time-out leaves the budget some slack, within
  # the 600 s a command may run.
  timeout_s=$((BUDGET + 50))
  [ "$timeout_s" -le 600 ] ||
    { echo "prepare: ZSHARD_GPU_BUDGET_S=$BUDGET does not fit a command's 600 s with 50 s to spare" >&2; return 2; }
  cmd="bash scripts/gpu-acceptance.sh"
  [ -z "${ZSHARD_GPU_STEPS:-}" ] || cmd="ZSHARD_GPU_STEPS='$ZSHARD_GPU_STEPS' $cmd"
  [ -z "${ZSHARD_GPU_BUDGET_S:-}" ] || cmd="ZSHARD_GPU_BUDGET_S=$BUDGET $cmd"
  echo "run(command=\"$cmd\", carry=[$carry], timeout_s=$timeout_s)"
}
