#!/usr/bin/env bash
# Installs what megac needs on Debian 12 (as root, or with sudo available).
# Idempotent: apt runs only when a package is missing.
set -euo pipefail

PACKAGES=(
  cmake ninja-build ccache g++ python3 python3-numpy
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  libflatbuffers-dev flatbuffers-compiler
  libopenmpi-dev openmpi-bin libopenblas-dev
  nlohmann-json3-dev libcli11-dev libgtest-dev
  jargon-text  # the built-in training corpus (the Jargon File, public domain)
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$pkg")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
echo "setup: all ${#PACKAGES[@]} packages present"
