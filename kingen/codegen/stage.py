"""The stage form: classical RK4, four derivative evaluations per step, on every row.

The generated module defines ``run_thread`` (one (candidate, sweep) pair of a batch) and
``conc_at`` (the concentration waveform). Rates are recomputed once per schedule row on
constant-concentration rows, and at each stage time (only the agonist-dependent ones) on
smooth rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kingen.codegen.emit import N_WINDOWS, Emitter
from kingen.model.scheme import Scheme

THREAD_ARGS = ("c, w, P, S0, rows_f, rows_i, row_start, conc, row_conc, drive, flt,\n"
               "               sample_start, tol,")
MODE_ARGS = {"objective": "data, weight, win, out, fail",
             "traces": "trace, occ, unused0, unused1, fail"}


@dataclass(frozen=True)
class GeneratedCode:
    """Source of a generated solver module and a key identifying it."""

    source: str
    key: str
    n_states: int
    n_transitions: int


def check_mode(mode: str) -> None:
    """Reject a mode other than ``objective`` or ``traces``."""
    if mode not in ("objective", "traces"):
        raise ValueError(f"mode must be 'objective' or 'traces', got {mode!r}")


def finished(emitter: Emitter) -> GeneratedCode:
    """Package an emitter's source with its content key."""
    source = emitter.source() + "\n"
    key = hashlib.sha1(source.encode()).hexdigest()[:16]
    return GeneratedCode(source, key, emitter.scheme.n_states,
                         len(emitter.scheme.transitions))


def thread_start(a: Emitter, mode: str, rates: bool = True) -> None:
    """Rates without agonist (unless not ``rates``), initial occupancies and the sweep's
    values."""
    ind = "    "
    if rates:
        a.base_rates(ind)
    for i in range(a.scheme.n_states):
        a(f"{ind}p{i} = {a.cast}(S0[{i}, c])")
        if a.compensated:
            a(f"{ind}e{i} = {a.cast}(0.0)")
    a.sweep_state(ind, mode)


def generate(scheme: Scheme, mode: str, *, with_occupancy: bool = False,
             compensated: bool = False, flush_below: float = 0.0,
             n_windows: int = N_WINDOWS, n_sections: int = 0,
             with_sum: bool = False, merged: bool = False) -> GeneratedCode:
    """Python source of the stage-form RK4 thread body for ``scheme``.

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
        slower per core than on an AMD core until this flush. Flushing at 1e-100 (float64)
        keeps every product and square in the step and the objective normal, at an error
        far below the solver's tolerance. GPUs handle subnormals at full speed.
    n_windows
        Feature windows the objective mode reduces (the first ``n_windows`` of each
        sweep's four); its results hold :func:`~kingen.codegen.out_width` values per pair.
    n_sections
        Second-order sections of the recording's filter, applied to every sample's current
        before it is reduced or stored (``flt`` (n_sweeps, ≥ n_sections, 7) holds each
        sweep's; see :meth:`kingen.codegen.emit.Emitter.filter_sample`); 0: no filter.
    with_sum
        Objective mode: also reduce Σw·g (third value per pair), for fitted offsets.
    merged
        One loop for constant and smooth rows (the CPU's; see
        :meth:`~kingen.codegen.emit.Emitter.stage_rows`).

    Examples
    --------
    >>> from kingen.model.scheme import Scheme
    >>> s = Scheme.loads('''
    ... [model]
    ... name = "two-state"
    ... agonist = "glu"
    ... [states]
    ... C = {conductance = 0}
    ... O = {conductance = 10}
    ... [parameters]
    ... kon = {value = 1, unit = "mM^-1 ms^-1"}
    ... koff = {value = 1, unit = "1/ms"}
    ... [transitions]
    ... "C -> O" = "kon * glu"
    ... "O -> C" = "koff"
    ... ''')
    >>> code = generate(s, "traces")
    >>> print(code.source.splitlines()[1])
    #   p0 = occupancy of C (conductance 0 pS)
    """
    check_mode(mode)
    a = Emitter(scheme, compensated=compensated, flush_below=flush_below, n_windows=n_windows,
                n_sections=n_sections, with_sum=with_sum)
    a.legend()
    a("@DEVICE")
    a(f"def run_thread({THREAD_ARGS}")
    a(f"               {MODE_ARGS[mode]}):")
    thread_start(a, mode)
    ind = "    "
    a.record(ind, mode, with_occupancy=with_occupancy, first=True)
    a(f"{ind}for r in range(row_start[w], row_start[w + 1]):")
    a.step_sizes(ind + "    ")
    a.stage_rows(ind + "    ", mode, with_occupancy, merged=merged)
    a.finish(ind, mode)
    return finished(a)
