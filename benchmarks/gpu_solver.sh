#!/usr/bin/env bash
# The solver's GPU session: correctness on the real GPU, throughput and baselines, tuning and
# the kernel analysis. Run on the GPU machine from the repository root with $OUT set:
#   bash benchmarks/gpu_solver.sh
# Results land in $OUT; copy them into benchmarks/results/ and analysis/.
set -u
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 KINGEN_CACHE=/tmp/kingen-cache
run() { echo "== $*"; "$@"; echo "== exit $?"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 -c "import numpy, numba, numba_cuda, scipy; print(numpy.__version__, numba.__version__, scipy.__version__)"
run timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_solver.py -k "cuda" -x
run timeout 240 python3 benchmarks/solver.py --models robert_howe_2003 --backends cuda,cpu \
    --populations 256,1024,4096,16384,65536 --budget-s 25 --out "$OUT/solver_rh03.json"
run timeout 90 python3 -m kingen.cli tune --precision float64 --out "$OUT/tune_f64.json"
run timeout 120 python3 benchmarks/solver.py --backends cuda --no-scipy --jax "" \
    --populations 256,4096,16384,65536 --budget-s 6 --out "$OUT/solver_all_gpu.json"
run timeout 150 python3 -m kingen.cli analyze rk4 --out "$OUT/analyze_rk4"
ls -la "$OUT" "$OUT/analyze_rk4" 2>/dev/null
