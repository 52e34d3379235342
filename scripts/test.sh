#!/usr/bin/env bash
# From a fresh Debian 12 machine: install dependencies, build everything and
# run every test (lit FileCheck/diagnostic/end-to-end tests and the runtime's
# GoogleTest suite through lit). Prints lit's summary and a closing
# "N passed, N failed" line.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${MEGAC_BUILD_DIR:-$ROOT/build}"

bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/build.sh"
bash "$ROOT/scripts/check-runtime-isolation.sh"

LIT="$(llvm-config-22 --bindir)/lit"
status=0
"$LIT" -v --xunit-xml-output "$BUILD/test-results.xml" \
  "$BUILD/test" "$BUILD/test/Unit" || status=$?
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
"$PY" "$ROOT/utils/lit_summary.py" "$BUILD/test-results.xml"
exit $status
