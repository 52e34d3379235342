#!/usr/bin/env bash
# Compile time and peak memory of `megac compile` on GPT-3-shaped models
# (hidden 12288, 96 heads, vocabulary 51200, sequence 2048) of 24, 48 and 96
# layers, to check that compile time stays linear in depth.
#   bench/compile_time.sh [MESH [COMPILE OPTION...]]      (default tp=8)
#   BATCH=32 bench/compile_time.sh dp=4,pp=8,tp=8 --train --micro-batches 8 \
#       --sequence-parallel --recompute selective
# BATCH is the global batch (default 1); LAYERS the depths (default
# "24 48 96"; LAYERS="96 384 1536" checks far deeper models).
set -euo pipefail
# Debian's python3 (setup.sh installs python3-numpy for it), not whatever
# python3 comes first on PATH.
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${MEGAC_BUILD_DIR:-$ROOT/build}/bin"
MESH="${1:-tp=8}"
shift || true
BATCH="${BATCH:-1}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

printf '%-7s %-8s %12s %14s %12s %14s\n' layers mesh "compile ms" "peak RSS MiB" "plan KiB" "ms per layer"
for L in ${LAYERS:-24 48 96}; do
  echo "{\"n_layer\": $L, \"n_embd\": 12288, \"n_head\": 96, \"vocab_size\": 51200, \"n_positions\": 2048}" > "$TMP/c.json"
  "$BIN/megac" import --hf-config "$TMP/c.json" -o "$TMP/m.mlir"
  best=""
  for run in 1 2 3; do
    /usr/bin/time -f "%e %M" -o "$TMP/time" "$BIN/megac" compile "$TMP/m.mlir" \
      --mesh "$MESH" --batch "$BATCH" --seq 2048 "$@" -o "$TMP/m.mgc" --quiet
    read -r secs rss < "$TMP/time"
    ms=$("$PY" -c "print(round($secs * 1000))")
    if [[ -z "$best" || $ms -lt $best ]]; then best=$ms; best_rss=$rss; fi
  done
  kib=$(( $(stat -c %s "$TMP/m.mgc") / 1024 ))
  printf '%-7s %-8s %12s %14s %12s %14s\n' "$L" "$MESH" "$best" "$((best_rss / 1024))" "$kib" \
    "$("$PY" -c "print(round($best / $L, 2))")"
done
