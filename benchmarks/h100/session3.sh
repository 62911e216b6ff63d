#!/usr/bin/env bash
# H100 session 3 (issue 3): Robert & Howe 2003 in one run (both backends and precisions,
# SciPy, exact reference and JAX baselines), then the schemes session 2 did not reach.
#   bash benchmarks/h100/session3.sh     (GPU machine, repository root, $OUT set)
set -u -o pipefail
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 KINGEN_CACHE=/tmp/kingen-cache \
    XLA_PYTHON_CLIENT_PREALLOCATE=false
run() { echo "== $*  [$(date +%T)]"; "$@"; rc=$?; echo "== exit $rc  [$(date +%T)]"; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
run timeout 330 python3 benchmarks/solver.py --models robert_howe_2003 --backends cuda,cpu \
    --populations 64,256,4096,16384,65536 --budget-s 30 --jax robert_howe_2003 \
    --out "$OUT/solver_rh03.json" 2>&1 | grep -v NumbaPerf
run timeout 230 python3 benchmarks/solver.py --models geiger_1999,coombs_2017,raman_trussell_1992 \
    --backends cuda,cpu --populations 64,256,4096,16384,65536 --budget-s 8 --jax "" \
    --out "$OUT/solver_others2.json" 2>&1 | grep -v NumbaPerf
ls -la "$OUT"
