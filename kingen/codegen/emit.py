"""Small emitters of straight-line solver code, shared by the stage and propagator forms.

Every state is a scalar local ``p{i}`` and every rate a scalar local ``k{m}``, so a GPU thread
keeps them in registers; the legend at the top of each generated module says which state and
which transition each name is. Constants are wrapped in the module's working-precision cast
(``F``, or ``F64`` in code that must run in float64 whatever the precision).
"""

from __future__ import annotations

from kingen.model.scheme import Scheme

N_WINDOWS = 4
N_OUT = 2 + 2 * N_WINDOWS


def out_width(n_windows: int = N_WINDOWS, sums: int = 2) -> int:
    """Values an objective-mode kernel writes per (candidate, sweep) pair: Σw·g², Σw·g·d
    (and Σw·g when ``sums`` is 3, for fitted offsets), then a value and a sample index per
    window it carries.

    Examples
    --------
    >>> out_width(0), out_width(), out_width(0, sums=3)
    (2, 10, 3)
    """
    return sums + 2 * n_windows

# Filters of up to this many second-order sections keep their coefficients in registers;
# longer ones (measured responses) read them from memory at every sample.
SECTIONS_IN_REGISTERS = 4

FAIL_OK, FAIL_NONFINITE, FAIL_RANGE, FAIL_CONSERVATION, FAIL_PARAMS = 0, 1, 2, 3, 4
FAILURE_NAMES = {
    FAIL_OK: "ok",
    FAIL_NONFINITE: "non-finite state",
    FAIL_RANGE: "probability outside [0, 1]",
    FAIL_CONSERVATION: "total probability not conserved",
    FAIL_PARAMS: "invalid parameters (non-finite or not > 0)",
}


class Emitter:
    """Accumulates the lines of one generated module.

    Parameters
    ----------
    scheme
        The scheme whose states, transitions and conductances are baked into the code.
    cast
        Name of the working-precision cast in the emitted code.
    compensated
        Add each RK4 step's increment with Kahan compensation (float32 needs it).
    flush_below
        Set occupancies below this magnitude to zero after each step (0: never); the CPU
        backend needs it, see :func:`kingen.codegen.generate`.
    n_sections
        Second-order sections of the recording's filter that every sample's current passes
        through before it is reduced or stored (0: none; see :meth:`filter_sample`).
    with_sum
        Also reduce Σw·g (objective mode), which fitted offsets need.
    """

    def __init__(self, scheme: Scheme, *, cast: str = "F", compensated: bool = False,
                 flush_below: float = 0.0, n_windows: int = N_WINDOWS, n_sections: int = 0,
                 with_sum: bool = False) -> None:
        self.scheme = scheme
        self.n_windows = n_windows
        self.n_sections = n_sections
        self.n_sums = 3 if with_sum else 2
        self.cast = cast
        self.compensated = compensated
        self.flush_below = flush_below
        self.lines: list[str] = []

    # ------------------------------------------------------------------ basics
    def __call__(self, text: str) -> None:
        self.lines.append(text)

    def out_width(self) -> int:
        """Values per pair the objective mode writes (:func:`out_width`)."""
        return out_width(self.n_windows, self.n_sums)

    def const(self, x: float) -> str:
        """A literal in the working precision."""
        return f"{self.cast}({float(x)!r})"

    def source(self) -> str:
        """The module text so far."""
        return "\n".join(self.lines)

    def legend(self) -> None:
        """Comment lines naming what every generated variable holds."""
        s = self.scheme
        self(f"# kingen solver code for {s.name!r}: {s.n_states} states, "
             f"{len(s.transitions)} transitions")
        for i, name in enumerate(s.states):
            self(f"#   p{i} = occupancy of {name} (conductance {s.conductance[i]:g} pS)")
        for m, t in enumerate(s.transitions):
            what = f"{t.factor:g} * {s.param_names[t.param]}" + (" * agonist" if t.agonist
                                                                 else "")
            self(f"#   k{m} = rate {s.states[t.source]} -> {s.states[t.target]} "
                 f"= {what}  (b{m} without the agonist)")
        self("#   q{i} = total exit rate of state i")
        if self.n_sections:
            self(f"#   fz{{q}}_0, fz{{q}}_1 = state of section q of the recording's filter "
                 f"({self.n_sections} sections; fc{{q}}_0..4 = its b0, b1, b2, a1, a2 from "
                 "flt[w, q])")
        self(f"# failure codes: {', '.join(f'{k} {v}' for k, v in FAILURE_NAMES.items())}")
        self("")

    # ------------------------------------------------------------------ rates and RK4
    def base_rates(self, ind: str) -> None:
        """``b{m}``: each transition's rate without the agonist, from the parameter table."""
        for m, t in enumerate(self.scheme.transitions):
            if t.factor == 1.0:
                self(f"{ind}b{m} = {self.cast}(P[{t.param}, c])")
            else:
                self(f"{ind}b{m} = {self.const(t.factor)} * {self.cast}(P[{t.param}, c])")

    def rates(self, ind: str, conc: str, agonist_only: bool) -> None:
        """``k{m}`` at concentration ``conc`` and the exit rates ``q{i}`` they change."""
        T = self.scheme.transitions
        for m, t in enumerate(T):
            if t.agonist:
                self(f"{ind}k{m} = b{m} * {conc}")
            elif not agonist_only:
                self(f"{ind}k{m} = b{m}")
        touched = ({t.source for t in T if t.agonist} if agonist_only
                   else set(range(self.scheme.n_states)))
        for i in sorted(touched):
            out = [f"k{m}" for m, t in enumerate(T) if t.source == i]
            self(f"{ind}q{i} = " + (" + ".join(out) if out else f"{self.cast}(0.0)"))

    def constant_rates_of_smooth_rows(self, ind: str) -> None:
        """Rates that stay constant on rows whose concentration varies."""
        T = self.scheme.transitions
        for m, t in enumerate(T):
            if not t.agonist:
                self(f"{ind}k{m} = b{m}")
        fixed_q = sorted({t.source for t in T} - {t.source for t in T if t.agonist})
        for i in fixed_q:
            out = [f"k{m}" for m, t in enumerate(T) if t.source == i]
            self(f"{ind}q{i} = " + " + ".join(out))
        for i in sorted(set(range(self.scheme.n_states)) - {t.source for t in T}):
            self(f"{ind}q{i} = {self.cast}(0.0)")

    def deriv(self, ind: str, src: str) -> None:
        """``f{j}`` = (src·Q)_j, the time derivative at occupancies ``src{i}``."""
        T = self.scheme.transitions
        for j in range(self.scheme.n_states):
            terms = [f"- q{j} * {src}{j}"]
            terms += [f"+ k{m} * {src}{t.source}" for m, t in enumerate(T) if t.target == j]
            self(f"{ind}f{j} = " + " ".join(terms).lstrip("+ ").replace("- q", "-q", 1))

    def rk4_step(self, ind: str, smooth: bool, when: str | None = None,
                 stage_conc: list[str] | None = None) -> None:
        """One classical RK4 step of size ``h`` (``hh`` = h/2, ``h6`` = h/6) on ``p{i}``;
        with ``smooth`` its concentrations are ``conc[ci0]``, ``conc[ci1]`` and
        ``conc[ci2]`` (:meth:`coarse_step`), or the three names in ``stage_conc``, read
        already, and with ``when`` too only where that condition holds (else the rates stay
        as they are)."""
        a, S, F = self, self.scheme.n_states, self.cast

        def at_stage(k: int) -> None:
            if not smooth:
                return
            sub = ind
            if when:
                a(f"{ind}if {when}:")
                sub = ind + "    "
            # the concentrations at the step's three stage times, computed once on the host
            # for every candidate (kingen.solve.schedule.stage_concentrations)
            a(f"{sub}cc = {stage_conc[k]}" if stage_conc else f"{sub}cc = {F}(conc[ci{k}])")
            self.rates(sub, "cc", True)

        at_stage(0)
        self.deriv(ind, "p")
        for j in range(S):
            a(f"{ind}s{j} = f{j}")
            a(f"{ind}y{j} = p{j} + hh * f{j}")
        at_stage(1)
        self.deriv(ind, "y")
        for j in range(S):
            a(f"{ind}s{j} += {F}(2.0) * f{j}")
            a(f"{ind}y{j} = p{j} + hh * f{j}")
        self.deriv(ind, "y")
        for j in range(S):
            a(f"{ind}s{j} += {F}(2.0) * f{j}")
            a(f"{ind}y{j} = p{j} + h * f{j}")
        at_stage(2)
        self.deriv(ind, "y")
        for j in range(S):
            if self.compensated:
                self.add_compensated(ind, f"p{j}", f"p{j}", f"e{j}", f"h6 * (s{j} + f{j})")
            else:
                a(f"{ind}p{j} = p{j} + h6 * (s{j} + f{j})")
            self.flush(ind, f"p{j}", f"e{j}" if self.compensated else None)

    def own_steps(self, ind: str, cmax: str, own: str, hd: str, nsteps: str,
                  limit: str) -> None:
        """``per``: how many of a smooth row's (or edge key's) ``nsteps`` steps of ``hd``
        this candidate takes as one: ⌊own / (hd·ρ)⌋, at least 1 and at most ``nsteps``, ρ
        the Gershgorin bound (twice the largest exit rate) of its own rates at the
        concentration ``cmax``, and at most ``limit`` (which keeps the concentration's own
        change within a step small); 1 where ``own`` is 0
        (:mod:`kingen.solve.schedule`; its ``coarse_steps`` counts the same on the host). The
        rates are read from ``P`` in float64 whatever the precision, so that every form
        and precision of the solver takes the same steps."""
        a, T = self, self.scheme.transitions
        a(f"{ind}per = 1")
        a(f"{ind}if {own} > 0.0:")
        sub = ind + "    "
        a(f"{sub}cmx = F64({cmax})")
        a(f"{sub}rho = F64(0.0)")
        for i in sorted({t.source for t in T}):
            terms = []
            for t in T:
                if t.source != i:
                    continue
                rate = f"F64(P[{t.param}, c])"
                if t.factor != 1.0:
                    rate = f"F64({float(t.factor)!r}) * {rate}"
                terms.append(f"cmx * {rate}" if t.agonist else rate)
            a(f"{sub}ex = " + " + ".join(terms))
            a(f"{sub}if ex > rho:")
            a(f"{sub}    rho = ex")
        a(f"{sub}rho = F64(2.0) * rho * {hd}")
        # no division where ρ is 0 (a row whose every rate is 0), which Numba's CPU target
        # raises on; a NaN ρ keeps one step
        a(f"{sub}if rho * {nsteps} <= {own}:")
        a(f"{sub}    per = {nsteps}")
        a(f"{sub}elif F64(2.0) * rho <= {own}:")
        a(f"{sub}    per = int({own} / rho)")
        a(f"{sub}lim = int({limit})")
        a(f"{sub}if per > lim:")
        a(f"{sub}    per = lim")

    def coarse_step(self, ind: str, nsteps: str, first: str, hd: str,
                    when: str | None = None) -> str:
        """Open the loop over a candidate's coarse steps of ``per`` fine steps (the last
        one shorter where they do not divide ``nsteps``): each sets ``h``, ``hh``, ``h6``
        and, where ``when`` holds, the ``conc`` entries ``ci0``, ``ci1``, ``ci2`` of its
        stages (:func:`kingen.solve.schedule.coarse_stage_entries`; the smooth row's entries
        start at ``first``). Returns the body's indent; the body ends with
        ``fine += cstep``. With ``per`` = 1 each step is the schedule's own, bit for bit."""
        a, F = self, self.cast
        a(f"{ind}fine = 0")
        a(f"{ind}while fine < {nsteps}:")
        body = ind + "    "
        a(f"{body}cstep = {nsteps} - fine")
        a(f"{body}if cstep > per:")
        a(f"{body}    cstep = per")
        sub = body
        if when:
            a(f"{body}if {when}:")
            sub = body + "    "
        a(f"{sub}ci0 = {first} + 3 * fine")
        a(f"{sub}ci1 = ci0 + 3 * (cstep // 2) + cstep % 2")
        a(f"{sub}ci2 = ci0 + 3 * cstep - 1")
        a(f"{body}h = {F}(cstep * {hd})")
        a(f"{body}hh = {F}(0.5) * h")
        a(f"{body}h6 = h / {F}(6.0)")
        return body

    def add_compensated(self, ind: str, target: str, base: str, comp: str,
                        increment: str) -> None:
        """``target`` = ``base`` + ``increment``, Kahan-compensated by ``comp``."""
        self(f"{ind}dl = {increment} - {comp}")
        self(f"{ind}tp = {base} + dl")
        self(f"{ind}{comp} = (tp - {base}) - dl")
        self(f"{ind}{target} = tp")

    def flush(self, ind: str, var: str, comp: str | None = None) -> None:
        """Zero ``var`` (and its compensation term) when it is below ``flush_below``."""
        if self.flush_below > 0.0:
            self(f"{ind}if abs({var}) < {self.const(self.flush_below)}:")
            self(f"{ind}    {var} = {self.cast}(0.0)")
            if comp:
                self(f"{ind}    {comp} = {self.cast}(0.0)")

    def step_sizes(self, ind: str) -> None:
        """``h``, ``hh`` and ``h6`` of schedule row ``r`` (and its raw fields)."""
        a, F = self, self.cast
        a(f"{ind}hd = rows_f[r, 1]")
        a(f"{ind}h = {F}(hd)")
        a(f"{ind}hh = {F}(0.5) * h")
        a(f"{ind}h6 = h / {F}(6.0)")
        a(f"{ind}nsteps = rows_i[r, 0]")
        a(f"{ind}nrep = rows_i[r, 1]")
        a(f"{ind}rec = rows_i[r, 2]")

    # ------------------------------------------------------------------ samples
    def sweep_state(self, ind: str, mode: str) -> None:
        """The per-sweep values every thread body starts with."""
        a = self
        a(f"{ind}drv = drive[w]")
        a(f"{ind}sample0 = sample_start[w]")
        for q in range(self.n_sections):
            if self.n_sections <= SECTIONS_IN_REGISTERS:
                for k in range(5):
                    a(f"{ind}fc{q}_{k} = flt[w, {q}, {k}]")
            a(f"{ind}fz{q}_0 = 0.0")
            a(f"{ind}fz{q}_1 = 0.0")
        if mode == "objective":
            a(f"{ind}sgg = 0.0")
            a(f"{ind}sgd = 0.0")
            if self.n_sums == 3:
                a(f"{ind}sg = 0.0")
            for q in range(self.n_windows):
                a(f"{ind}wl{q} = win[w, {q}, 0]")
                a(f"{ind}wh{q} = win[w, {q}, 1]")
                a(f"{ind}wo{q} = win[w, {q}, 2]")
                a(f"{ind}wv{q} = 0.0")
                a(f"{ind}wi{q} = -1")
        a(f"{ind}smp = 0")

    def checks(self, ind: str, bad_range: str) -> None:
        """``code`` from the current ``g``, ``tot`` and a range condition."""
        a = self
        a(f"{ind}code = {FAIL_OK}")
        a(f"{ind}if not (abs(tot) < 1e300 and abs(g) < 1e300):")
        a(f"{ind}    code = {FAIL_NONFINITE}")
        a(f"{ind}elif {bad_range}:")
        a(f"{ind}    code = {FAIL_RANGE}")
        a(f"{ind}elif abs(tot - 1.0) > tol:")
        a(f"{ind}    code = {FAIL_CONSERVATION}")

    def filter_sample(self, ind: str, first: bool = False) -> None:
        """Pass the sample's current ``g`` through the recording's filter, in float64:
        ``n_sections`` second-order sections in transposed direct form II, as
        ``scipy.signal.sosfilt`` runs them (``flt[w, q]`` = b0, b1, b2, a1, a2, then the
        steady state per unit input that :func:`scipy.signal.sosfilt_zi` gives).

        The ``first`` sample of a sweep starts the filter at its steady state for that
        sample's current: the recording began long before the sweep, at rest.
        """
        if not self.n_sections:
            return
        a = self
        if first:
            for q in range(self.n_sections):
                a(f"{ind}fz{q}_0 = flt[w, {q}, 5] * g")
                a(f"{ind}fz{q}_1 = flt[w, {q}, 6] * g")

        def c(q: int, k: int) -> str:
            return (f"fc{q}_{k}" if self.n_sections <= SECTIONS_IN_REGISTERS
                    else f"flt[w, {q}, {k}]")

        for q in range(self.n_sections):
            a(f"{ind}fy = {c(q, 0)} * g + fz{q}_0")
            a(f"{ind}fz{q}_0 = {c(q, 1)} * g - {c(q, 3)} * fy + fz{q}_1")
            a(f"{ind}fz{q}_1 = {c(q, 2)} * g - {c(q, 4)} * fy")
            a(f"{ind}g = fy")

    def record(self, ind: str, mode: str, *, with_occupancy: bool = False,
               renormalise: bool = True, prefetched: bool = False,
               first: bool = False) -> None:
        """Check the full state ``p{i}``, then store or reduce one sample of it."""
        a, S = self, self.scheme.n_states
        g = " + ".join(f"{self.const(self.scheme.conductance[i])} * p{i}" for i in range(S)
                       if self.scheme.conductance[i] != 0.0)
        a(f"{ind}g = float({g}) * drv")
        a(f"{ind}tot = float(" + " + ".join(f"p{i}" for i in range(S)) + ")")
        self.checks(ind, " | ".join(f"(p{i} < -tol) | (p{i} > 1.0 + tol)" for i in range(S)))
        if renormalise:
            # Rounding makes a float32 state drift off Σp = 1 over millions of steps;
            # checking and then renormalising at every sample bounds the drift to one
            # sample's steps.
            a(f"{ind}rn = {self.cast}(1.0 / tot) if code == 0 else {self.cast}(1.0)")
            for i in range(S):
                a(f"{ind}p{i} = p{i} * rn")
        occupancy = [f"p{i}" for i in range(S)] if with_occupancy else []
        self.store_sample(ind, mode, occupancy, prefetched=prefetched, first=first)

    def store_sample(self, ind: str, mode: str, occupancy: list[str],
                     writer: str | None = None, prefetched: bool = False,
                     first: bool = False) -> None:
        """Filter, then reduce (objective) or store (traces) the sample ``g`` with failure
        ``code``.

        ``writer`` is a condition naming the one thread that writes when several threads
        hold the same sample (lanes of the propagator form: each filters alike). With
        ``prefetched`` the sample's data and weight are already in ``dn`` and ``wn`` (see
        :meth:`prefetch`); ``first`` is the sweep's first sample (:meth:`filter_sample`).
        """
        a = self
        a(f"{ind}gs = sample0 + smp")
        self.filter_sample(ind, first)
        w_ind = ind + "    " if writer else ind
        if mode == "objective":
            a(f"{ind}if code != 0:")
            if writer:
                a(f"{ind}    if {writer}:")
            a(f"{w_ind}    fail[w, c] = code")
            # every output is written by its thread: the host need not clear them first
            for k in range(self.out_width()):
                a(f"{w_ind}    out[{k}, c, w] = 0.0")
            a(f"{ind}    return")
            if prefetched:
                a(f"{ind}d = dn")
                a(f"{ind}wt = wn")
            else:
                a(f"{ind}d = data[gs]")
                a(f"{ind}wt = weight[gs]")
            a(f"{ind}sgg += wt * g * g")
            a(f"{ind}sgd += wt * g * d")
            if self.n_sums == 3:
                a(f"{ind}sg += wt * g")
            for q in range(self.n_windows):
                a(f"{ind}if wo{q} >= 0 and smp >= wl{q} and smp <= wh{q}:")
                a(f"{ind}    if wo{q} == 0:")
                a(f"{ind}        if abs(g) > abs(wv{q}) or wi{q} < 0:")
                a(f"{ind}            wv{q} = g")
                a(f"{ind}            wi{q} = smp")
                a(f"{ind}    else:")
                a(f"{ind}        wv{q} += g")
        else:
            if writer:
                a(f"{ind}if {writer}:")
            a(f"{w_ind}if code != 0:")
            a(f"{w_ind}    fail[w, c] = code")
            a(f"{w_ind}trace[c, gs] = g")
            for i, var in enumerate(occupancy):
                a(f"{w_ind}occ[c, gs, {i}] = {var}")
            a(f"{ind}if code != 0:")
            a(f"{ind}    return")

    def prefetch(self, ind: str, mode: str, ahead: int, *, at: str = "smp",
                 into: tuple[str, str] = ("dn", "wn"), clamp: bool = True) -> None:
        """Load the data and weight of sweep sample ``at`` + ``ahead`` into ``into``
        (``dn``, ``wn``).

        A propagated sample is a hundred or so instructions, too few to hide a load from
        device memory; issuing the next sample's loads one sample early hides it. With
        ``clamp`` the index stays inside the data; without, the data must extend past it.
        """
        if mode != "objective":
            return
        self(f"{ind}gn = sample0 + {at} + {ahead}")
        if clamp:
            self(f"{ind}if gn >= data.shape[0]:")
            self(f"{ind}    gn = data.shape[0] - 1")
        # an unsigned index spares Numba's negative-index wraparound on every sample
        self(f"{ind}{into[0]} = data[U(gn)]")
        self(f"{ind}{into[1]} = weight[U(gn)]")

    def finish(self, ind: str, mode: str, writer: str | None = None) -> None:
        """Write a sweep's reduced outputs and its success code."""
        if mode != "objective":
            return
        if writer:
            self(f"{ind}if {writer}:")
            ind += "    "
        self(f"{ind}fail[w, c] = 0")
        # out is (value, candidate, sweep): each value is one (N, n_sweeps) slab that the
        # host takes as it is, and only the windows the batch uses travel at all
        self(f"{ind}out[0, c, w] = sgg")
        self(f"{ind}out[1, c, w] = sgd")
        if self.n_sums == 3:
            self(f"{ind}out[2, c, w] = sg")
        for q in range(self.n_windows):
            self(f"{ind}out[{self.n_sums + 2 * q}, c, w] = wv{q}")
            self(f"{ind}out[{self.n_sums + 1 + 2 * q}, c, w] = wi{q}")

    # ------------------------------------------------------------------ stage rows
    def stage_rows(self, ind: str, mode: str, with_occupancy: bool,
                   kinds: str = "all", merged: bool = False) -> None:
        """The body of a schedule row in stage form: constant or smooth concentration.

        Expects the row's fields (:meth:`step_sizes`) to be set. ``kinds`` = ``smooth``
        emits only the smooth rows' code, ``none`` no code at all (the caller knows that no
        such row reaches it). With ``merged`` both kinds of row run one loop, which reads
        the concentrations at each stage on smooth rows only: half the code of a loop per
        kind for the same arithmetic, which the CPU compiles in half the time (Numba's
        compile time grows with the code's operations, and the branch costs a core
        nothing; a GPU kernel keeps a loop per kind, whose registers it was tuned with).
        """
        a = self
        ind3 = ind + "    "
        if kinds == "none":
            a(f"{ind}pass")
            return
        if kinds == "smooth":
            self.constant_rates_of_smooth_rows(ind)
            self._own_steps_of_row(ind)
            self._stage_loop(ind, True, mode, with_occupancy)
            return
        if merged:
            a(f"{ind}sm = rows_i[r, 3] != 0")
            a(f"{ind}if sm:")
            self.constant_rates_of_smooth_rows(ind3)
            self._own_steps_of_row(ind3)
            a(f"{ind}else:")
            a(f"{ind3}cc = {self.cast}(rows_f[r, 2])")
            self.rates(ind3, "cc", False)
            a(f"{ind3}per = 1")
            self._stage_loop(ind, True, mode, with_occupancy, when="sm")
            return
        a(f"{ind}if rows_i[r, 3] == 0:")
        a(f"{ind3}cc = {self.cast}(rows_f[r, 2])")
        self.rates(ind3, "cc", False)
        self._stage_loop(ind3, False, mode, with_occupancy)
        a(f"{ind}else:")
        self.constant_rates_of_smooth_rows(ind3)
        self._own_steps_of_row(ind3)
        self._stage_loop(ind3, True, mode, with_occupancy)

    def _own_steps_of_row(self, ind: str) -> None:
        """``per`` of smooth row ``r`` (:meth:`own_steps`)."""
        self.own_steps(ind, "rows_f[r, 2]", "rows_f[r, 4]", "hd", "nsteps", "rows_f[r, 5]")

    def _stage_loop(self, ind: str, smooth: bool, mode: str, with_occupancy: bool,
                    when: str | None = None) -> None:
        self(f"{ind}for rep in range(nrep):")
        if smooth:
            body = self.coarse_step(ind + "    ", "nsteps", "row_conc[r] + 3 * rep * nsteps",
                                    "hd", when)
            self.rk4_step(body, smooth=True, when=when)
            self(f"{body}fine += cstep")
        else:
            self(f"{ind}    for it in range(nsteps):")
            self.rk4_step(ind + "        ", smooth=False)
        self(f"{ind}    if rec == 1:")
        self(f"{ind}        smp += 1")
        self.record(ind + "        ", mode, with_occupancy=with_occupancy)
