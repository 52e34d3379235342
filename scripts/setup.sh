#!/usr/bin/env bash
# Installs what megac needs on Debian 12 (as root, or with sudo available).
# Idempotent: apt runs only when a package is missing.
set -euo pipefail

PACKAGES=(
  cmake ninja-build ccache g++ python3 python3-numpy python3-pip
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

# cuDNN's C++ frontend (header-only, from its PyPI wheel): the CUDA backend's
# cuDNN fused attention (its default where libcudnn.so.9 loads,
# MEGAC_CUDA_ATTENTION=auto). Optional: the
# build goes on without it (CMake says so) if PyPI cannot be reached.
CUDNN_FE_VERSION=1.32.0
CUDNN_FE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.deps/cudnn-frontend-$CUDNN_FE_VERSION"
if [[ ! -f "$CUDNN_FE_DIR/include/cudnn_frontend.h" ]]; then
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
       "nvidia-cudnn-frontend==$CUDNN_FE_VERSION" >/dev/null 2>&1 &&
     python3 - "$tmp" "$CUDNN_FE_DIR" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
  then
    echo "setup: cuDNN frontend $CUDNN_FE_VERSION headers in ${CUDNN_FE_DIR#$PWD/}"
  else
    echo "setup: could not fetch the cuDNN frontend from PyPI; building without cuDNN attention"
  fi
  rm -rf "$tmp"
fi
