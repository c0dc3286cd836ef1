#!/usr/bin/env bash
# Installs zshard's build and test dependencies from Debian packages. Idempotent: it only calls apt-get
# when something is missing. Run as root (or with sudo available).
set -euo pipefail
# munge, slurmctld, slurmd, slurm-client: tests/cli/test_launcher_slurm.sh runs zshard-run in a Slurm cluster
# it starts on this machine. iproute2: scripts/multihost.sh makes its hosts with ip and shapes their links
# with tc.
packages=(build-essential cmake ninja-build libopenblas-dev libgtest-dev libgmock-dev libcli11-dev
          nlohmann-json3-dev libxxhash-dev libopenmpi-dev openmpi-bin munge slurmctld slurmd slurm-client
          iproute2)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
