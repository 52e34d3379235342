#!/usr/bin/env bash
# The main job on the embedded default: from a fresh Debian 12 machine,
# install, build, then
#   1. generate the built-in tiny GPT-2 (4 layers, hidden 128, 4 heads,
#      vocabulary 512) as megac IR,
#   2. compile it for one rank and for a tensor-parallel grid of 4 ranks,
#   3. show the 4-rank plan's collectives,
#   4. run both plans (the 4-rank one under mpirun) and compare the logits.
# Set MEGAC_DEMO_TP to use another tensor-parallel degree (1, 2 or 4).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${MEGAC_BUILD_DIR:-$ROOT/build}"
TP="${MEGAC_DEMO_TP:-4}"
OUT="${MEGAC_DEMO_DIR:-$BUILD/demo}"

bash "$ROOT/scripts/setup.sh"
bash "$ROOT/scripts/build.sh"

export PATH="$BUILD/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OPENBLAS_NUM_THREADS=1
mkdir -p "$OUT"
step() { printf '\n== %s\n' "$*"; }

step "megac import --tiny -o $OUT/gpt2-tiny.mlir"
megac import --tiny -o "$OUT/gpt2-tiny.mlir"
head -1 "$OUT/gpt2-tiny.mlir"

step "megac compile (1 rank, and tp=$TP)"
megac compile "$OUT/gpt2-tiny.mlir" -o "$OUT/gpt2-tiny.tp1.mgc"
megac compile "$OUT/gpt2-tiny.mlir" --mesh "tp=$TP" -o "$OUT/gpt2-tiny.tp$TP.mgc" \
  --dump-ir "$OUT/ir-tp$TP"
echo "IR after each pass: $OUT/ir-tp$TP/"

step "collectives in rank 0's instruction stream (tp=$TP)"
megac inspect "$OUT/gpt2-tiny.tp$TP.mgc" --rank 0 | grep -E ' = (all_reduce|all_gather) ' \
  | sed 's/^ */  /'

step "megac-run on 1 rank"
megac-run "$OUT/gpt2-tiny.tp1.mgc" --save-outputs "$OUT/out.tp1.safetensors"

step "mpirun -np $TP megac-run (tensor parallel)"
mpirun --oversubscribe -np "$TP" megac-run "$OUT/gpt2-tiny.tp$TP.mgc" \
  --save-outputs "$OUT/out.tp$TP.safetensors"

step "tp=$TP against 1 rank"
python3 "$ROOT/utils/compare_safetensors.py" "$OUT/out.tp1.safetensors" \
  "$OUT/out.tp$TP.safetensors" --tol 1e-5
