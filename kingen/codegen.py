"""Generate straight-line RK4 code for a scheme.

Every state is a scalar local and every rate a scalar local, so a GPU thread keeps its state
in registers: there are no run-time-indexed arrays in the step. The generated module defines
``run_thread`` (one (candidate, sweep) pair of a batch) and ``conc_at`` (the concentration
waveform); :mod:`kingen.solve.cpu` and :mod:`kingen.solve.cuda` compile it with Numba's CPU
and CUDA targets by supplying the ``DEVICE`` decorator.

Rates are recomputed once per schedule row on constant-concentration rows, and at each
stage time (only the agonist-dependent ones) on smooth rows.

Layout of the arguments (see :mod:`kingen.solve.schedule` for the rows):

- ``P`` (n_params, N): parameters, parameter-major so that a warp's loads coalesce.
- ``S0`` (n_states, N): initial occupancies.
- ``pulses`` (n, 5): start, end, concentration, σ_rise, σ_decay (σ 0: ideal step);
  ``transients`` (n, 5): start, amplitude, τ_decay, τ_rise, end; ``*_start`` index by sweep.
- ``drive`` (n_sweeps,): driving force × 1e-3, so that Σ gᵢ pᵢ · drive is pA per channel.
- objective mode: ``data``, ``weight`` (n_samples_total,), ``win`` (n_sweeps, W, 3) int:
  first sample, last sample, op (0 peak, 1 sum, −1 unused); ``out`` (n_sweeps, 2 + 2W, N):
  Σw·g², Σw·g·d, then per window (value, sample index); ``fail`` (n_sweeps, N).
- trace mode: ``trace`` (N, n_samples_total) current per channel; ``occ``
  (N, n_samples_total, n_states) when ``with_occupancy``.

Failure codes: 0 ok, 1 non-finite state, 2 a probability outside [0, 1] beyond tolerance,
3 total probability drifted beyond tolerance (4, invalid parameters, is set by the host).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kingen.scheme import Scheme

N_WINDOWS = 4
N_OUT = 2 + 2 * N_WINDOWS
FAIL_OK, FAIL_NONFINITE, FAIL_RANGE, FAIL_CONSERVATION, FAIL_PARAMS = 0, 1, 2, 3, 4
FAILURE_NAMES = {
    FAIL_OK: "ok",
    FAIL_NONFINITE: "non-finite state",
    FAIL_RANGE: "probability outside [0, 1]",
    FAIL_CONSERVATION: "total probability not conserved",
    FAIL_PARAMS: "invalid parameters (non-finite or not > 0)",
}


@dataclass(frozen=True)
class GeneratedCode:
    """Source of a generated solver module and a key identifying it."""

    source: str
    key: str
    n_states: int
    n_transitions: int


def _c(x: float) -> str:
    return f"F({float(x)!r})"


def generate(scheme: Scheme, mode: str, *, with_occupancy: bool = False,
             compensated: bool = False, flush_below: float = 0.0) -> GeneratedCode:
    """Python source of the RK4 thread body for ``scheme``.

    Parameters
    ----------
    scheme
        The parsed scheme (its states, transitions and conductances are baked in).
    mode
        ``"objective"`` (reduce errors and window values in the thread) or ``"traces"``.
    with_occupancy
        In trace mode, also store the occupancies.
    compensated
        Add each step's increment with Kahan compensation. Float32 needs it: with steps of
        ~0.1 µs, a slow rate's increment per step is near float32's rounding unit and would
        otherwise be lost systematically (slow recovery from desensitization drifts by %).
    flush_below
        After every step, set occupancies smaller than this in magnitude to exactly zero
        (0 leaves them alone). The CPU backend needs it: during long agonist-free intervals
        the bound states decay through the subnormal range, and on Intel CPUs every
        arithmetic operation on a subnormal operand takes a microcode assist (~100 cycles);
        on the GPU machine's Xeon, Robert & Howe's standard protocols ran more than 14x
        slower per core than on an AMD core until this flush. Flushing at 1e-100 (float64) keeps
        every product and square in the step and the objective normal, at an error far
        below the solver's tolerance. GPUs handle subnormals at full speed.
    """
    if mode not in ("objective", "traces"):
        raise ValueError(f"mode must be 'objective' or 'traces', got {mode!r}")
    S = scheme.n_states
    T = scheme.transitions
    L: list[str] = []
    a = L.append

    # ---- concentration waveform (shared by both modes)
    a("@DEVICE")
    a("def conc_at(t, tm, pulses, p0, p1, transients, r0, r1):")
    a("    c = 0.0")
    a("    for k in range(p0, p1):")
    a("        start = pulses[k, 0]")
    a("        end = pulses[k, 1]")
    a("        sr = pulses[k, 3]")
    a("        sd = pulses[k, 4]")
    a("        if sr > 0.0:")
    a("            z = (t - start) / sr")
    a("            up = 0.0 if z <= -EDGE else (1.0 if z >= EDGE else "
      "0.5 * (1.0 + math.erf(z * RSQRT2)))")
    a("        else:")
    a("            up = 1.0 if tm >= start else 0.0")
    a("        if sd > 0.0:")
    a("            z = (t - end) / sd")
    a("            down = 0.0 if z <= -EDGE else (1.0 if z >= EDGE else "
      "0.5 * (1.0 + math.erf(z * RSQRT2)))")
    a("        else:")
    a("            down = 1.0 if tm >= end else 0.0")
    a("        c += pulses[k, 2] * up * (1.0 - down)")
    a("    for k in range(r0, r1):")
    a("        s = t - transients[k, 0]")
    a("        if s >= 0.0 and t <= transients[k, 4]:")
    a("            shape = math.exp(-s / transients[k, 2])")
    a("            if transients[k, 3] > 0.0:")
    a("                shape -= math.exp(-s / transients[k, 3])")
    a("            c += transients[k, 1] * shape")
    a("    return c")
    a("")

    # ---- helpers to emit straight-line code
    def rates(ind: str, conc: str, agonist_only: bool) -> None:
        for m, t in enumerate(T):
            if t.agonist:
                a(f"{ind}k{m} = b{m} * {conc}")
            elif not agonist_only:
                a(f"{ind}k{m} = b{m}")
        touched = {t.source for t in T if t.agonist} if agonist_only else set(range(S))
        for i in sorted(touched):
            out = [f"k{m}" for m, t in enumerate(T) if t.source == i]
            a(f"{ind}q{i} = " + (" + ".join(out) if out else "F(0.0)"))

    def deriv(ind: str, src: str) -> None:
        for j in range(S):
            terms = [f"- q{j} * {src}{j}"]
            terms += [f"+ k{m} * {src}{t.source}" for m, t in enumerate(T) if t.target == j]
            a(f"{ind}f{j} = " + " ".join(terms).lstrip("+ ").replace("- q", "-q", 1))

    def rk4(ind: str, smooth: bool) -> None:
        if smooth:
            a(f"{ind}t = t0 + (rep * nsteps + it) * hd")
            a(f"{ind}cc = F(conc_at(t, tm, pulses, pa, pb, transients, ra, rb))")
            rates(ind, "cc", True)
        deriv(ind, "p")
        for j in range(S):
            a(f"{ind}s{j} = f{j}")
            a(f"{ind}y{j} = p{j} + hh * f{j}")
        if smooth:
            a(f"{ind}cc = F(conc_at(t + 0.5 * hd, tm, pulses, pa, pb, transients, ra, rb))")
            rates(ind, "cc", True)
        deriv(ind, "y")
        for j in range(S):
            a(f"{ind}s{j} += F(2.0) * f{j}")
            a(f"{ind}y{j} = p{j} + hh * f{j}")
        deriv(ind, "y")
        for j in range(S):
            a(f"{ind}s{j} += F(2.0) * f{j}")
            a(f"{ind}y{j} = p{j} + h * f{j}")
        if smooth:
            a(f"{ind}cc = F(conc_at(t + hd, tm, pulses, pa, pb, transients, ra, rb))")
            rates(ind, "cc", True)
        deriv(ind, "y")
        for j in range(S):
            if compensated:
                a(f"{ind}dl = h6 * (s{j} + f{j}) - e{j}")
                a(f"{ind}tp = p{j} + dl")
                a(f"{ind}e{j} = (tp - p{j}) - dl")
                a(f"{ind}p{j} = tp")
            else:
                a(f"{ind}p{j} = p{j} + h6 * (s{j} + f{j})")
            if flush_below > 0.0:
                a(f"{ind}if abs(p{j}) < {_c(flush_below)}:")
                a(f"{ind}    p{j} = F(0.0)")
                if compensated:
                    a(f"{ind}    e{j} = F(0.0)")

    def record(ind: str) -> None:
        g = " + ".join(f"{_c(scheme.conductance[i])} * p{i}" for i in range(S)
                       if scheme.conductance[i] != 0.0)
        a(f"{ind}g = float({g}) * drv")
        a(f"{ind}tot = float(" + " + ".join(f"p{i}" for i in range(S)) + ")")
        a(f"{ind}code = 0")
        a(f"{ind}if not (abs(tot) < 1e300 and abs(g) < 1e300):")
        a(f"{ind}    code = 1")
        lo = " or ".join(f"p{i} < -tol or p{i} > 1.0 + tol" for i in range(S))
        a(f"{ind}elif {lo}:")
        a(f"{ind}    code = 2")
        a(f"{ind}elif abs(tot - 1.0) > tol:")
        a(f"{ind}    code = 3")
        # Rounding makes a float32 state drift off Σp = 1 over millions of steps; checking and
        # then renormalising at every sample bounds the drift to one sample's steps.
        a(f"{ind}rn = F(1.0 / tot) if code == 0 else F(1.0)")
        for i in range(S):
            a(f"{ind}p{i} = p{i} * rn")
        a(f"{ind}gs = sample0 + smp")
        if mode == "objective":
            a(f"{ind}if code != 0:")
            a(f"{ind}    fail[w, c] = code")
            # every output is written by its thread: the host need not clear them first
            for k in range(N_OUT):
                a(f"{ind}    out[w, {k}, c] = 0.0")
            a(f"{ind}    return")
            a(f"{ind}d = data[gs]")
            a(f"{ind}wt = weight[gs]")
            a(f"{ind}sgg += wt * g * g")
            a(f"{ind}sgd += wt * g * d")
            for q in range(N_WINDOWS):
                a(f"{ind}if wo{q} >= 0 and smp >= wl{q} and smp <= wh{q}:")
                a(f"{ind}    if wo{q} == 0:")
                a(f"{ind}        if abs(g) > abs(wv{q}) or wi{q} < 0:")
                a(f"{ind}            wv{q} = g")
                a(f"{ind}            wi{q} = smp")
                a(f"{ind}    else:")
                a(f"{ind}        wv{q} += g")
        else:
            a(f"{ind}if code != 0:")
            a(f"{ind}    fail[w, c] = code")
            a(f"{ind}trace[c, gs] = g")
            if with_occupancy:
                for i in range(S):
                    a(f"{ind}occ[c, gs, {i}] = p{i}")
            a(f"{ind}if code != 0:")
            a(f"{ind}    return")

    # ---- the thread body
    if mode == "objective":
        a("@DEVICE")
        a("def run_thread(c, w, P, S0, rows_f, rows_i, row_start, pulses, pulse_start,")
        a("               transients, transient_start, drive, sample_start, tol,")
        a("               data, weight, win, out, fail):")
    else:
        a("@DEVICE")
        a("def run_thread(c, w, P, S0, rows_f, rows_i, row_start, pulses, pulse_start,")
        a("               transients, transient_start, drive, sample_start, tol,")
        a("               trace, occ, unused0, unused1, fail):")
    ind = "    "
    for m, t in enumerate(T):
        if t.factor == 1.0:
            a(f"{ind}b{m} = F(P[{t.param}, c])")
        else:
            a(f"{ind}b{m} = {_c(t.factor)} * F(P[{t.param}, c])")
    for i in range(S):
        a(f"{ind}p{i} = F(S0[{i}, c])")
        if compensated:
            a(f"{ind}e{i} = F(0.0)")
    a(f"{ind}drv = drive[w]")
    a(f"{ind}pa = pulse_start[w]")
    a(f"{ind}pb = pulse_start[w + 1]")
    a(f"{ind}ra = transient_start[w]")
    a(f"{ind}rb = transient_start[w + 1]")
    a(f"{ind}sample0 = sample_start[w]")
    if mode == "objective":
        a(f"{ind}sgg = 0.0")
        a(f"{ind}sgd = 0.0")
        for q in range(N_WINDOWS):
            a(f"{ind}wl{q} = win[w, {q}, 0]")
            a(f"{ind}wh{q} = win[w, {q}, 1]")
            a(f"{ind}wo{q} = win[w, {q}, 2]")
            a(f"{ind}wv{q} = 0.0")
            a(f"{ind}wi{q} = -1")
    a(f"{ind}smp = 0")
    record(ind)
    a(f"{ind}for r in range(row_start[w], row_start[w + 1]):")
    ind2 = ind + "    "
    a(f"{ind2}t0 = rows_f[r, 0]")
    a(f"{ind2}hd = rows_f[r, 1]")
    a(f"{ind2}tm = rows_f[r, 3]")
    a(f"{ind2}h = F(hd)")
    a(f"{ind2}hh = F(0.5) * h")
    a(f"{ind2}h6 = h / F(6.0)")
    a(f"{ind2}nsteps = rows_i[r, 0]")
    a(f"{ind2}nrep = rows_i[r, 1]")
    a(f"{ind2}rec = rows_i[r, 2]")
    a(f"{ind2}if rows_i[r, 3] == 0:")
    ind3 = ind2 + "    "
    a(f"{ind3}cc = F(rows_f[r, 2])")
    rates(ind3, "cc", False)
    a(f"{ind3}for rep in range(nrep):")
    a(f"{ind3}    for it in range(nsteps):")
    rk4(ind3 + "        ", smooth=False)
    a(f"{ind3}    if rec == 1:")
    a(f"{ind3}        smp += 1")
    record(ind3 + "        ")
    a(f"{ind2}else:")
    # Non-agonist rates are constant on smooth rows too.
    for m, t in enumerate(T):
        if not t.agonist:
            a(f"{ind3}k{m} = b{m}")
    # Exit rates of states with no agonist-dependent transition are constant here too.
    fixed_q = sorted({t.source for t in T} - {t.source for t in T if t.agonist})
    for i in fixed_q:
        out = [f"k{m}" for m, t in enumerate(T) if t.source == i]
        a(f"{ind3}q{i} = " + " + ".join(out))
    for i in sorted(set(range(S)) - {t.source for t in T}):
        a(f"{ind3}q{i} = F(0.0)")
    a(f"{ind3}for rep in range(nrep):")
    a(f"{ind3}    for it in range(nsteps):")
    rk4(ind3 + "        ", smooth=True)
    a(f"{ind3}    if rec == 1:")
    a(f"{ind3}        smp += 1")
    record(ind3 + "        ")
    if mode == "objective":
        a(f"{ind}fail[w, c] = 0")
        a(f"{ind}out[w, 0, c] = sgg")
        a(f"{ind}out[w, 1, c] = sgd")
        for q in range(N_WINDOWS):
            a(f"{ind}out[w, {2 + 2 * q}, c] = wv{q}")
            a(f"{ind}out[w, {3 + 2 * q}, c] = wi{q}")
    a("")
    source = "\n".join(L)
    key = hashlib.sha1(source.encode()).hexdigest()[:16]
    return GeneratedCode(source, key, S, len(T))
