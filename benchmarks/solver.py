"""Solver throughput: model-steps per second of the batched RK4, and the baselines.

A model-step is one RK4 step of one scheme for one candidate under one sweep. For each
shipped scheme on the standard protocol set (ideal steps, sampled at 50 kHz), both backends,
both precisions and populations from 256 to 65,536, the objective-mode batch (the GA's path)
is timed after a warm-up that compiles it. A configuration whose predicted time exceeds
``--budget-s`` is recorded as skipped with its prediction. Baselines, same machine, same run:
SciPy ``solve_ivp`` per candidate (LSODA, rtol 1e-6: what a user would write), the exact
reference per candidate, and a vmapped JAX RK4 of the same scheme with the same steps and
precision (on the GPU when JAX sees one) against kingen's kernel on the same protocol.

    python -m benchmarks solver --models robert_howe_2003 --name rh03

writes ``benchmarks/results/<device>/solver/rh03.json`` (``--out FILE`` to choose).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import add_output_options, output_path, provenance, write  # noqa: E402
from kingen.codegen import N_WINDOWS  # noqa: E402
from kingen.experiment.protocol import standard_protocol, standard_set  # noqa: E402
from kingen.model.scheme import Scheme  # noqa: E402
from kingen.solve import ObjectiveInputs, Simulator, simulate_exact  # noqa: E402
from kingen.solve.backends import cuda_status  # noqa: E402
from kingen.solve.options import SolverOptions  # noqa: E402

POPULATIONS = (256, 1024, 4096, 16384, 65536)


def candidates(scheme: Scheme, n: int, seed: int = 0, spread: float = 0.2) -> np.ndarray:
    """Random candidates, log-uniform in the middle ``spread`` of each log range: by default
    the middle fifth (all stable, realistic; a population gathering as a fit converges); 1
    draws from the whole bounds, as a fit's first generation does."""
    rng = np.random.default_rng(seed)
    lo, hi = np.log(scheme.lower), np.log(scheme.upper)
    mid, half = 0.5 * (lo + hi), 0.5 * spread * (hi - lo)
    return scheme.complete(np.exp(rng.uniform(mid - half, mid + half,
                                              (n, scheme.n_params))))


WINDOWS = ("sweep", "none", "targets")


def objective_inputs(scheme: Scheme, protocols, windows: str = "sweep") -> ObjectiveInputs:
    """Data = the file's own currents plus noise, weight 1, and the kernel's windows:
    ``sweep`` one peak window over each whole sweep (every span meets it), ``none`` none (a
    fit to recordings alone), ``targets`` the four a fit with summary targets reads
    (:func:`kingen.fitting.targets.sweep_windows`)."""
    from kingen.fitting.targets import sweep_windows

    if windows not in WINDOWS:
        raise ValueError(f"windows must be one of {WINDOWS}, got {windows!r}")
    probe = Simulator(scheme, protocols, options=SolverOptions(backend="cpu"))
    n = probe.schedule.n_samples
    trace = np.concatenate([c for p in protocols for c in simulate_exact(scheme, p).currents])
    win = np.full((probe.n_sweeps, N_WINDOWS, 3), -1, dtype=np.int64)
    sweeps = [(p.kind, s) for p in protocols for s in p.sweeps]
    for w, (kind, sweep) in enumerate(sweeps):
        m = int(probe.schedule.sample_start[w + 1] - probe.schedule.sample_start[w])
        if windows == "sweep":
            win[w, 0] = (0, m - 1, 0)
        elif windows == "targets":
            win[w] = sweep_windows(sweep, kind)
    rng = np.random.default_rng(1)
    return ObjectiveInputs(trace + rng.normal(0, 0.02 * np.abs(trace).max(), n), np.ones(n),
                           win)


def time_kingen(scheme, protocols, backend, precision, populations, budget_s, log):
    """Throughput of the objective batch for each population (skips what would overrun)."""
    obj = objective_inputs(scheme, protocols)
    sim = Simulator(scheme, protocols,
                    options=SolverOptions(backend=backend, precision=precision), objective=obj)
    steps = sim.schedule.total_steps  # per candidate, all sweeps
    t0 = time.perf_counter()
    sim.run(candidates(scheme, 4), "objective")  # compile + warm-up
    warm = time.perf_counter() - t0
    log(f"    warm-up (compile + 4 candidates): {warm:.1f} s")
    rows, last = [], None
    for n in populations:
        # Time grows at most linearly with N (less while the GPU is not yet full), so once a
        # run takes half the budget the next, larger one is skipped.
        if last is not None and last[1] > budget_s / 2:
            predicted = last[1] * n / last[0]
            rows.append({"population": n, "skipped": True, "predicted_s_at_most": predicted})
            log(f"    N={n:6d} skipped (previous run {last[1]:.1f} s > budget/2)")
            continue
        params = candidates(scheme, n, seed=n)
        res = sim.run(params, "objective")
        solve = res.timings["solve_s"]
        rate = n * steps / solve
        last = (n, solve)
        rows.append({"population": n, "solve_s": solve, "total_s": res.timings["total_s"],
                     "model_steps_per_s": rate, "failed": int((res.fail != 0).any(1).sum())})
        log(f"    N={n:6d} {solve:8.3f} s  {rate:.3e} model-steps/s")
    return {"steps_per_candidate": steps, "sweeps": sim.n_sweeps, "device": sim.device,
            "warmup_s": warm, "runs": rows}


def time_scipy(scheme, protocols, repeats: int = 1) -> dict:
    """Per-candidate time of solve_ivp (LSODA, rtol 1e-6) and of the exact reference."""
    from scipy.integrate import solve_ivp

    p = scheme.values
    q0, q1 = scheme.Q(0.0, p), scheme.Q(1.0, p)
    dq = q1 - q0
    rest = scheme.rest_occupancy(p)
    t0 = time.perf_counter()
    for _ in range(repeats):
        for prot in protocols:
            for sw in prot.sweeps:
                def rhs(t, y, sw=sw):
                    c = float(sw.concentration(t))
                    return y @ q0 + c * (y @ dq)
                # max_step keeps the integrator from stepping over a pulse
                solve_ivp(rhs, (0, sw.duration), rest, method="LSODA", rtol=1e-6, atol=1e-9,
                          t_eval=sw.times(), max_step=0.5)
    scipy_s = (time.perf_counter() - t0) / repeats
    t0 = time.perf_counter()
    for prot in protocols:
        simulate_exact(scheme, prot)
    exact_s = time.perf_counter() - t0
    return {"scipy_lsoda_s_per_candidate": scipy_s, "exact_reference_s_per_candidate": exact_s}


def time_jax(scheme, protocol, precision: str, n: int, max_steps: int, log) -> dict:
    """Vmapped JAX RK4 with kingen's schedule (same steps, same precision), in two forms:
    ``dense`` (dp/dt = p·Q with Q built per candidate: what a user would write) and
    ``sparse`` (fluxes k·p[source] times the ±1 incidence matrix: the best a user could do
    without generated code). Both run the protocol's first rows up to ``max_steps`` steps
    (a dense step moves N·S² numbers, so whole protocols take hours) and are compared in
    model-steps/s with kingen's kernel on the whole protocol, same N and precision."""
    import jax

    jax.config.update("jax_enable_x64", precision == "float64")
    import jax.numpy as jnp

    dtype = jnp.float64 if precision == "float64" else jnp.float32
    obj = objective_inputs(scheme, [protocol])
    sim = Simulator(scheme, [protocol],
                    options=SolverOptions(backend="auto", precision=precision), objective=obj)
    sched = sim.schedule
    assert not sched.rows_i[:, 3].any(), "JAX baseline runs ideal-step protocols"
    S, T = scheme.n_states, len(scheme.transitions)
    src = np.array([t.source for t in scheme.transitions])
    tgt = np.array([t.target for t in scheme.transitions])
    par = np.array([t.param for t in scheme.transitions])
    fac = np.array([t.factor for t in scheme.transitions])
    ag = np.array([t.agonist for t in scheme.transitions], dtype=float)
    incidence = np.zeros((T, S))
    incidence[np.arange(T), tgt] += 1.0
    incidence[np.arange(T), src] -= 1.0
    inc = jnp.asarray(incidence, dtype=dtype)
    cond = jnp.asarray(scheme.conductance, dtype=dtype)
    drive = float(protocol.sweeps[0].driving_force * 1e-3)
    data = jnp.asarray(obj.data, dtype=dtype)

    def rates(params, c):
        return params[:, par] * fac * jnp.where(ag > 0, c, 1.0)

    def dense_f(params, c):
        k = rates(params, c)
        q = jnp.zeros((params.shape[0], S, S), dtype=dtype).at[:, src, tgt].add(k)
        q = q - jnp.eye(S, dtype=dtype)[None] * q.sum(-1)[:, :, None]
        return lambda y: jnp.einsum("ns,nst->nt", y, q)

    def sparse_f(params, c):
        k = rates(params, c)
        return lambda y: (k * y[:, src]) @ inc

    def make_row(make_f):
        @jax.jit
        def run_row(p, acc, params, c, h, nsteps, nrep, s0):
            f = make_f(params, c)

            def step(_, y):
                k1 = f(y)
                k2 = f(y + 0.5 * h * k1)
                k3 = f(y + 0.5 * h * k2)
                k4 = f(y + h * k3)
                return y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)

            def rep(r, carry):
                y, a = carry
                y = jax.lax.fori_loop(0, nsteps, step, y)
                g = (y @ cond) * drive
                return y, a + (g * g - 2 * g * data[s0 + r])

            return jax.lax.fori_loop(0, nrep, rep, (p, acc))
        return run_row

    params = candidates(scheme, n, seed=7)
    P = jnp.asarray(params, dtype=dtype)
    p0 = jnp.asarray(scheme.rest_occupancy(params), dtype=dtype)

    def run_all(run_row, budget):
        p, acc, s, done = p0, jnp.zeros(n, dtype=dtype), 1, 0
        for (_, h, c, *_), (nsteps, nrep, rec, _) in zip(sched.rows_f, sched.rows_i):
            reps = int(nrep)
            if done + nsteps * reps > budget:
                reps = max(1, (budget - done) // int(nsteps))
            p, acc = run_row(p, acc, P, dtype(c), dtype(h), int(nsteps), reps, s)
            s += reps if rec else 0
            done += int(nsteps) * reps
            if done >= budget:
                break
        acc.block_until_ready()
        return done

    out = {"protocol": protocol.name, "population": n, "jax_device": str(jax.devices()[0]),
           "jax_max_steps": max_steps}
    for form, make_f in (("sparse", sparse_f), ("dense", dense_f)):
        run_row = make_row(make_f)
        run_all(run_row, 50)  # compile
        t0 = time.perf_counter()
        steps = run_all(run_row, max_steps)
        took = time.perf_counter() - t0
        out[f"jax_{form}_steps"] = steps
        out[f"jax_{form}_s"] = took
        out[f"jax_{form}_model_steps_per_s"] = n * steps / took
    steps = sched.total_steps
    sim.run(params[:32], "objective")
    res = sim.run(params, "objective")
    out.update({"steps_per_candidate": steps, "kingen_backend": sim.backend,
                "kingen_device": sim.device, "kingen_s": res.timings["solve_s"],
                "kingen_model_steps_per_s": n * steps / res.timings["solve_s"]})
    for form in ("sparse", "dense"):
        out[f"speedup_vs_jax_{form}"] = (out["kingen_model_steps_per_s"]
                                         / out[f"jax_{form}_model_steps_per_s"])
    log(f"    JAX sparse {out['jax_sparse_model_steps_per_s']:.3e}, dense "
        f"{out['jax_dense_model_steps_per_s']:.3e}, kingen "
        f"{out['kingen_model_steps_per_s']:.3e} model-steps/s: "
        f"{out['speedup_vs_jax_sparse']:.1f}x / {out['speedup_vs_jax_dense']:.1f}x")
    return out


def _threading_layer() -> str:
    """Numba's CPU threading layer (after one parallel call), for the record."""
    import numba

    @numba.njit(parallel=True)
    def touch(n):
        s = 0.0
        for i in numba.prange(n):
            s += i
        return s

    touch(1000)
    try:
        return numba.threading_layer()
    except ValueError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="all", help="comma-separated stems, or all")
    ap.add_argument("--backends", default="cpu,cuda")
    ap.add_argument("--precisions", default="float64,float32")
    ap.add_argument("--populations", default=",".join(map(str, POPULATIONS)))
    ap.add_argument("--budget-s", type=float, default=15.0,
                    help="skip a configuration predicted to take longer than this")
    ap.add_argument("--dt", type=float, default=0.02, help="sampling interval, ms")
    ap.add_argument("--no-scipy", action="store_true")
    ap.add_argument("--jax", default="robert_howe_2003",
                    help="schemes for the JAX baseline (comma-separated; '' for none)")
    ap.add_argument("--jax-population", type=int, default=16384)
    ap.add_argument("--jax-precisions", default="float64,float32")
    ap.add_argument("--jax-max-steps", type=int, default=4000,
                    help="RK4 steps the JAX baselines run (throughput is compared)")
    add_output_options(ap, "solver")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    out = output_path(args, "solver")

    def log(msg: str) -> None:
        print(msg, flush=True)

    paths = sorted((ROOT / "models").glob("*.toml"))
    if args.models != "all":  # in the order given: a run cut short keeps the first ones
        by_stem = {p.stem: p for p in paths}
        paths = [by_stem[m] for m in args.models.split(",") if m in by_stem]
    status = cuda_status()
    backends = [b for b in args.backends.split(",")
                if b == "cpu" or (status.usable and not status.simulator)]
    protocols = standard_set(dt=args.dt)
    pops = [int(x) for x in args.populations.split(",")]
    layer = _threading_layer()
    log(f"numba {__import__('numba').__version__}: {__import__('numba').config.NUMBA_NUM_THREADS}"
        f" threads, threading layer {layer}; GPU: {status.device or status.reason}")
    result = {
        "provenance": provenance("solver", argv),
        "device": status.device if status.usable else "none",
        "numba_threads": __import__("numba").config.NUMBA_NUM_THREADS,
        "numba_threading_layer": layer,
        "protocols": [p.name for p in protocols], "dt_ms": args.dt,
        "schemes": {},
    }
    for path in paths:
        scheme = Scheme.load(path)
        entry: dict = {"states": scheme.n_states, "transitions": len(scheme.transitions),
                       "runs": {}}
        log(f"{path.stem}: {scheme.n_states} states, {len(scheme.transitions)} transitions")
        result["schemes"][path.stem] = entry

        def save() -> None:  # after every configuration: a run cut short keeps what it did
            write(result, out)

        for backend in backends:
            for precision in args.precisions.split(","):
                log(f"  {backend} {precision}")
                entry["runs"][f"{backend}/{precision}"] = time_kingen(
                    scheme, protocols, backend, precision, pops, args.budget_s, log)
                save()
        if not args.no_scipy:
            entry["baselines"] = time_scipy(scheme, protocols)
            log(f"  scipy {entry['baselines']['scipy_lsoda_s_per_candidate']:.2f} s/candidate,"
                f" exact {entry['baselines']['exact_reference_s_per_candidate']:.2f} s")
        if path.stem in args.jax.split(","):
            entry["jax"] = {}
            for precision in args.jax_precisions.split(","):
                try:
                    entry["jax"][precision] = time_jax(
                        scheme, standard_protocol("desensitization", dt=args.dt), precision,
                        args.jax_population, args.jax_max_steps, log)
                except Exception as exc:  # JAX missing or broken must not lose the rest
                    entry["jax"][precision] = {"error": f"JAX baseline failed: {exc!r}"}
                    log(f"    JAX baseline failed: {exc!r}")
        save()
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
