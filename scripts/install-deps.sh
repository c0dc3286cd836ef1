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
