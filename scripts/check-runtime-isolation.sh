#!/usr/bin/env bash
# The runtime must build without MLIR or any compiler header: it owns the
# plan schema and is deployed on its own. Fails if runtime/ includes one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if grep -rnE '#\s*include\s*[<"](mlir/|llvm/|megac/)' "$ROOT/runtime"; then
  echo "runtime isolation: FAILED (runtime/ includes MLIR, LLVM or compiler headers)"
  exit 1
fi
if grep -rniE 'find_package\((MLIR|LLVM)' "$ROOT/runtime"; then
  echo "runtime isolation: FAILED (runtime/ CMake looks for MLIR or LLVM)"
  exit 1
fi
echo "runtime isolation: ok (no MLIR, LLVM or compiler includes under runtime/)"
