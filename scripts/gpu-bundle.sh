#!/usr/bin/env bash
# Builds .gpudeps/: the Debian 12 (bookworm) .deb files that zshard needs to build and run on a GPU
# machine that has nvcc, CMake, ninja and python3 + PyTorch but no OpenMPI, OpenBLAS, nlohmann-json, CLI11
# or GoogleTest development files, no apt and no network. Run it HERE (a Debian 12 machine with apt);
# ship the folder with the working tree to the GPU machine; there, `source scripts/gpu-setup.sh` unpacks
# it with dpkg-deb -x into a prefix (never into /) and sets the environment.
#
#   scripts/gpu-bundle.sh            download the .debs into .gpudeps/ (idempotent), print the size
#   scripts/gpu-bundle.sh check      prove the bundle on this machine with the system copies hidden:
#                                    in a private mount namespace, /usr and /etc are overlays from which
#                                    every file of the bundled packages, of the optional OpenMPI transports
#                                    (libfabric, UCX, verbs, PSM, libnl, ...) and of ssh is deleted; then
#                                    gpu-setup.sh unpacks into a temporary prefix, `mpirun -np 2 hostname`
#                                    and a 2-rank MPI program run, and zshard is configured (CUDA on when
#                                    nvcc and NCCL are found) against the prefix only. CHECK_BUILD=1 also
#                                    builds it, trains the tiny model (2 ranks, and a singleton) and runs
#                                    the whole ctest suite (about 15 minutes on 2 cores).
#   scripts/gpu-bundle.sh all        both
#
# What is in the bundle (the minimal closure; `apt-cache depends` asks for much more):
#   OpenMPI 4.1.4: openmpi-bin, libopenmpi3, libopenmpi-dev, openmpi-common, and the libraries that
#     libmpi/libopen-pal/libopen-rte/libpmix/orterun themselves link (readelf NEEDED): libpmix2, libmunge2
#     (libpmix.so.2 links libmunge.so.2), libhwloc15, libevent-core-2.1-7, libevent-pthreads-2.1-7.
#     Left out on purpose: libfabric1, libucx0, libibverbs1, librdmacm1, libpsm2-2, libpsm-infinipath1,
#     libnl-3-200, libhwloc-plugins (with their own closures). Only MCA plugins link them (btl ofi/openib,
#     mtl ofi/psm/psm2, pml/osc/spml/atomic/sshmem ucx, reachable netlink); gpu-setup.sh deletes every
#     plugin whose libraries do not resolve, and selects --mca pml ob1 / btl self,vader (shared memory),
#     which is all a single-node job needs. openssh-client is left out too: gpu-setup points
#     plm_rsh_agent at `false` (mpirun only forks local ranks; it never uses ssh on one node).
#   OpenBLAS 0.3.21 (pthread flavour): libopenblas0-pthread, libopenblas-pthread-dev (cblas.h).
#   Header-only / static: nlohmann-json3-dev, libcli11-dev, libxxhash-dev (xxhash.h, used header-only),
#     libgtest-dev + libgmock-dev (prebuilt static libraries and CMake config; the unit tests include
#     <gmock/gmock.h>).
#   Fallbacks, unpacked only where the GPU machine lacks the library (checked with ldconfig -p):
#     libgfortran5 + libquadmath0 (OpenBLAS links libgfortran.so.5), libudev1 (libhwloc), zlib1g.
#
# Limits, honestly:
#   - These are Debian 12 binaries (glibc 2.36, GCC 12 runtime) on an Ubuntu 24.04-like image (glibc 2.39,
#     GCC 13/14 runtime): newer glibc/libstdc++ run older binaries, so this works in that direction only.
#   - `check` hides the packages' files but not everything else Debian has that Ubuntu may not; the
#     libraries resolved from the system in the check are listed, and all are in any Ubuntu base image
#     (libc, libstdc++, libgcc_s, libz, ...), except those the fallbacks cover.
#   - Nothing here can test the GPU side: CUDA, cuBLAS and NCCL come from the GPU machine (gpu-setup.sh
#     falls back to PyTorch's pip NCCL when the toolkit has none), and OpenMPI is built without CUDA
#     awareness: zshard's mpi backend stages device buffers through the host (comm/mpi_communicator.cpp).
#   - OpenMPI relocation relies on OPAL_PREFIX (it works because Debian configured every directory under
#     ${prefix}, except sysconfdir /etc/openmpi, which is simply absent there).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
dest=$repo/.gpudeps

core=(openmpi-bin libopenmpi3 libopenmpi-dev openmpi-common
      libpmix2 libmunge2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7
      libopenblas0-pthread libopenblas-pthread-dev
      nlohmann-json3-dev libcli11-dev libxxhash-dev libgtest-dev libgmock-dev)
# package:soname -- unpacked by gpu-setup.sh only where the system has no such library.
fallback=(libgfortran5:libgfortran.so.5 libquadmath0:libquadmath.so.0 libudev1:libudev.so.1 zlib1g:libz.so.1)
# Hidden by `check` besides the bundled packages: what the GPU image does not have either.
hidden_extra=(libfabric1 libucx0 libibverbs1 ibverbs-providers librdmacm1 libpsm2-2 libpsm-infinipath1
              libnl-3-200 libnl-route-3-200 libhwloc-plugins libhwloc-dev libpmix-dev libevent-dev
              libevent-2.1-7 libevent-extra-2.1-7 libevent-openssl-2.1-7 libibverbs-dev libnl-3-dev
              libnl-route-3-dev libopenblas0 libopenblas-dev libopenblas0-serial libopenblas0-openmp
              libopenblas-serial-dev libopenblas-openmp-dev libblas3 libblas-dev liblapack3 liblapack-dev
              googletest libcoarrays-openmpi-dev libcaf-openmpi-3 libgfortran-12-dev gfortran gfortran-12
              openssh-client)

download() {
  mkdir -p "$dest"
  local specs=() p ver
  for p in "${core[@]}" "${fallback[@]%%:*}"; do
    # The version installed here when there is one (the one `check` and the CPU CI test), else the candidate.
    ver=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)
    [ -n "$ver" ] || ver=$(apt-cache policy "$p" | awk '/Candidate:/{print $2}')
    [ -n "$ver" ] && [ "$ver" != "(none)" ] || { echo "gpu-bundle: no version of $p in apt" >&2; exit 1; }
    specs+=("$p=$ver")
  done
  local missing=()
  for s in "${specs[@]}"; do
    p=${s%%=*}; ver=${s#*=}
    ls "$dest/${p}_${ver/:/%3a}_"*.deb >/dev/null 2>&1 || missing+=("$s")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    (cd "$dest" && apt-get download -qq "${missing[@]}" 2>&1 | grep -v "unsandboxed" || true)
  fi
  # Keep exactly the wanted files (an older version of a package is removed).
  local keep=()
  for s in "${specs[@]}"; do
    p=${s%%=*}; ver=${s#*=}
    f=$(ls "$dest/${p}_${ver/:/%3a}_"*.deb 2>/dev/null | head -1 || true)
    [ -n "$f" ] || { echo "gpu-bundle: download of $s failed" >&2; exit 1; }
    keep+=("$(basename "$f")")
  done
  for f in "$dest"/*.deb; do
    printf '%s\n' "${keep[@]}" | grep -qxF "$(basename "$f")" || rm -f "$f"
  done
  {
    echo "# package version file sha256 -- written by scripts/gpu-bundle.sh on $(date -u +%F) from Debian $(cat /etc/debian_version)"
    for f in "${keep[@]}"; do
      echo "$(dpkg-deb -f "$dest/$f" Package) $(dpkg-deb -f "$dest/$f" Version) $f $(sha256sum "$dest/$f" | cut -d' ' -f1)"
    done
  } >"$dest/MANIFEST"
  printf '%s\n' "${fallback[@]}" >"$dest/FALLBACK"
  echo "gpu-bundle: ${#keep[@]} packages in $dest, $(du -sh "$dest" | cut -f1) ($(du -sb "$dest" | cut -f1) bytes)"
}

# The check, run inside a private mount namespace (see the header).
check_inside() {
  local tmp=$1 p f
  for d in usr etc; do
    mkdir -p "$tmp/ov/$d/up" "$tmp/ov/$d/work" "$tmp/ov/$d/merged"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$tmp/ov/$d/up,workdir=$tmp/ov/$d/work" "$tmp/ov/$d/merged"
  done
  local hidden=0
  # zlib1g stays: every Ubuntu image has it, and so do dpkg-deb and cmake here.
  for p in "${core[@]}" libgfortran5 libquadmath0 libudev1 "${hidden_extra[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || continue
    while IFS= read -r f; do
      case $f in /lib/*|/lib64/*|/bin/*|/sbin/*) f=/usr$f ;; esac  # merged /usr
      case $f in /usr/*|/etc/*) ;; *) continue ;; esac
      local top=${f#/}
      local in=$tmp/ov/${top%%/*}/merged/${top#*/}
      if [ -f "$in" ] || [ -L "$in" ]; then rm -f "$in"; hidden=$((hidden + 1)); fi
    done < <(dpkg -L "$p")
  done
  # Alternatives that point into the hidden packages (mpirun, libblas.so.3, ...) dangle now: remove them.
  find "$tmp/ov/usr/merged" "$tmp/ov/etc/merged/alternatives" -xtype l -delete 2>/dev/null || true
  mount --bind "$tmp/ov/usr/merged" /usr
  mount --bind "$tmp/ov/etc/merged" /etc
  ldconfig -C "$tmp/ld.so.cache" 2>/dev/null && mount --bind "$tmp/ld.so.cache" /etc/ld.so.cache || true
  echo "check: $hidden files of the bundled and optional packages hidden"
  for f in /usr/bin/mpirun /usr/bin/ssh /usr/include/cblas.h /usr/include/nlohmann/json.hpp \
           /usr/include/CLI/CLI.hpp /usr/include/gtest/gtest.h; do
    [ ! -e "$f" ] || { echo "check: $f still visible" >&2; return 1; }
  done
  ! ldconfig -p | grep -qE "libmpi\.so|libopenblas|libgfortran\.so\.5|libpmix|libhwloc" ||
    { echo "check: system MPI/BLAS libraries still in the loader cache" >&2; return 1; }

  export ZSHARD_DEPS_PREFIX=$tmp/prefix
  # shellcheck source=gpu-setup.sh
  source "$repo/scripts/gpu-setup.sh"

  echo "== libraries the prefix's binaries take from the system (must all be Ubuntu-base libraries)"
  local elfs
  elfs=$(find "$ZSHARD_DEPS_PREFIX/usr/bin" "$ZSHARD_DEPS_PREFIX/usr/lib" -type f \( -name "*.so*" -o -perm -u+x \) 2>/dev/null)
  # shellcheck disable=SC2086
  ldd $elfs 2>/dev/null | awk '/=>/ && $3 !~ /^\// {print "NOT FOUND: " $1; next} /=>/ {print $3}' |
    grep -v "^$ZSHARD_DEPS_PREFIX" | sort | uniq -c | sort -rn || true  # ldd fails on the perl scripts
  if ldd $elfs 2>/dev/null | grep -q "not found"; then
    echo "check: unresolved libraries:" >&2
    for f in $elfs; do ldd "$f" 2>/dev/null | grep "not found" | sed "s|^|  $f: |"; done >&2
    return 1
  fi

  echo "== mpirun -np 2 hostname"
  command -v mpirun
  mpirun -np 2 hostname 2>&1 | tee "$tmp/hostname.log"
  ! grep -qE "Sorry|WARNING|rror" "$tmp/hostname.log" || { echo "check: mpirun complained" >&2; return 1; }
  echo "== a 2-rank MPI program built with the prefix's mpicxx"
  cat >"$tmp/ring.cpp" <<'CPP'
#include <mpi.h>
#include <cstdio>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int one = rank + 1;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("allreduce over %d ranks: %d (expected %d)\n", size, sum, size * (size + 1) / 2);
  MPI_Finalize();
  return sum == size * (size + 1) / 2 ? 0 : 1;
}
CPP
  mpicxx -O1 -o "$tmp/ring" "$tmp/ring.cpp"
  mpirun -np 2 "$tmp/ring"

  echo "== CMake configure of zshard against the prefix"
  local cuda=OFF
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] && cuda=AUTO
  # shellcheck disable=SC2086
  cmake -S "$repo" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZSHARD_CUDA=$cuda \
    $ZSHARD_DEPS_CMAKE_ARGS | tee "$tmp/configure.log" | grep -E "Found|CUDA path|Configuring done|Generating done"
  echo "-- where the cache points:"
  grep -E "^(MPI_CXX_COMPILER|MPIEXEC_EXECUTABLE|MPI_mpi_LIBRARY|MPI_CXX_HEADER_DIR|BLAS_openblas_LIBRARY|ZSHARD_CBLAS_INCLUDE|nlohmann_json_DIR|CLI11_DIR|GTest_DIR|ZSHARD_NCCL_LIBRARY)[:=]" \
    "$tmp/build/CMakeCache.txt" | sed 's/^/   /'
  local bad
  bad=$(grep -E "^(MPI_[A-Za-z_]*(LIBRARY|COMPILER|INCLUDE_DIR|HEADER_DIR)|MPIEXEC_EXECUTABLE|BLAS_[a-z]*_LIBRARY|ZSHARD_CBLAS_INCLUDE|nlohmann_json_DIR|CLI11_DIR|GTest_DIR)[:=][^=]*=/usr/" \
        "$tmp/build/CMakeCache.txt" || true)
  [ -z "$bad" ] || { echo "check: CMake found system copies:" >&2; echo "$bad" >&2; return 1; }
  if [ "${CHECK_BUILD:-0}" = 1 ]; then
    echo "== full build, tiny training on 2 ranks and as a singleton, the whole ctest suite"
    cmake --build "$tmp/build" -j"$(nproc)" >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; return 1; }
    mpirun -np 2 "$tmp/build/zshard-train" --model tiny --steps 3 --log-every 1 --strategy zero3 >"$tmp/np2.log" 2>&1 ||
      { cat "$tmp/np2.log"; return 1; }
    head -4 "$tmp/np2.log"
    "$tmp/build/zshard-train" --model tiny --steps 2 --log-every 1 >"$tmp/np1.log" 2>&1 || { cat "$tmp/np1.log"; return 1; }
    head -3 "$tmp/np1.log"
    (cd "$tmp/build" && OPENBLAS_NUM_THREADS=1 ctest -j"$(nproc)" --timeout 600 >"$tmp/ctest.log" 2>&1) ||
      { grep -A30 "tests passed" "$tmp/ctest.log"; echo "check: ctest failed" >&2; return 1; }
    grep "tests passed" "$tmp/ctest.log"
  fi
  echo "check: PASS"
}

check() {
  [ -f "$dest/MANIFEST" ] || download
  [ "$(id -u)" = 0 ] || { echo "gpu-bundle check: needs root (mount namespace + overlay)" >&2; exit 1; }
  check_tmp=$(mktemp -d /tmp/zshard-bundle-check.XXXXXX)
  trap 'rm -rf "$check_tmp"' EXIT
  # Runs this very script again inside the namespace; the overlays vanish with it.
  unshare -m --propagation private bash "$repo/scripts/gpu-bundle.sh" __check_inside "$check_tmp"
}

case ${1:-download} in
  download) download ;;
  check) check ;;
  all) download; check ;;
  __check_inside) check_inside "$2" ;;
  *) echo "usage: $0 [download|check|all]" >&2; exit 2 ;;
esac
