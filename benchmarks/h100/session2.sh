#!/usr/bin/env bash
# H100 session 2 (issue 3): the solver benchmark on every shipped scheme, both backends, both
# precisions, SciPy and exact-reference baselines, and the JAX baseline, in one machine's run
# (after the CPU backend's subnormal flush and dynamic scheduling).
#   bash benchmarks/h100/session2.sh     (GPU machine, repository root, $OUT set)
set -u -o pipefail
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 KINGEN_CACHE=/tmp/kingen-cache \
    XLA_PYTHON_CLIENT_PREALLOCATE=false
run() { echo "== $*  [$(date +%T)]"; "$@"; rc=$?; echo "== exit $rc  [$(date +%T)]"; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
run timeout 250 python3 benchmarks/solver.py --models robert_howe_2003 --backends cpu,cuda \
    --populations 256,4096,16384,65536 --budget-s 12 --jax robert_howe_2003 \
    --out "$OUT/solver_rh03.json" 2>&1 | grep -v NumbaPerf
run timeout 290 python3 benchmarks/solver.py \
    --models jonas_1993,destexhe_1994_ampa5,raman_trussell_1992,geiger_1999,coombs_2017 \
    --backends cuda,cpu --populations 256,4096,16384,65536 --budget-s 8 --jax "" \
    --out "$OUT/solver_others.json" 2>&1 | grep -v NumbaPerf
ls -la "$OUT"
