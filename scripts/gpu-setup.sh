# shellcheck shell=bash
# Unpacks the dependency bundle (.gpudeps/, made by scripts/gpu-bundle.sh) into a prefix and sets the
# environment that builds and runs zshard against it, on a machine with no apt and no network (the
# GPU machine). SOURCE it, from bash:
#
#   source scripts/gpu-setup.sh                 # unpacks once (idempotent: a stamp holds the MANIFEST hash)
#   cmake -S . -B build-gpu $ZSHARD_DEPS_CMAKE_ARGS -DZSHARD_CUDA=ON ...
#   mpirun -np 2 build-gpu/zshard-train ...
#
# Knobs: ZSHARD_DEPS_PREFIX (default /tmp/zshard-deps), ZSHARD_DEPS_DEBS (default <repo>/.gpudeps),
# ZSHARD_DEPS_QUIET=1 (no version report). No root needed: nothing is written outside the prefix.
#
# What it does:
#   - `dpkg-deb -x` of every .deb into the prefix (Python's ar/tarfile when dpkg-deb is missing); the
#     fallback packages (.gpudeps/FALLBACK: libgfortran5, libquadmath0, libudev1, zlib1g) only where the
#     system's loader cache lacks their library, so the system's newer copies win.
#   - Debian's alternatives links that dpkg -x does not make: mpirun, mpiexec, mpicc, mpicxx, libmpi.so,
#     libopenblas.so in the main lib dir. OpenBLAS's 58 MB static library is deleted.
#   - OpenMPI plugins (and libmca_common_*) whose libraries do not resolve are moved to <prefix>/disabled:
#     the optional transports (UCX, libfabric, verbs, PSM, netlink) are not in the bundle.
#   - .pc files and OpenBLAS's CMake config get the prefix instead of /usr (the other CMake configs,
#     nlohmann_json, CLI11, GTest, compute their prefix from their own location already).
#   - Exports: PATH, LD_LIBRARY_PATH (prefix first), OPAL_PREFIX (relocates OpenMPI: help files, plugins,
#     wrapper data), PMIX_PREFIX and the PMIX_*DIR variables (Debian's PMIx compiled its directories in
#     as absolute paths), OMPI_MCA_* (pml ob1, btl self,vader, no CMA single copy, rsh agent `false`
#     because there is no ssh, root allowed, oversubscription), CMAKE_PREFIX_PATH,
#     CMAKE_LIBRARY_PATH / CMAKE_INCLUDE_PATH (OpenBLAS's subdirectories), PKG_CONFIG_PATH, and
#     ZSHARD_DEPS_CMAKE_ARGS: explicit -D hints (MPI compiler and mpiexec, cblas.h, each package's config
#     dir, NCCL when it comes from PyTorch's wheel) so that CMake takes nothing from /usr for these.
#   - NCCL: the CUDA toolkit's when it has one; otherwise PyTorch's pip package (nvidia/nccl or similar
#     under site-packages), linked into <prefix>/nccl with the unversioned libnccl.so CMake looks for.
#   - The CUDA libraries a build packed elsewhere loads (cudart, cuBLAS, NCCL): the toolkit's lib64, then
#     every nvidia/*/lib of PyTorch's pip packages, appended to LD_LIBRARY_PATH and named in
#     ZSHARD_CUDA_LIB_DIRS. `bash scripts/gpu-setup.sh --cuda-lib-dirs` lists them, unpacking nothing.
#
# Limits: x86-64 only; Debian 12 binaries, which need glibc >= 2.36 (Ubuntu 24.04 has 2.39). OpenMPI is not
# CUDA-aware and runs single-node only (shared memory; no ssh, no network transports). Tested on Debian 12
# with the system copies hidden (scripts/gpu-bundle.sh check), not on the GPU image itself.

_zshard_deps_setup() {
  local repo debs prefix arch=x86_64-linux-gnu
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  debs=${ZSHARD_DEPS_DEBS:-$repo/.gpudeps}
  prefix=${ZSHARD_DEPS_PREFIX:-/tmp/zshard-deps}
  if [ ! -f "$debs/MANIFEST" ]; then
    echo "gpu-setup: no bundle at $debs (run scripts/gpu-bundle.sh on the build machine, carry .gpudeps)" >&2
    return 1
  fi
  mkdir -p "$prefix" || return 1
  prefix=$(cd "$prefix" && pwd)
  local lib=$prefix/usr/lib/$arch
  local stamp
  stamp=$( (cat "$debs/MANIFEST" "$debs/FALLBACK" 2>/dev/null; echo v3) | sha256sum | cut -d' ' -f1)

  if [ "$(cat "$prefix/.zshard-deps-stamp" 2>/dev/null)" != "$stamp" ]; then
    if [ -n "$(ls -A "$prefix")" ] && [ ! -e "$prefix/.zshard-deps-stamp" ] && [ ! -e "$prefix/.zshard-deps-stamp.pending" ]; then
      echo "gpu-setup: $prefix is not empty and not a zshard-deps prefix; refusing to clear it" >&2
      return 1
    fi
    echo "gpu-setup: unpacking $(grep -vc '^#' "$debs/MANIFEST") packages from $debs into $prefix"
    find "$prefix" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
    local ldcache="" ldconfig_bin
    ldconfig_bin=$(command -v ldconfig || echo /sbin/ldconfig)
    [ -x "$ldconfig_bin" ] && ldcache=$("$ldconfig_bin" -p 2>/dev/null | awk 'NR > 1 {print $1}')
    local pkg _ver file sha line soname skip
    while read -r pkg _ver file sha; do
      case $pkg in '#'*|'') continue ;; esac
      skip=""
      while IFS=: read -r line soname; do
        if [ "$line" = "$pkg" ] && [ -n "$ldcache" ] && printf '%s\n' "$ldcache" | grep -qxF "$soname"; then
          skip=$soname
        fi
      done <"$debs/FALLBACK"
      if [ -n "$skip" ]; then
        echo "  $pkg: skipped, the system has $skip"
        continue
      fi
      if [ "$(sha256sum "$debs/$file" | cut -d' ' -f1)" != "$sha" ]; then
        echo "gpu-setup: $file does not match its MANIFEST checksum" >&2
        return 1
      fi
      _zshard_extract_deb "$debs/$file" "$prefix" || { echo "gpu-setup: cannot unpack $file" >&2; return 1; }
    done <"$debs/MANIFEST"

    # Debian's alternatives (made by maintainer scripts, which dpkg -x does not run).
    local t
    for t in mpirun mpiexec mpicc mpicxx mpic++ mpiCC; do
      [ -e "$prefix/usr/bin/$t.openmpi" ] && ln -sfn "$t.openmpi" "$prefix/usr/bin/$t"
    done
    ln -sfn openmpi/lib/libmpi.so "$lib/libmpi.so"
    [ -e "$lib/openmpi/lib/libmpi_cxx.so" ] && ln -sfn openmpi/lib/libmpi_cxx.so "$lib/libmpi_cxx.so"
    ln -sfn openblas-pthread/libopenblas.so "$lib/libopenblas.so"
    ln -sfn openblas-pthread/libopenblas.so.0 "$lib/libopenblas.so.0"
    rm -f "$lib"/openblas-pthread/*.a
    rm -rf "$prefix/usr/share/doc" "$prefix/usr/share/man" "$prefix/usr/share/lintian"

    # Absolute /usr paths in pkg-config files and OpenBLAS's CMake config.
    local f
    while IFS= read -r f; do
      sed -i -e "s|=/usr\\b|=$prefix/usr|g" -e "s|-I/usr/|-I$prefix/usr/|g" -e "s|-L/usr/|-L$prefix/usr/|g" "$f"
    done < <(find "$prefix" -name "*.pc" -type f)
    while IFS= read -r f; do
      sed -i "s| /usr/| $prefix/usr/|g" "$f"
    done < <(find "$lib/openblas-pthread/cmake" -name "*.cmake" -type f 2>/dev/null)
    echo "$stamp" >"$prefix/.zshard-deps-stamp.pending"
  fi

  export ZSHARD_DEPS_PREFIX=$prefix
  _zshard_prepend PATH "$prefix/usr/bin"
  _zshard_prepend LD_LIBRARY_PATH "$lib:$lib/openblas-pthread:$prefix/lib/$arch"
  export OPAL_PREFIX=$prefix/usr
  # Debian's PMIx has its directories compiled in as absolute paths: each one is relocated by name.
  export PMIX_PREFIX=$lib/pmix2 PMIX_EXEC_PREFIX=$lib/pmix2 PMIX_LIBDIR=$lib/pmix2/lib
  export PMIX_PKGLIBDIR=$lib/pmix2/lib/pmix PMIX_DATAROOTDIR=$lib/pmix2/share PMIX_DATADIR=$lib/pmix2/share
  export PMIX_PKGDATADIR=$lib/pmix2/share/pmix PMIX_SYSCONFDIR=$lib/pmix2/share
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_MCA_plm_rsh_agent=false OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  _zshard_prepend CMAKE_PREFIX_PATH "$prefix/usr"
  _zshard_prepend CMAKE_LIBRARY_PATH "$lib/openblas-pthread"
  _zshard_prepend CMAKE_INCLUDE_PATH "$prefix/usr/include/$arch/openblas-pthread"
  _zshard_prepend PKG_CONFIG_PATH "$lib/pkgconfig:$lib/openblas-pthread/pkgconfig:$prefix/usr/share/pkgconfig"
  if [ -d /usr/local/cuda/bin ] && ! command -v nvcc >/dev/null; then export PATH=$PATH:/usr/local/cuda/bin; fi

  if [ -f "$prefix/.zshard-deps-stamp.pending" ]; then
    # With the environment in place: plugins and helper libraries whose libraries do not resolve go.
    local moved=() so rel
    while IFS= read -r so; do
      if ldd "$so" 2>/dev/null | grep -q "not found"; then
        rel=${so#"$prefix"/}
        mkdir -p "$prefix/disabled/$(dirname "$rel")"
        mv "$so" "$prefix/disabled/$rel"
        moved+=("$(basename "$so")")
      fi
    done < <(find "$lib/openmpi/lib/openmpi3" "$lib" "$lib/pmix2/lib/pmix" -maxdepth 1 -type f \
               \( -name "mca_*.so" -o -name "libmca_common_*.so.*" -o -name "pmix_mca_*.so" \) 2>/dev/null)
    [ ${#moved[@]} -eq 0 ] || echo "  disabled (libraries not in the bundle): ${moved[*]}"
    local unresolved
    unresolved=$(for so in "$prefix"/usr/bin/orterun "$lib"/libmpi.so.40 "$lib"/libmpi_cxx.so.40 \
                   "$lib"/openblas-pthread/libopenblas.so.0 "$lib"/pmix2/lib/libpmix.so.2; do
                   ldd "$so" 2>/dev/null | grep "not found" | sed "s|^|$so: |"; done)
    if [ -n "$unresolved" ]; then
      echo "gpu-setup: unresolved libraries:" >&2
      echo "$unresolved" >&2
      return 1
    fi
    mv "$prefix/.zshard-deps-stamp.pending" "$prefix/.zshard-deps-stamp"
  fi

  # NCCL: the toolkit's, else PyTorch's pip package.
  local nccl_args="" cuda_root nccl_h="" nccl_so="" d
  cuda_root=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
  for d in "$cuda_root/include" "$cuda_root/targets/x86_64-linux/include" /usr/include /usr/local/include; do
    [ -f "$d/nccl.h" ] && { nccl_h=$d; break; }
  done
  for d in "$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/targets/x86_64-linux/lib" /usr/lib/$arch /usr/local/lib; do
    [ -e "$d/libnccl.so" ] && { nccl_so=$d/libnccl.so; break; }
  done
  if [ -z "$nccl_h" ] || [ -z "$nccl_so" ]; then
    local h="" s="" dir
    for dir in $(_zshard_site_dirs); do
      [ -d "$dir/nvidia" ] || continue
      [ -n "$h" ] || h=$(find "$dir/nvidia" -maxdepth 4 -name nccl.h 2>/dev/null | head -1)
      [ -n "$s" ] || s=$(find "$dir/nvidia" -maxdepth 4 -name "libnccl.so*" 2>/dev/null | sort | head -1)
    done
    if [ -n "$h" ] && [ -n "$s" ]; then
      mkdir -p "$prefix/nccl/lib"
      ln -sfn "$(readlink -f "$s")" "$prefix/nccl/lib/libnccl.so"
      ln -sfn "$(readlink -f "$s")" "$prefix/nccl/lib/libnccl.so.2"
      nccl_h=$(dirname "$h") nccl_so=$prefix/nccl/lib/libnccl.so
      case ":$LD_LIBRARY_PATH:" in *":$prefix/nccl/lib:"*) ;; *) export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$prefix/nccl/lib ;; esac
    fi
  fi
  [ -n "$nccl_h" ] && [ -n "$nccl_so" ] && nccl_args="-DZSHARD_NCCL_INCLUDE=$nccl_h -DZSHARD_NCCL_LIBRARY=$nccl_so"
  export ZSHARD_NCCL_FOUND=${nccl_so:-none}

  # A build made on another machine (scripts/gpu-acceptance.sh pack) links cudart, cuBLAS and NCCL by
  # soname; on the GPU image they may be in none of the loader's cache folders, only in the toolkit's or
  # in PyTorch's pip packages. After the bundle's folders, so that the bundle wins where both have a library.
  local found=()
  while IFS= read -r d; do
    found+=("$d")
    case ":$LD_LIBRARY_PATH:" in *":$d:"*) ;; *) export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d ;; esac
  done < <(_zshard_cuda_lib_dirs)
  export ZSHARD_CUDA_LIB_DIRS
  ZSHARD_CUDA_LIB_DIRS=$(IFS=:; echo "${found[*]}")

  export ZSHARD_DEPS_CMAKE_ARGS="-DMPI_CXX_COMPILER=$prefix/usr/bin/mpicxx -DMPIEXEC_EXECUTABLE=$prefix/usr/bin/mpiexec \
-DZSHARD_CBLAS_INCLUDE=$prefix/usr/include/$arch/openblas-pthread \
-Dnlohmann_json_DIR=$prefix/usr/share/cmake/nlohmann_json -DCLI11_DIR=$prefix/usr/share/cmake/CLI11 \
-DGTest_DIR=$lib/cmake/GTest $nccl_args"

  [ "${ZSHARD_DEPS_QUIET:-0}" = 1 ] && return 0
  echo "gpu-setup: prefix $prefix"
  echo "  $(mpirun --version 2>&1 | head -1) at $(command -v mpirun)"
  echo "  OpenBLAS $(awk '/OPENBLAS_VERSION/{print $5}' "$prefix/usr/include/$arch/openblas-pthread/openblas_config.h" 2>/dev/null)"
  local p
  for p in nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev; do
    echo "  $p $(awk -v p="$p" '$1 == p {print $2}' "$debs/MANIFEST")"
  done
  echo "  $(cmake --version 2>/dev/null | head -1 || echo 'cmake: missing')"
  echo "  $( (g++ --version 2>/dev/null || echo 'g++: missing') | head -1)"
  echo "  $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null || echo 'nvcc: missing') | tail -1)"
  echo "  NCCL: ${nccl_so:-not found} (${nccl_h:-no nccl.h})"
  echo "  CUDA libraries from: ${ZSHARD_CUDA_LIB_DIRS:-none of $(_zshard_cuda_lib_patterns)}"
}

# Python's site-packages folders, one a line (PyTorch's pip packages put CUDA's libraries under nvidia/).
_zshard_site_dirs() {
  python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null
}

# Where the CUDA runtime libraries are looked for, in order: the toolkit's, then every nvidia/*/lib of
# PyTorch's pip packages (cublas, cuda_runtime, nccl, cudnn, ...).
_zshard_cuda_lib_patterns() {
  local site
  printf '%s' "${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}/lib64"
  for site in $(_zshard_site_dirs); do printf ' %s' "$site/nvidia/*/lib"; done
  echo
}

# The folders of those patterns that exist here, one a line.
_zshard_cuda_lib_dirs() {
  local d
  for d in $(_zshard_cuda_lib_patterns); do [ -d "$d" ] && echo "$d"; done
}

# Puts DIRS (colon-separated) in front of the variable VAR, unless it starts with them already (sourcing
# twice changes nothing).
_zshard_prepend() {
  local var=$1 dirs=$2 cur
  cur=${!var:-}
  case ":$cur" in ":$dirs"|":$dirs:"*) ;; *) export "$var=$dirs${cur:+:$cur}" ;; esac
}

# Unpacks a .deb's data archive: dpkg-deb when there is one, else Python (ar members, then tarfile).
_zshard_extract_deb() {
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$2"
    return
  fi
  python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
with open(deb, "rb") as f:
    data = f.read()
assert data[:8] == b"!<arch>\n", "not an ar archive"
pos = 8
while pos + 60 <= len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as t:
            # A Debian package is trusted here; the default filter of Python >= 3.14 would refuse some links.
            t.extractall(dest, **({"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}))
        break
    pos += 60 + size + (size & 1)
else:
    sys.exit("no data.tar member in " + deb)
PY
}

# Run, not sourced, with --cuda-lib-dirs: where the CUDA libraries would be looked for, and what is found
# here; nothing is unpacked.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  if [ "${1:-}" != --cuda-lib-dirs ]; then
    echo "usage: source $0 (sets up the bundle), or bash $0 --cuda-lib-dirs" >&2
    exit 2
  fi
  echo "CUDA libraries searched in: $(_zshard_cuda_lib_patterns)"
  dirs=$(_zshard_cuda_lib_dirs | paste -sd" ")
  echo "found here: ${dirs:-none}"
  exit 0
fi

# Sourced into the caller's shell: its options (set -e, -u, pipefail) are put aside while this runs.
_zshard_deps_main() {
  local had_e=0 had_u=0 had_pipefail=0 rc
  case $- in *e*) had_e=1 ;; esac
  case $- in *u*) had_u=1 ;; esac
  shopt -qo pipefail && had_pipefail=1
  set +e +u +o pipefail
  _zshard_deps_setup
  rc=$?
  [ $had_e = 1 ] && set -e
  [ $had_u = 1 ] && set -u
  [ $had_pipefail = 1 ] && set -o pipefail
  return $rc
}
_zshard_deps_main
