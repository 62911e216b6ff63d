#!/usr/bin/env bash
# H100 session 1 (issue 3, 4): why the CPU backend overran on the GPU machine, the CPU backend
# and JAX ratios, R&H throughput on the H100, and the 65,536 fit's outside-solver share.
#   bash benchmarks/h100/session1.sh     (GPU machine, repository root, $OUT set)
set -u -o pipefail
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 KINGEN_CACHE=/tmp/kingen-cache \
    XLA_PYTHON_CLIENT_PREALLOCATE=false
run() { echo "== $*  [$(date +%T)]"; "$@"; rc=$?; echo "== exit $rc  [$(date +%T)]"; return $rc; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "nproc $(nproc)"; python3 -c "import os; print('cpu_count', os.cpu_count(), 'affinity', len(os.sched_getaffinity(0)))"
cat /sys/fs/cgroup/cpu.max 2>/dev/null; lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket|NUMA node\(s\)"
env | grep -E "^(OMP|MKL|NUMBA|OPENBLAS|KMP)" ; python3 -m numba -s 2>/dev/null | sed -n '/__Threading Layer/,/__/p'
dump() {  # python with a stack dump every 30 s, and a look at the busiest threads at 45 s
  ( sleep 45; top -b -H -n 1 | head -25 ) &
  python3 -c "import faulthandler,sys,runpy; faulthandler.dump_traceback_later(30, repeat=True); \
sys.argv=sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')" "$@"
}
run timeout 120 bash -c "$(declare -f dump); dump benchmarks/solver.py --models robert_howe_2003 \
    --backends cpu --precisions float64 --populations 32,128 --budget-s 40 --no-scipy --jax '' \
    --out $OUT/solver_rh03_cpu.json" 2>&1 | grep -v NumbaPerf \
  || run timeout 120 env NUMBA_NUM_THREADS=16 NUMBA_THREADING_LAYER=workqueue bash -c \
    "$(declare -f dump); dump benchmarks/solver.py --models robert_howe_2003 --backends cpu \
    --precisions float64 --populations 32,128 --budget-s 40 --no-scipy --jax '' \
    --out $OUT/solver_rh03_cpu_workqueue.json" 2>&1 | grep -v NumbaPerf
run timeout 200 python3 benchmarks/solver.py --models robert_howe_2003 --backends cuda \
    --populations 4096,16384,65536 --budget-s 30 --no-scipy --jax robert_howe_2003 \
    --out "$OUT/solver_rh03_cuda_jax.json" 2>&1 | grep -v NumbaPerf
run timeout 90 python3 benchmarks/fit_gpu.py --population 65536 --generations 4 \
    --out "$OUT/fit_gpu_65536_before.json" 2>&1 | grep -v NumbaPerf
ls -la "$OUT"
