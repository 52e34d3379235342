#!/usr/bin/env bash
# The main job on the embedded default: from a fresh Debian 12 machine,
# install, build, then
#   1. generate the built-in tiny GPT-2 (4 layers, hidden 128, 4 heads,
#      vocabulary 512) as megac IR,
#   2. compile it for one rank and for a tensor-parallel grid of 4 ranks,
#   3. show the 4-rank plan's collectives,
#   4. run both plans (the 4-rank one under mpirun) and compare the logits;
#   5. train a byte-level GPT-2 of the same shape on the built-in corpus
#      (the Jargon File, public domain, from Debian's jargon-text) on 4 CPU
#      ranks (dp=2 x tp=2), with a checkpoint and a metrics log,
#   6. sample text from the trained model.
# MEGAC_DEMO_TP: tensor-parallel degree of steps 2-4 (1, 2 or 4);
# MEGAC_DEMO_STEPS: training steps (default 400).
set -euo pipefail
# Debian's python3 (setup.sh installs python3-numpy for it), not whatever
# python3 comes first on PATH.
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${MEGAC_BUILD_DIR:-$ROOT/build}"
TP="${MEGAC_DEMO_TP:-4}"
STEPS="${MEGAC_DEMO_STEPS:-400}"
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
"$PY" "$ROOT/utils/compare_safetensors.py" "$OUT/out.tp1.safetensors" \
  "$OUT/out.tp$TP.safetensors" --tol 1e-5

step "training data: the Jargon File, byte level"
"$PY" "$ROOT/utils/prepare_text.py" /usr/share/doc/jargon-text/jargon.txt.gz \
  -o "$OUT/jargon.bin" --val-fraction 0.1 --val-out "$OUT/jargon-val.bin"

step "megac compile --train (byte-level GPT-2, 4 layers, hidden 128; grid dp=2,tp=2)"
cat > "$OUT/gpt2-bytes.json" <<'JSON'
{"n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 256, "n_positions": 128}
JSON
megac import --hf-config "$OUT/gpt2-bytes.json" -o "$OUT/gpt2-bytes.mlir"
megac compile "$OUT/gpt2-bytes.mlir" --train --mesh dp=2,tp=2 --batch 16 --seq 128 \
  --lr 3e-3 --min-lr 3e-4 --warmup-steps 20 --total-steps "$STEPS" \
  -o "$OUT/gpt2-bytes.train.mgc"

step "mpirun -np 4 megac-run --steps $STEPS --sample random (training)"
rm -rf "$OUT/checkpoints"
mpirun --oversubscribe -np 4 megac-run "$OUT/gpt2-bytes.train.mgc" --steps "$STEPS" \
  --data "$OUT/jargon.bin" --sample random --metrics "$OUT/metrics.jsonl" \
  --save-checkpoint "$OUT/checkpoints"
"$PY" - "$OUT/metrics.jsonl" <<'PY'
import json, sys
losses = [json.loads(line)["loss"] for line in open(sys.argv[1])]
tail = sum(losses[-20:]) / len(losses[-20:])
print(f"loss: first step {losses[0]:.4f}, mean of the last 20 steps {tail:.4f} "
      f"(uniform over 256 bytes: 5.5452)")
PY

step "mpirun -np 4 megac-run --generate (sampling from the trained model)"
mpirun --oversubscribe -np 4 megac-run "$OUT/gpt2-bytes.train.mgc" \
  --load-checkpoint "$OUT/checkpoints" --generate "The hacker" \
  --max-new-tokens 110 --temperature 0.6 --seed 7
