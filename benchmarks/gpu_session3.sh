#!/usr/bin/env bash
# Third GPU session: the CPU backend on the GPU machine's cores and the JAX baselines for the
# solver goal (issue 3), and the solver kernel's analysis with ncu (issue 6).
#   bash benchmarks/gpu_session3.sh      (on the GPU machine, repository root, $OUT set)
set -u
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 KINGEN_CACHE=/tmp/kingen-cache
run() { echo "== $*"; "$@"; echo "== exit $?"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
run timeout 230 python3 benchmarks/solver.py --models robert_howe_2003 --backends cpu \
    --precisions float64 --populations 32,128 --budget-s 40 --jax robert_howe_2003 \
    --out "$OUT/solver_rh03_cpu_jax.json"
run timeout 230 python3 -m kingen.cli analyze rk4 --out "$OUT/analyze_rk4"
