#!/usr/bin/env bash
# Configures and builds megac (compiler, runtime, tests) into build/
# ($MEGAC_BUILD_DIR). Arguments go to CMake's first configure of that
# directory (scripts/sanitize.sh passes its sanitizer flags so).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${MEGAC_BUILD_DIR:-$ROOT/build}"
JOBS="${MEGAC_JOBS:-$(nproc)}"

export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/megac-ccache}"
# Paths relative to the checkout, so a second clone (CI's) reuses the cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${LAUNCHER[@]}" "$@"
fi
ninja -C "$BUILD" -j "$JOBS"
