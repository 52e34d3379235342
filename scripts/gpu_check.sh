#!/usr/bin/env bash
# On a GPU machine, after `bash scripts/gpu_bundle.sh install`: runs the
# CUDA tests of the lit suite with the real CUDA backend (the one-rank CUDA
# tests switch from the emulation to the GPU when lit finds one), compares
# their results with the CPU's, then runs bench/gpu_step.py.
#
#   bash scripts/gpu_check.sh LOGDIR [MODELS] [RUNNERS]
#     MODELS: 350M,1.3B,124M; RUNNERS: eager,compile,megac, then megac's
#     knobs' runners, most telling first (bench/gpu_step.py)
#
# Writes LOGDIR/{env,lit-cuda,lit-all,compare,bench}.log. The whole script
# keeps to BUDGET seconds (default 540: a device call may take 600, and a
# session's device time is 15 minutes, its machine's start included): each
# stage gets what the stages before it left, and the benchmark leaves out
# the rows that would not fit (gpu_step.py --budget-s), after running the
# peers and megac on every model first. STAGES (default lit,bench) picks
# stages: `lit` runs the CUDA tests and the comparison, `all` the whole lit
# suite and the GoogleTest unit tests (already run by CI without a GPU),
# `bench` the benchmark. LIT_FILTER (default cuda|profile|torchrun: with
# torch's torchrun, torchrun-real.test) picks the lit
# stage's tests. PROFILE_RUNNERS (default megac; empty: none) are
# the runners also run with megac-run --profile; BENCH_EXTRA adds options
# to bench/gpu_step.py (e.g. --no-kernels).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOGS="${1:?usage: gpu_check.sh LOGDIR [MODELS] [RUNNERS]}"
MODELS="${2:-350M,1.3B,124M}"
RUNNERS="${3:-eager,compile,megac,megac-probe,megac-epi,megac-noepi,megac-nobgrad,megac-anyred,megac-cudnnfast,megac-tune,megac-mma,megac-align64,megac-narrowkg,megac-sepdq,megac-narrow,megac-refwd,megac-noparam,megac-wmma,megac-nocopy,megac-fp32}"
BUDGET="${BUDGET:-540}"
# Seconds left of BUDGET, less the seconds $1 keeps back (default 0), at least 1.
left() { local l=$((BUDGET - SECONDS - ${1:-0})); ((l > 0)) && echo "$l" || echo 1; }
# The smaller of a stage's own limit $1 and the time left, less $2 kept back.
limit() { local l; l=$(left "${2:-0}"); ((l < $1)) && echo "$l" || echo "$1"; }
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
# (Joined without empty entries: an empty one means the current directory.)
LD_LIBRARY_PATH=$(printf '%s' "/usr/local/cuda/lib64:/usr/local/cuda/lib:${WHEEL_LIBS}:${LD_LIBRARY_PATH:-}" |
  tr -s ':' | sed 's/:$//')
export LD_LIBRARY_PATH
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

STAGES="${STAGES:-lit,bench}"
# The seconds the lit stages keep back for the benchmark, where it runs.
BENCH_KEEP=0
[[ ",$STAGES," == *,bench,* ]] && BENCH_KEEP=240
if [[ ",$STAGES," == *,lit,* ]]; then
echo "=== lit: the CUDA tests"
FILTER="${LIT_FILTER:-cuda|profile|torchrun}"
LIT_S=$(limit "${CUDA_LIT_LIMIT:-200}" "$BENCH_KEEP")
# The CUDA tests took 78 s on an H200 (2026-11-27); a stage given less
# (a small BUDGET keeps 240 s back for the benchmark) is cut short.
((LIT_S < 120)) &&
  echo "gpu_check: warning: the lit stage gets only ${LIT_S} s of BUDGET=${BUDGET} (the CUDA tests take about 80-100 s)"
timeout "$LIT_S" "$PY" "${LIT[@]}" -v -j "$(nproc)" build/test \
  --filter "$FILTER" 2>&1 | tee "$LOGS/lit-cuda.log" | tail -40
if [[ ${PIPESTATUS[0]} == 124 ]]; then
  # lit prints no summary when it is killed: name what did not finish,
  # so that a cut stage never reads as a pass.
  "$PY" "${LIT[@]}" --show-tests build/test 2>/dev/null | sed -n 's/^  \(megac :: \)/\1/p' |
    grep -E "$FILTER" | sort >"$LOGS/lit-selected.txt"
  sed -n 's/^[A-Z]*: \(megac :: [^ ]*\) (.*/\1/p' "$LOGS/lit-cuda.log" | sort >"$LOGS/lit-reported.txt"
  echo "=== lit: STOPPED by its time limit (${LIT_S} s) after $(wc -l <"$LOGS/lit-reported.txt") of" \
    "$(wc -l <"$LOGS/lit-selected.txt") tests; these did not finish (not passed):" | tee -a "$LOGS/lit-cuda.log"
  comm -23 "$LOGS/lit-selected.txt" "$LOGS/lit-reported.txt" | sed 's/^/  /' | tee -a "$LOGS/lit-cuda.log"
  rm -f "$LOGS/lit-selected.txt" "$LOGS/lit-reported.txt"
fi
# Tensors compared by absolute error (reference norm under the floor: the
# key biases, whose gradient is rounding noise) are left out of "worst".
echo "=== GPU against CPU: worst relative error per comparison the CUDA tests made"
"$PY" - <<'PYEOF' 2>&1 | tee "$LOGS/compare.log"
import os, subprocess, sys
out = "build/test/runtime/Output"
pairs = [  # (test dir, reference, device result, compare options)
    ("cuda-forward", "cpu.st", "dev-cpu-plan.st", ["--abs-floor", "1e-6"]),
    ("cuda-forward", "cpu.st", "dev-cuda-plan.st", ["--abs-floor", "1e-6"]),
    ("cuda-train", "cpu.st", "dev.st", ["--abs-floor", "1e-6"]),
    ("cuda-train", "cpu.st", "dev2.st", ["--abs-floor", "1e-6"]),
    ("cuda-train", "cpu-drop.st", "dev-drop.st", ["--abs-floor", "1e-6"]),
    ("cuda-train", "cpu-h24.st", "dev-h24.st", ["--abs-floor", "1e-6"]),
    ("cuda-train", "cpu-bf16.st", "dev-bf16.st", ["--prefix", "param/"]),
    ("cuda-train", "cpu-h64.st", "dev-h64.st", ["--prefix", "param/", "--abs-floor", "1e-2"]),
    ("cuda-train", "cpu-h128.st", "dev-h128.st", ["--prefix", "param/", "--abs-floor", "1e-2"]),
    ("cuda-train", "cpu-full64.st", "dev-full64.st", ["--prefix", "param/", "--abs-floor", "1e-2"]),
    ("cuda-train", "cpu-h64.st", "dev-h64.st", ["--prefix", "adam_m/", "--abs-floor", "1e-4"]),
    ("cuda-train", "cpu-h128.st", "dev-h128.st", ["--prefix", "adam_m/", "--abs-floor", "1e-4"]),
    ("cuda-forward", "cpu-bf16.st", "dev-bf16.st", []),
    ("cuda-train", "cpu-h64.st", "wmma-h64.st", ["--prefix", "adam_m/", "--abs-floor", "1e-4"]),
]
for test, a, b, opts in pairs:
    d = os.path.join(out, test + ".test.tmp")
    missing = [f for f in (a, b) if not os.path.exists(os.path.join(d, f))]
    if missing:  # the test did not get that far (or no longer writes it)
        print(f"{test}: {a} vs {b}: not compared, missing {', '.join(missing)}")
        continue
    r = subprocess.run([sys.executable, "utils/compare_safetensors.py", os.path.join(d, a),
                        os.path.join(d, b), "--tol", "1"] + opts, capture_output=True, text=True)
    if r.returncode:  # a tensor over --tol 1 exits 1 too; anything else is the tool failing
        errors = [l for l in r.stderr.splitlines() if l.strip()]
        if errors:
            print(f"{test}: {a} vs {b}: compare failed: {errors[-1]}")
            continue
    rel = [l for l in r.stdout.splitlines() if "relative L2 error" in l]
    worst = max(rel, key=lambda l: float(l.split()[-1]), default="(none)")
    print(f"{test}: {a} vs {b}: {len(rel)} tensors, worst {worst}")
PYEOF
fi
if [[ ",$STAGES," == *,all,* ]]; then
echo "=== lit: the whole suite"
timeout "$(limit "${ALL_LIT_LIMIT:-200}" "$BENCH_KEEP")" "$PY" "${LIT[@]}" -sv -j "$(nproc)" build/test build/test/Unit \
  2>&1 | tee "$LOGS/lit-all.log" | grep -E "^(FAIL|UNSUPPORTED|  )|Passed|Failed|Unsupported" | tail -40
fi
if [[ ",$STAGES," == *,bench,* ]]; then
BENCH_S=$(limit "${BENCH_LIMIT:-600}" 5)
echo "=== bench/gpu_step.py --models $MODELS --runners $RUNNERS (${BENCH_S} s)"
# The benchmark stops starting rows 20 s before its limit; the limit stops
# a row that runs longer than the ones before it said it would.
PYTHONUNBUFFERED=1 timeout "$BENCH_S" "$PY" bench/gpu_step.py --models "$MODELS" \
  --runners "$RUNNERS" --profile-runners "${PROFILE_RUNNERS-megac}" ${BENCH_EXTRA:-} --budget-s "$((BENCH_S > 40 ? BENCH_S - 20 : BENCH_S))" 2>&1 |
  tee "$LOGS/bench.log"
fi
