#!/bin/bash
# runtime_e2e.sh - end-to-end check of megac-run without the compiler.
#
# Builds GPT-2 demo plans at tp=1/2/4 with megac-plan-demo, runs them under
# mpirun on a random HF-named checkpoint, and checks the logits and loss
# against the numpy reference and against each other; then checks that
# corrupted inputs fail with one "megac-run: error:" line and exit 1.
#
#   utils/runtime_e2e.sh [BIN_DIR]     (default: build-rt/bin)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${1:-$HERE/../build-rt/bin}
PY=${PYTHON:-/usr/bin/python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cd "$T"

$PY "$HERE/make_gpt2_weights.py" -o w.st --n-layer 2 --n-embd 64 --n-head 4 \
  --vocab 128 --n-positions 64 --seed 3
for TP in 1 2 4; do
  "$BIN/megac-plan-demo" -o tp$TP.mgc --tp $TP
  $MPIRUN -np $TP "$BIN/megac-run" tp$TP.mgc --weights w.st --save-outputs o$TP.st
  $PY "$HERE/gpt2_reference.py" --weights w.st --outputs o$TP.st --n-head 4
  $MPIRUN -np $TP "$BIN/megac-run" tp$TP.mgc -q --save-outputs i$TP.st
done
$PY "$HERE/compare_safetensors.py" o1.st o2.st
$PY "$HERE/compare_safetensors.py" o1.st o4.st
# Seeded init must give the same model at every tp.
$PY "$HERE/compare_safetensors.py" i1.st i2.st
$PY "$HERE/compare_safetensors.py" i1.st i4.st

expect_error() { # PATTERN CMD...
  local pat=$1; shift
  if "$@" >out.txt 2>err.txt; then echo "FAIL: succeeded: $*"; exit 1; fi
  if ! grep -q "^megac-run: error: .*$pat" err.txt; then
    echo "FAIL: no '$pat' error from: $*"; cat err.txt; exit 1
  fi
  echo "ok: $(grep '^megac-run: error:' err.txt)"
}
$PY "$HERE/corrupt.py" flip tp2.mgc flip.mgc --offset -40
expect_error "checksum mismatch" $MPIRUN -np 2 "$BIN/megac-run" flip.mgc
$PY "$HERE/corrupt.py" truncate tp2.mgc cut.mgc --size 300
expect_error "malformed plan" $MPIRUN -np 2 "$BIN/megac-run" cut.mgc
expect_error "compiled for 2 ranks" $MPIRUN -np 1 "$BIN/megac-run" tp2.mgc
$PY "$HERE/corrupt.py" truncate w.st cutw.st --size -100
expect_error "cutw.st: " $MPIRUN -np 2 "$BIN/megac-run" tp2.mgc --weights cutw.st
echo "runtime_e2e.sh: all checks passed"
