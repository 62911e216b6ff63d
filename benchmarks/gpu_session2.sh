#!/usr/bin/env bash
# Second GPU session: the fit at large populations (issue 4), the CPU-backend and JAX baselines
# of the solver goal (issue 3), and the solver kernel's analysis (issue 6).
#   bash benchmarks/gpu_session2.sh      (on the GPU machine, repository root, $OUT set)
set -u
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 KINGEN_CACHE=/tmp/kingen-cache
run() { echo "== $*"; "$@"; echo "== exit $?"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
run timeout 100 python3 benchmarks/fit_gpu.py --population 16384 --generations 5 \
    --out "$OUT/fit_gpu_16384.json"
run timeout 120 python3 benchmarks/fit_gpu.py --population 65536 --generations 4 \
    --out "$OUT/fit_gpu_65536.json"
run timeout 200 python3 benchmarks/solver.py --models robert_howe_2003 --backends cpu \
    --precisions float64 --populations 64,256 --budget-s 60 --jax robert_howe_2003 \
    --out "$OUT/solver_rh03_cpu_jax.json"
run timeout 170 python3 -m kingen.cli analyze rk4 --out "$OUT/analyze_rk4"
