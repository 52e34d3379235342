#!/usr/bin/env bash
# On a GPU machine, after `bash scripts/gpu_bundle.sh install`: runs the
# lit suite with the real CUDA backend (the one-rank CUDA tests switch from
# the emulation to the GPU when lit finds one), then bench/gpu_step.py.
#
#   bash scripts/gpu_check.sh LOGDIR [MODELS]    # MODELS: 124M,350M,1.3B
#
# Writes LOGDIR/{env,lit-cuda,lit-all,bench}.log; each stage has a time
# limit so that one stuck stage leaves the others' logs.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGS="${1:?usage: gpu_check.sh LOGDIR [MODELS]}"
MODELS="${2:-124M,350M,1.3B}"
mkdir -p "$LOGS"
cd "$ROOT"

# CUDA's libraries where the toolkit or PyTorch's wheels keep them.
PY="$(command -v python3)"
WHEEL_LIBS=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, site
dirs = []
for base in site.getsitepackages():
    dirs += glob.glob(os.path.join(base, "nvidia", "*", "lib"))
print(":".join(dirs))
EOF
)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib:${WHEEL_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MEGAC_TEST_PYTHON="$PY"
# Open MPI's ssh launcher refuses to start where no ssh is installed, even
# for local ranks; `isolated` launches on this machine only.
export OMPI_MCA_plm=isolated
LIT=(/usr/lib/llvm-22/bin/lit)

{
  nvidia-smi -L
  "$PY" --version
  nvcc --version | tail -2
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "--- libraries the CUDA plugin and megac cannot find:"
  ldd build/bin/libmegac_cuda.so build/bin/megac build/bin/megac-run | grep "not found"
  echo "--- end"
} 2>&1 | tee "$LOGS/env.log"

echo "=== lit: the CUDA tests"
timeout "${CUDA_LIT_LIMIT:-150}" "$PY" "${LIT[@]}" -v build/test \
  --filter 'cuda|profile' 2>&1 | tee "$LOGS/lit-cuda.log" | tail -40
echo "=== lit: the whole suite"
timeout "${ALL_LIT_LIMIT:-200}" "$PY" "${LIT[@]}" -sv -j "$(nproc)" build/test \
  2>&1 | tee "$LOGS/lit-all.log" | grep -E "^(FAIL|UNSUPPORTED|  )|Passed|Failed|Unsupported" | tail -40
echo "=== bench/gpu_step.py --models $MODELS"
PYTHONUNBUFFERED=1 timeout "${BENCH_LIMIT:-300}" "$PY" bench/gpu_step.py --models "$MODELS" \
  2>&1 | tee "$LOGS/bench.log"
