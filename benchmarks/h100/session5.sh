#!/usr/bin/env bash
# H100 session 5 (issue 3): the configurations earlier sessions did not record in JSON:
# Raman & Trussell 1992 on both backends, and Coombs 2017 float64 at 65,536 on the GPU.
#   bash benchmarks/h100/session5.sh     (GPU machine, repository root, $OUT set)
set -u -o pipefail
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 KINGEN_CACHE=/tmp/kingen-cache
run() { echo "== $*  [$(date +%T)]"; "$@"; rc=$?; echo "== exit $rc  [$(date +%T)]"; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
run timeout 240 python3 benchmarks/solver.py --models raman_trussell_1992 --backends cuda,cpu \
    --populations 256,4096,16384,65536 --budget-s 8 --jax "" \
    --out "$OUT/solver_raman.json" 2>&1 | grep -v NumbaPerf
run timeout 150 python3 benchmarks/solver.py --models coombs_2017 --backends cuda \
    --precisions float64 --populations 65536 --budget-s 40 --jax "" --no-scipy \
    --out "$OUT/solver_coombs_f64_65536.json" 2>&1 | grep -v NumbaPerf
ls -la "$OUT"
