#!/usr/bin/env bash
# Training throughput (global tokens/s) and peak RSS per rank of the
# compiled training step on CPU ranks, for several grids in one run, on the
# byte-level GPT-2 of the demo (4 layers, hidden 128, 4 heads, vocabulary
# 256) with global batch 16 x seq 128. Ratios between rows are meaningful;
# absolute numbers are those of this machine.
#   bench/train_throughput.sh [STEPS]      (default 30)
set -euo pipefail
# Debian's python3 (setup.sh installs python3-numpy for it), not whatever
# python3 comes first on PATH.
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${MEGAC_BUILD_DIR:-$ROOT/build}/bin"
STEPS="${1:-30}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
export OPENBLAS_NUM_THREADS=1

echo '{"n_layer": 4, "n_embd": 128, "n_head": 4, "vocab_size": 256, "n_positions": 128}' > "$TMP/c.json"
"$BIN/megac" import --hf-config "$TMP/c.json" -o "$TMP/m.mlir"
"$PY" -c "import numpy as np; np.random.default_rng(0).integers(0, 256, 200000, dtype=np.uint16).tofile('$TMP/d.bin')"

printf '%-22s %6s %14s %12s %16s\n' grid ranks "tokens/s" "vs 1 rank" "peak RSS MiB/rank"
base=""
# Each row: the grid, then extra compile options (pipelines run 4
# micro-batches of 4 rows, 1F1B).
for ROW in none tp=2 dp=2 "pp=2 --micro-batches 4" tp=4 dp=2,tp=2 dp=4 \
    "dp=2,pp=2 --micro-batches 4" "pp=4 --micro-batches 4"; do
  read -r MESH EXTRA <<< "$ROW"
  MESH_ARGS=(); RANKS=1
  if [[ $MESH != none ]]; then
    MESH_ARGS=(--mesh "$MESH")
    RANKS=$("$PY" -c "import math; print(math.prod(int(p.split('=')[1]) for p in '$MESH'.split(',')))")
  fi
  # shellcheck disable=SC2086  # EXTRA is a list of options
  "$BIN/megac" compile "$TMP/m.mlir" --train "${MESH_ARGS[@]}" --batch 16 --seq 128 \
    $EXTRA -o "$TMP/p.mgc" --quiet
  /usr/bin/time -f "%M" -o "$TMP/rss" mpirun --oversubscribe -np "$RANKS" \
    "$BIN/megac-run" "$TMP/p.mgc" --steps "$STEPS" --data "$TMP/d.bin" \
    --metrics "$TMP/m.jsonl" -q
  tps=$("$PY" -c "
import json
r = [json.loads(l)['tokens_per_s'] for l in open('$TMP/m.jsonl')][3:]
print(round(sum(r) / len(r)))")
  [[ -z "$base" ]] && base=$tps
  rss=$(( $(cat "$TMP/rss") / 1024 ))
  printf '%-22s %6s %14s %12s %16s\n' "$MESH${EXTRA:+ m=4}" "$RANKS" "$tps" \
    "$("$PY" -c "print(f'{$tps / $base:.2f}x')")" "$rss"
done
echo "(tokens/s: mean over steps 4..$STEPS; peak RSS: the largest rank, from /usr/bin/time on mpirun's children)"
