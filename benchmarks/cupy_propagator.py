"""The afternoon baseline: kingen's propagator written as batched matrix products in CuPy.

What a user who knows CuPy could write in an afternoon, given the idea of issue #11: for
every candidate and every distinct (h, c, n) of the schedule, M = R(hQ)ⁿ built with batched
matmuls (Horner for R, then binary powers), and then one batched vector–matrix product per
sample for all candidates at once, with the objective's sums (Σw·g², Σw·g·d) accumulated
on the GPU by a fused elementwise kernel. Same schedule, same initial state, same data as
kingen's objective mode; the script checks its sums against kingen's on the first
``--check`` candidates and reports candidates/s beside kingen's own figure.

    python -m benchmarks cupy_propagator --model robert_howe_2003 --population 16384 \\
        --precision float64 --name rh03_f64

(``benchmarks/results/<device>/cupy_propagator/rh03_f64.json``; ``--out FILE`` to choose).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from benchmarks.solver import candidates, objective_inputs  # noqa: E402
from kingen.experiment.protocol import standard_protocol  # noqa: E402
from kingen.model.scheme import Scheme  # noqa: E402
from kingen.solve import Simulator  # noqa: E402
from kingen.solve.options import SolverOptions  # noqa: E402

STANDARD = ("deactivation", "desensitization", "recovery", "dose_response")


def build_matrices(cp, scheme: Scheme, params, keys_f, keys_i, dtype):
    """M = R(hQ)ⁿ per key and candidate: (n_keys, N, S, S), by batched matmuls."""
    S = scheme.n_states
    N = params.shape[0]
    eye = cp.eye(S, dtype=dtype)[None]
    mats = []
    for (h, c, _, _), n in zip(keys_f, keys_i):
        q = cp.zeros((N, S, S), dtype=dtype)
        for t in scheme.transitions:
            k = params[:, t.param] * t.factor * (c if t.agonist else 1.0)
            q[:, t.source, t.target] += k
        q -= cp.eye(S, dtype=dtype)[None] * q.sum(axis=2)[:, :, None]
        a = q * h
        r = eye + a / 4
        r = eye + cp.matmul(a, r) / 3
        r = eye + cp.matmul(a, r) / 2
        r = eye + cp.matmul(a, r)
        m, power, n = None, r, int(n)
        while n:
            if n & 1:
                m = power if m is None else cp.matmul(m, power)
            n >>= 1
            if n:
                power = cp.matmul(power, power)
        mats.append(m)
    return mats


def run_baseline(cp, sim: Simulator, params: np.ndarray, dtype) -> tuple[np.ndarray, ...]:
    """Σw·g² and Σw·g·d per (candidate, sweep), one batched product per sample."""
    scheme, sched = sim.scheme, sim.schedule
    plan = sim.propagator_plan()
    full = scheme.complete(params)
    P, S0, _ = sim.inputs(params)  # kingen's own initial state, so both start alike
    d_params = cp.asarray(full, dtype=dtype)
    mats = build_matrices(cp, scheme, d_params, plan.keys_f, plan.keys_i, dtype)
    gc = cp.asarray(scheme.conductance, dtype=dtype)
    data = cp.asarray(sim.objective.data, dtype=dtype)
    weight = cp.asarray(sim.objective.weight, dtype=dtype)
    accumulate = cp.ElementwiseKernel(
        "T g, T w, T d", "T sgg, T sgd", "sgg += w * g * g; sgd += w * g * d",
        "kingen_baseline_accumulate")
    N = params.shape[0]
    sgg = cp.zeros((N, sim.n_sweeps), dtype=dtype)
    sgd = cp.zeros((N, sim.n_sweeps), dtype=dtype)
    for w in range(sim.n_sweeps):
        p = cp.asarray(S0.T, dtype=dtype)[:, None, :]
        drv = float(sim.drive[w])
        s = int(sched.sample_start[w])
        col_gg, col_gd = cp.zeros(N, dtype=dtype), cp.zeros(N, dtype=dtype)
        g = (p[:, 0, :] @ gc) * drv
        accumulate(g, weight[s], data[s], col_gg, col_gd)
        for r in range(int(sched.row_start[w]), int(sched.row_start[w + 1])):
            m = mats[int(plan.row_key[r])]
            for _ in range(int(sched.rows_i[r, 1])):
                p = cp.matmul(p, m)
                if sched.rows_i[r, 2]:
                    s += 1
                    g = (p[:, 0, :] @ gc) * drv
                    accumulate(g, weight[s], data[s], col_gg, col_gd)
        sgg[:, w] = col_gg
        sgd[:, w] = col_gd
    cp.cuda.Stream.null.synchronize()
    return cp.asnumpy(sgg), cp.asnumpy(sgd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="robert_howe_2003")
    ap.add_argument("--population", type=int, default=16384)
    ap.add_argument("--precision", default="float64", choices=["float64", "float32"])
    ap.add_argument("--check", type=int, default=64)
    add_output_options(ap, "cupy_propagator")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    import cupy as cp  # only this suite needs CuPy

    scheme = Scheme.load(ROOT / "models" / f"{args.model}.toml")
    protocols = [standard_protocol(n) for n in STANDARD]
    obj = objective_inputs(scheme, protocols)
    sim = Simulator(scheme, protocols,
                    options=SolverOptions(backend="cuda", precision=args.precision),
                    objective=obj)
    dtype = np.dtype(args.precision)
    result = {"provenance": provenance("cupy_propagator", argv), "model": args.model,
              "precision": args.precision, "device": sim.device,
              "samples_per_candidate": int(sim.schedule.n_samples)}
    check = candidates(scheme, args.check, seed=7)
    ref = sim.run(check, "objective")
    got_gg, got_gd = run_baseline(cp, sim, check, dtype)
    result["check_rel_error_sgg"] = float(np.max(np.abs(got_gg - ref.sgg) / np.abs(ref.sgg)))
    result["check_rel_error_sgd"] = float(np.max(np.abs(got_gd - ref.sgd) /
                                                 np.maximum(np.abs(ref.sgd), 1e-300)))
    params = candidates(scheme, args.population, seed=11)
    t = time.perf_counter()
    run_baseline(cp, sim, params, dtype)
    baseline_s = time.perf_counter() - t
    sim.run(params, "objective")
    t = time.perf_counter()
    sim.run(params, "objective")
    kingen_s = time.perf_counter() - t
    result.update(population=args.population, baseline_s=baseline_s,
                  baseline_candidates_per_s=args.population / baseline_s,
                  kingen_s=kingen_s, kingen_candidates_per_s=args.population / kingen_s,
                  kingen_launch=sim.launch_config().name,
                  kingen_over_baseline=baseline_s / kingen_s)
    write(result, output_path(args, "cupy_propagator"))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
