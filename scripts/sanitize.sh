#!/usr/bin/env bash
# Builds megac with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-asan/ and runs the whole test suite there (lit, and the GoogleTest
# suite through lit). Not part of .ci/run: the instrumented build and the
# slower tests take some 30 minutes on 2 cores. Run it after changing
# memory-handling code (the runtime, the CUDA backend's kernels on the
# emulation, the plan reader). Needs what scripts/test.sh set up.
#   scripts/sanitize.sh [LIT ARGS...]   (default: both suites)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${MEGAC_ASAN_BUILD_DIR:-$ROOT/build-asan}"

SAN="-fsanitize=address,undefined"
# -O1: instrumented code at -O3 takes far longer to build, for little.
# vptr is left out: LLVM and MLIR are built without RTTI.
# --as-needed: without it the instrumented compiler records libcuda.so.1,
# which a machine without a driver lacks.
MEGAC_BUILD_DIR="$BUILD" bash "$ROOT/scripts/build.sh" -DCMAKE_BUILD_TYPE=Debug \
  "-DCMAKE_CXX_FLAGS=-O1 -g1 $SAN -fno-sanitize=vptr -fno-omit-frame-pointer" \
  "-DCMAKE_C_FLAGS=-O1 $SAN" \
  "-DCMAKE_EXE_LINKER_FLAGS=$SAN -Wl,--as-needed" \
  "-DCMAKE_SHARED_LINKER_FLAGS=$SAN -Wl,--as-needed"

# allow_user_poisoning=0: LLVM's BumpPtrAllocator poisons the rest of its
# slabs when compiled with ASan (our code, inlining it), while Debian's
# uninstrumented libMLIR allocates from the same slabs without unpoisoning:
# every read of such an attribute would be reported.
# detect_leaks=0: Open MPI does not free what MPI_Init allocates (reported
# in every megac-run). With leaks detected, test/Dialect and test/tools
# (2026-11-26): the 51 tests that run no megac-run passed, and all 12
# reports in the other 9 came from megac-run.
# halt_on_error: undefined behaviour fails the test, as a memory error does.
export ASAN_OPTIONS="detect_leaks=0:allow_user_poisoning=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
LIT="$(llvm-config-22 --bindir)/lit"
if [[ $# -gt 0 ]]; then
  exec "$LIT" "$@"
fi
exec "$LIT" -sv "$BUILD/test" "$BUILD/test/Unit"
