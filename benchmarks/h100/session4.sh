#!/usr/bin/env bash
# H100 session 4 (issue 4): per-generation fit timings after the compiled GA operators,
# compiled objective reduction and background record writes.
#   bash benchmarks/h100/session4.sh     (GPU machine, repository root, $OUT set)
set -u -o pipefail
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 KINGEN_CACHE=/tmp/kingen-cache
run() { echo "== $*  [$(date +%T)]"; "$@"; rc=$?; echo "== exit $rc  [$(date +%T)]"; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for n in 65536 16384 8192; do
  run timeout 150 python3 benchmarks/fit_gpu.py --population "$n" --generations 10 \
      --out "$OUT/fit_gpu_$n.json" 2>&1 | grep -v NumbaPerf | tail -25
done
# The GA step alone (stand-in evaluation idling 0.1 s as the host does during the solve):
run timeout 150 python3 benchmarks/ga_step.py --populations 8192,16384,65536 --generations 40 \
    --solver-s 0.1 --out "$OUT/ga_step.json"
ls -la "$OUT"
