#!/usr/bin/env bash
# H100 session 6 (issue 4): what idling during the GPU solve costs the GA step's threads.
# The operators on all threads (--parallel-from 0) back to back and after 0.1 s idle, then
# the shipped rule (one thread under 2^18 genes) after 0.1 s idle.
#   bash benchmarks/h100/session6.sh     (GPU machine, repository root, $OUT set)
set -u -o pipefail
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 KINGEN_CACHE=/tmp/kingen-cache
g() { echo "== ga_step $*"; python3 benchmarks/ga_step.py --populations 8192,16384,65536 \
        --generations 40 "$@"; }
g --parallel-from 0 --solver-s 0 --out "$OUT/ga_step_all_threads_busy.json"
g --parallel-from 0 --solver-s 0.1 --out "$OUT/ga_step_all_threads_idle.json"
g --solver-s 0.1 --out "$OUT/ga_step_shipped_idle.json"
