#!/usr/bin/env bash
# Issue 15: profiles of every free parameter of the bundled demo fit at 25 points, on the
# GPU (goal: <= 2 minutes on an H100). Fits the demo first (its time is in fit_s).
#   bash benchmarks/h100/profile_demo.sh     (GPU machine, repository root, $OUT set)
set -u -o pipefail
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 KINGEN_CACHE=/tmp/kingen-cache
python3 benchmarks/profile_demo.py --backend cuda --points 25 \
    --out "$OUT/profile_demo.json"
