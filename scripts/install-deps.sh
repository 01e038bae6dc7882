#!/usr/bin/env bash
# Idempotent installation of every Debian package Cobalt needs to build, test and run.
# Usage: scripts/install-deps.sh
#   Installs build tools, C++ libraries, Python (numpy, torch CPU, pytest, pip/setuptools/wheel for
#   the wheel test) and, for the report rendering test, Chromium. Skips apt entirely when
#   everything is already present; otherwise runs apt-get as root or through sudo.
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkg-config git clang-format
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev
  coinor-libcbc-dev coinor-libclp-dev coinor-libcoinutils-dev coinor-libosi-dev coinor-libcgl-dev
  libmetis-dev
  pybind11-dev python3-dev python3-numpy python3-torch python3-pytest
  python3-pip python3-setuptools python3-wheel
  chromium
)

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
