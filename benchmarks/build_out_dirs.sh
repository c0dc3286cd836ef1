# Sourced by the multihost benchmarks (network_sweep.sh, quantized_comm.sh), which take BUILD_DIR OUT_DIR
# and run from other directories inside the hosts' namespaces: checks the two arguments and sets build,
# out and src (the checkout) as absolute paths, creating OUT_DIR.
#   build_out_dirs BINARY WHAT "$@"   (WHAT: the binaries BUILD_DIR must hold, for the usage line)
# shellcheck shell=bash disable=SC2034  # the variables are the caller's
build_out_dirs() {
  local binary=$1 what=$2
  shift 2
  if [ $# != 2 ] || [ ! -x "$1/$binary" ]; then
    echo "usage: $0 BUILD_DIR OUT_DIR (BUILD_DIR with $what)" >&2
    exit 2
  fi
  build=$(cd "$1" && pwd)
  mkdir -p "$2"
  out=$(cd "$2" && pwd)
  src=$(cd "$(dirname "$0")/.." && pwd)
}
