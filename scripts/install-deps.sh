#!/usr/bin/env bash
# Installs zshard's build and test dependencies from Debian packages. Idempotent: it only calls apt-get
# when something is missing. Run as root (or with sudo available).
set -euo pipefail
# munge, slurmctld, slurmd, slurm-client: tests/cli/test_launcher_slurm.sh runs zshard-run in a Slurm cluster
# it starts on this machine. iproute2: scripts/multihost.sh makes its hosts with ip and shapes their links
# with tc. python3-torch (for /usr/bin/python3, without its recommends: qt and the like): the fine-tuning
# parity tests check zshard against a PyTorch implementation of the same LoRA math.
packages=(build-essential cmake ninja-build libopenblas-dev libgtest-dev libgmock-dev libcli11-dev
          nlohmann-json3-dev libxxhash-dev libopenmpi-dev openmpi-bin munge slurmctld slurmd slurm-client
          iproute2)
bare_packages=(python3-torch)  # installed without recommends
missing() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing_packages < <(missing "${packages[@]}")
mapfile -t missing_bare < <(missing "${bare_packages[@]}")
if [ ${#missing_packages[@]} -gt 0 ] || [ ${#missing_bare[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  install=(env DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq)
  [ ${#missing_packages[@]} -eq 0 ] || "${install[@]}" "${missing_packages[@]}" >/dev/null
  [ ${#missing_bare[@]} -eq 0 ] || "${install[@]}" --no-install-recommends "${missing_bare[@]}" >/dev/null
fi

# cuDNN's frontend headers, for fused attention on cuda (cmake/Cuda.cmake finds them in .deps/): the include/
# folder of a PyPI wheel, unpacked once per version. cuDNN itself is loaded at run time, not needed here.
# A failed download is no error: the build goes on without the fused CUDA path and says so.
frontend_version=1.32.0
frontend=$(cd "$(dirname "$0")/.." && pwd)/.deps/cudnn-frontend
if [ "$(cat "$frontend/VERSION" 2>/dev/null)" != "$frontend_version" ]; then
  wheel_dir=$(mktemp -d)
  if python3 -m pip download --quiet --no-deps --dest "$wheel_dir" "nvidia-cudnn-frontend==$frontend_version" \
       >"$wheel_dir/pip.log" 2>&1 &&
     python3 - "$wheel_dir" "$frontend.new" <<'PY'
import glob, os, shutil, sys, zipfile
wheel_dir, dest = sys.argv[1], sys.argv[2]
shutil.rmtree(dest, ignore_errors=True)
with zipfile.ZipFile(glob.glob(os.path.join(wheel_dir, "*.whl"))[0]) as wheel:
    headers = [n for n in wheel.namelist() if n.startswith("include/") and not n.endswith("/")]
    if not any(n == "include/cudnn_frontend.h" for n in headers):
        sys.exit("no include/cudnn_frontend.h in the wheel")
    for name in headers:
        wheel.extract(name, dest)
PY
  then
    rm -rf "$frontend" && mv "$frontend.new" "$frontend" && echo "$frontend_version" >"$frontend/VERSION"
  else
    echo "install-deps: cuDNN's frontend headers were not fetched ($(tail -1 "$wheel_dir/pip.log" 2>/dev/null)): the" \
         "CUDA build goes on without fused attention" >&2
  fi
  rm -rf "$wheel_dir" "$frontend.new"
fi
