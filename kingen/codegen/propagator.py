"""The propagator form: one vector–matrix product per sample on constant-concentration rows.

On a row of constant concentration c, dp/dt = p·Q(c) is linear with constant Q, so one RK4
step of size h is exactly p ← p·R(hQ) with R(A) = I + A + A²/2 + A³/6 + A⁴/24, and the n
steps between two samples are p ← p·M with M = R(hQ)ⁿ. This is an identity, not an
approximation: the propagator form gives the stage form's answer up to rounding, at one
S×S product per sample whatever n is.

Two functions are generated besides ``conc_at``:

- ``build_thread(c, k, i, P, keys_f, keys_i, keys_conc, conc, D)`` advances the unit
  vector eᵢ through the n RK4 steps of key k (``keys_f[k]`` = [h, c, own_courant, coarse_limit],
  ``keys_i[k]`` = n; an edge sample's key reads its stage concentrations from
  ``conc[keys_conc[k]]`` on and takes its candidate's own coarse steps, as the stage form
  does) for candidate c, in float64 whatever the precision, and stores row i
  of D = M − I in ``D[k, i, :, c]`` (on the CPU ``build_thread(c, slot, k, ...)`` steps
  all S rows of key k together and stores them in ``D[slot, k]``, the slot that holds c's
  matrices while its sweeps run). D rather
  than M because float32 keeps D's small entries to full relative precision, where
  1 − 10⁻⁶ on M's diagonal would lose most of its digits.
- ``run_thread`` walks a sweep's rows like the stage form; a row with ``row_key[r]`` ≥ 0
  takes p ← p + p·D once per repetition (an edge row the next key at each repetition), any
  other row takes the stage form's steps.

With ``lanes`` = L > 1 (GPU only) L consecutive threads share one (candidate, sweep) pair:
each holds ⌈S/L⌉ columns of D in registers, and the occupancies travel through a small
shared-memory buffer per pair (two halves, so that one warp barrier per sample suffices).
The sample's current and total probability are summed across the L lanes with warp
shuffles, and all lanes of a pair take every decision together.
"""

from __future__ import annotations

import math

from kingen.codegen.emit import N_WINDOWS, Emitter
from kingen.codegen.matrix_build import builders
from kingen.codegen.span import (
    SPAN_ARGS,
    SPAN_ARGS_FOLDED,
    emit_span_reduce,
    emit_span_row,
    emit_window_bounds,
    fold_order,
    span_check,
)
from kingen.codegen.span_cpu import emit_span_row_cpu
from kingen.codegen.stage import (
    MODE_ARGS,
    GeneratedCode,
    check_mode,
    finished,
    thread_start,
)
from kingen.model.scheme import Scheme

PROP_ARGS = ("c, w, lane, gmask, sh, base, P, S0, rows_f, rows_i, row_start, row_key,\n"
             "               conc, row_conc, drive, flt, sample_start, tol, D,")
# On the CPU one thread holds a pair whole, and its candidate's matrices are in D[slot]
PROP_ARGS_CPU = ("c, w, slot, P, S0, rows_f, rows_i, row_start, row_key,\n"
                 "               conc, row_conc, drive, flt, sample_start, tol, D,")


def padded_states(n_states: int, lanes: int) -> int:
    """Columns of D per key once padded to a multiple of ``lanes``."""
    return math.ceil(n_states / lanes) * lanes


def shared_stride(n_states: int, lanes: int, extra: int = 0) -> int:
    """Shared-memory words per pair: two buffers, plus one so that pairs of a warp start on
    different banks, plus ``extra`` (a span's currents, which a filter needs in order)."""
    return 2 * padded_states(n_states, lanes) + 1 + extra


def dot(terms: list[str], chains: int = 4) -> str:
    """A sum of products as ``chains`` independent partial sums, so that the multiply-adds
    of one sum need not wait on each other (a straight left-to-right sum is one dependent
    chain of S fused multiply-adds)."""
    groups = [terms[k::chains] for k in range(chains) if terms[k::chains]]
    return " + ".join("(" + " + ".join(g) + ")" for g in groups)


def _update(a: Emitter, ind: str, new: str, old: str, comp: str, terms: list[str]) -> None:
    """``new`` = ``old`` + Σ terms, compensated (Kahan) in float32."""
    if a.compensated:
        a.add_compensated(ind, new, old, comp, dot(terms, 2))
    else:
        # the old value starts one of the two chains: no separate add
        a(f"{ind}{new} = {dot([old] + terms, 2)}")


def row_end_check(a: Emitter, ind: str, tot: str, bad: str, mode: str,
                   writer: str | None) -> None:
    """Failure checks at the end of a propagated row.

    A sample costs a hundred-odd instructions here, so the range and conservation checks
    run once per row, not per sample: an unstable product grows without bound and stays
    caught, and a candidate that fails anywhere is failed whole.
    """
    a(f"{ind}g = 0.0")
    a(f"{ind}tot = float({tot})")
    a.checks(ind, bad)
    a(f"{ind}if code != 0:")
    if writer:
        a(f"{ind}    if {writer}:")
        a(f"{ind}        fail[w, c] = code")
    else:
        a(f"{ind}    fail[w, c] = code")
    if mode == "objective":
        for k in range(a.out_width()):
            a(f"{ind}    {'    ' if writer else ''}out[{k}, c, w] = 0.0")
    a(f"{ind}    return")


def flat_views(a: Emitter, ind: str, spans: bool) -> None:
    """One-dimensional views of the CPU's matrices (``Df``, with spans ``GVf`` and
    ``DVf``, and the span rows' scratch ``gw`` and ``pv``), taken once per thread body.

    Numba types and lowers an entry read as ``D[slot, kk, i, j]`` several times slower than
    ``Df[U(kb + i·S + j)]`` (the unsigned index needs no wraparound check), and a product
    reads S² of them. The loads are the same; ``python -m benchmarks compile_time`` measures
    what a scheme's kernels cost to compile.

    Examples
    --------
    >>> from kingen.model.scheme import Scheme
    >>> a = Emitter(Scheme.load("models/jonas_1993.toml"))
    >>> flat_views(a, "    ", spans=False)
    >>> a.lines
    ['    Df = D.reshape(D.size)']
    """
    a(f"{ind}Df = D.reshape(D.size)")
    if spans:
        a(f"{ind}GVf = GV.reshape(GV.size)")
        a(f"{ind}DVf = DV.reshape(DV.size)")
        # a span's currents and the state over a span row (kingen.codegen.span)
        a(f"{ind}gw = np.empty(GV.shape[3], {a.cast})")
        a(f"{ind}pv = np.empty({a.scheme.n_states}, {a.cast})")


def _sample_value(a: Emitter, ind: str, mode: str, writer: str | None) -> None:
    """Reduce or store the current ``g`` of a propagated sample (no checks: see
    :func:`row_end_check`)."""
    a(f"{ind}smp += 1")
    a(f"{ind}code = 0")
    a.store_sample(ind, mode, [], writer=writer, prefetched=True)
    a.prefetch(ind, mode, 1)


def _whole_state_sample(a: Emitter, ind: str, ind2: str, mode: str, with_occupancy: bool,
                        p: list[str]) -> None:
    """The sample after a product, when one thread holds the whole state ``p``, and the
    row's checks after the loop."""
    F = a.cast
    a(f"{ind2}if rec == 1:")
    ind3 = ind2 + "    "
    g = " + ".join(f"{a.const(a.scheme.conductance[i])} * {x}" for i, x in enumerate(p)
                   if a.scheme.conductance[i] != 0.0)
    a(f"{ind3}g = float({g}) * drv")
    if a.compensated:
        a(f"{ind3}rn = {F}(1.0) / (" + " + ".join(p) + ")")
        for x in p:
            a(f"{ind3}{x} = {x} * rn")
    if with_occupancy:
        a(f"{ind3}smp += 1")
        a(f"{ind3}code = 0")
        a.store_sample(ind3, mode, p)
    else:
        _sample_value(a, ind3, mode, None)
    row_end_check(a, ind, " + ".join(p), " | ".join(f"({x} < -tol) | ({x} > 1.0 + tol)"
                                                     for x in p), mode, None)


def _one_lane_row(a: Emitter, ind: str, mode: str, with_occupancy: bool,
                  target: str, per_sample: bool | str = False) -> None:
    """A propagated row when one thread holds the whole state.

    On the GPU the thread also holds D in registers (``d{i}_{j}``, loaded once per row). A
    CPU has too few registers for S² values: there each product reads D's row-contiguous
    block ``D[c, k]`` from the L1 cache, into the same straight-line sums (2.5x faster per
    sample than loops over arrays, which the compiler cannot keep in registers). It reads
    the flat view ``Df`` taken once per thread body (:func:`flat_views`), at the block's
    offset ``kb``: a view ``D[c, kk]`` per row would take a reference to D's one shared
    reference count per row, an atomic operation that every core's thread contends for.

    With ``per_sample`` (an edge row) repetition j takes key ``kk`` + j, read from memory
    at each product on either target. On the CPU ``per_sample`` may be a condition instead:
    the one loop then serves both kinds of row (half the code to compile), its key
    advancing only where the condition holds.
    """
    S, F = a.scheme.n_states, a.cast
    if isinstance(per_sample, str) and target != "cpu":
        raise ValueError("a per-sample condition is the CPU's")
    if target == "cpu":
        # the key's block of the flat D (see flat_views): one index per entry, from the
        # block's start unsigned, as numba then needs no wraparound check
        a(f"{ind}kb = (slot * D.shape[1] + kk) * {S * S}")

        def entry(i: int, j: int) -> str:
            return f"Df[U(kb + {i * S + j})]"
    elif per_sample:
        def entry(i: int, j: int) -> str:
            return f"{F}(D[ks, {i}, {j}, c])"
    else:
        for i in range(S):
            for j in range(S):
                a(f"{ind}d{i}_{j} = {F}(D[kk, {i}, {j}, c])")

        def entry(i: int, j: int) -> str:
            return f"d{i}_{j}"
    a.prefetch(ind, mode, 1)
    # the key of the next repetition: kk + 1 on the GPU, the next block of Df on the CPU
    if per_sample and target != "cpu":
        a(f"{ind}ks = kk")
    elif isinstance(per_sample, str):
        a(f"{ind}kstep = {S * S} if {per_sample} else 0")
    a(f"{ind}for rep in range(nrep):")
    ind2 = ind + "    "
    for j in range(S):
        _update(a, ind2, f"n{j}", f"p{j}", f"e{j}", [f"p{i} * {entry(i, j)}" for i in range(S)])
    for j in range(S):
        a(f"{ind2}p{j} = n{j}")
        a.flush(ind2, f"p{j}", f"e{j}" if a.compensated else None)
    if per_sample and target != "cpu":
        a(f"{ind2}ks += 1")
    elif per_sample:
        a(f"{ind2}kb += {'kstep' if isinstance(per_sample, str) else S * S}")
    _whole_state_sample(a, ind, ind2, mode, with_occupancy, [f"p{i}" for i in range(S)])


def _lanes_row(a: Emitter, ind: str, mode: str, lanes: int, per_sample: bool = False) -> None:
    """A propagated row shared by ``lanes`` threads, each holding C columns of D.

    The two halves of the pair's buffer alternate: the repetitions are unrolled by two so
    that each half is a fixed slice, read and written at constant offsets. With
    ``per_sample`` (an edge row) repetition j takes key ``kk`` + j, its columns loaded at
    each product; its samples are counted by every lane alike, as stage-form samples are.
    """
    S, F = a.scheme.n_states, a.cast
    C = padded_states(S, lanes) // lanes
    lanes_row_enter(a, ind, C, lanes)
    for k in range(C):
        a(f"{ind}o{k} = own0[{k}]")
        if a.compensated:
            a(f"{ind}oe{k} = {F}(0.0)")
        if not per_sample:
            for i in range(S):
                a(f"{ind}d{i}_{k} = {F}(D[kk, {i}, U(col + {k}), c])")
    a.prefetch(ind, mode, 1)
    if per_sample:
        a(f"{ind}ks = kk")

    def sample(ind2: str, src: str, dst: str) -> None:
        if per_sample:
            for k in range(C):
                for i in range(S):
                    a(f"{ind2}d{i}_{k} = {F}(D[ks, {i}, U(col + {k}), c])")
            a(f"{ind2}ks += 1")
        for i in range(S):
            a(f"{ind2}v{i} = {src}[{i}]")
        for k in range(C):
            _update(a, ind2, f"o{k}", f"o{k}", f"oe{k}", [f"v{i} * d{i}_{k}" for i in range(S)])
        a(f"{ind2}if rec == 1:")
        ind3 = ind2 + "    "
        a(f"{ind3}gp = " + " + ".join(f"gc{k} * o{k}" for k in range(C)))
        if a.compensated:
            a(f"{ind3}tq = " + " + ".join(f"o{k}" for k in range(C)))
        off = 1
        while off < lanes:
            a(f"{ind3}gp += SHFL_XOR(gmask, gp, {off})")
            if a.compensated:
                a(f"{ind3}tq += SHFL_XOR(gmask, tq, {off})")
            off *= 2
        a(f"{ind3}g = float(gp) * drv")
        if a.compensated:
            a(f"{ind3}rn = {F}(1.0) / tq")
            for k in range(C):
                a(f"{ind3}o{k} = o{k} * rn")
        _sample_value(a, ind3, mode, "lane == 0")
        for k in range(C):
            a(f"{ind2}{dst}[{k}] = o{k}")
        a(f"{ind2}WARP_SYNC(gmask)")

    alternating(a, ind, "nrep", sample)
    # the state is in half1 after an odd number of repetitions
    a(f"{ind}last = half1 if nrep % 2 == 1 else half0")
    # leave: check the row, then every lane takes the full state back into registers
    lanes_row_exit(a, ind, C, lanes, mode)


def lanes_row_enter(a: Emitter, ind: str, n_cols: int, lanes: int) -> None:
    """Enter a row shared by ``lanes`` threads: every lane holds the full state; publish it
    in buffer 0 once every lane of the pair is done reading the previous row's buffers, and
    name the pair's two halves and this lane's slice (``col``) of each."""
    SP = n_cols * lanes
    a(f"{ind}WARP_SYNC(gmask)")
    a(f"{ind}half0 = sh[U(base):U(base + {SP})]")
    a(f"{ind}half1 = sh[U(base + {SP}):U(base + {2 * SP})]")
    a(f"{ind}col = lane * {n_cols}")
    a(f"{ind}own0 = sh[U(base + col):U(base + col + {n_cols})]")
    a(f"{ind}own1 = sh[U(base + {SP} + col):U(base + {SP} + col + {n_cols})]")
    for j in range(a.scheme.n_states):
        a(f"{ind}half0[{j}] = p{j}")
    a(f"{ind}WARP_SYNC(gmask)")


def alternating(a: Emitter, ind: str, count: str, step) -> None:
    """``count`` repetitions of ``step(indent, source half, own slice of the other)``,
    unrolled by two so that each of the pair's two buffers is a fixed slice."""
    a(f"{ind}for rep in range({count} // 2):")
    step(ind + "    ", "half0", "own1")
    step(ind + "    ", "half1", "own0")
    a(f"{ind}if {count} % 2 == 1:")
    step(ind + "    ", "half0", "own1")


def lanes_row_exit(a: Emitter, ind: str, n_cols: int, lanes: int, mode: str) -> None:
    """Leave a row shared by ``lanes`` threads: check it (the lanes' column sums and range
    flags combined by shuffles), then every lane takes the full state back from ``last``."""
    S, F = a.scheme.n_states, a.cast
    a(f"{ind}tq = " + " + ".join(f"o{k}" for k in range(n_cols)))
    bad = " | ".join(f"(o{k} < -tol) | (o{k} > 1.0 + tol)" for k in range(n_cols))
    a(f"{ind}bad = 1 if ({bad}) else 0")
    off = 1
    while off < lanes:
        a(f"{ind}tq += SHFL_XOR(gmask, tq, {off})")
        a(f"{ind}bad |= SHFL_XOR(gmask, bad, {off})")
        off *= 2
    row_end_check(a, ind, "tq", "bad != 0", mode, "lane == 0")
    for j in range(S):
        a(f"{ind}p{j} = last[{j}]")
        if a.compensated:
            a(f"{ind}e{j} = {F}(0.0)")


def generate_propagator(scheme: Scheme, mode: str, *, lanes: int = 1,
                        with_occupancy: bool = False, compensated: bool = False,
                        flush_below: float = 0.0, d_flush: float = 1e-150,
                        stage_rows: str = "all", n_windows: int = N_WINDOWS,
                        target: str = "cuda", span: int = 1, n_sections: int = 0,
                        with_sum: bool = False, edge_rows: bool = False,
                        with_build: bool = True) -> GeneratedCode:
    """Python source of the propagator-form solver (``build_thread`` and ``run_thread``).

    Parameters
    ----------
    scheme
        The parsed scheme.
    mode
        ``"objective"`` or ``"traces"``.
    lanes
        Threads per (candidate, sweep) pair; more than 1 only on the GPU, and not with
        ``with_occupancy``.
    with_occupancy, compensated, flush_below
        As for :func:`kingen.codegen.generate`; with ``lanes`` = 1 Kahan compensation also
        covers the per-sample update p ← p + p·D.
    d_flush
        Entries of D below this magnitude are stored as zero.
    stage_rows
        Which rows without a key the code must handle in stage form (``all``, ``smooth``
        or ``none``, from :attr:`kingen.solve.plan.PropagatorPlan.stage_rows`): the stage
        form's code sets the register count of the whole kernel, so it is left out where no
        row needs it.
    n_windows
        Feature windows the batch uses (objective mode): code is emitted for these only.
    target
        ``cuda`` (D laid out (key, row, column, candidate) so that a warp's loads
        coalesce, and held in registers) or ``cpu`` (D laid out (candidate, key, row,
        column), read from the cache at each product).
    span
        Samples per product on propagated rows (not with ``with_occupancy``; on the GPU
        with lanes ≥ 2; see :mod:`kingen.codegen.span`): 1 is one product per sample.
    n_sections, with_sum
        The recording's filter and the extra sum, as for :func:`kingen.codegen.generate`.
        On the GPU spans fold a filter of up to four sections into their arrays, which are
        then indexed by (key, filter) entries (``row_fold``); a longer filter's span
        currents pass through it in order, shared by the lanes through the pair's shared
        memory (:mod:`kingen.codegen.span`).
    edge_rows
        Whether rows whose concentration varies take products too, one key per sample
        (:attr:`kingen.solve.plan.PropagatorPlan.edge_rows`): one product per sample,
        with lanes as without spans.
    with_build
        Include the matrices' builders (``build_thread``, and ``span_thread`` with spans);
        without them the code calls those of
        :func:`~kingen.codegen.matrix_build.generate_matrix_build`'s module, which
        kernels of one scheme share.

    Examples
    --------
    >>> from kingen.model.scheme import Scheme
    >>> s = Scheme.load("models/jonas_1993.toml")
    >>> code = generate_propagator(s, "objective")
    >>> "def build_thread(" in code.source and "p0 * d0_0" in code.source
    True
    >>> "p1 * Df[U(kb + 7)]" in generate_propagator(s, "objective", target="cpu").source
    True
    """
    check_mode(mode)
    if lanes < 1 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of two, got {lanes}")
    if lanes > 1 and with_occupancy:
        raise ValueError("occupancies are stored with lanes = 1 only")
    if lanes > 1 and target == "cpu":
        raise ValueError("lanes > 1 runs on the GPU only")
    if span != 1:
        span_check(scheme.n_states, lanes, span, target)
        if with_occupancy:
            raise ValueError("occupancies are stored with one product per sample (span 1)")
    a = Emitter(scheme, compensated=compensated, flush_below=flush_below, n_windows=n_windows,
                n_sections=n_sections, with_sum=with_sum)
    a.legend()
    fold = fold_order(n_sections, target) if span > 1 else 0
    if with_build:
        a.lines.extend(builders(scheme, target, d_flush, edge_rows, span, fold, lanes))
    a("@DEVICE")
    args = PROP_ARGS_CPU if target == "cpu" else PROP_ARGS
    span_args = "" if span == 1 else SPAN_ARGS_FOLDED if fold else SPAN_ARGS
    a(f"def run_thread({args}{span_args}")
    a(f"               {MODE_ARGS[mode]}):")
    # On the GPU the stage rows read their rates where they start: held through the whole
    # sweep, a 16-state scheme's 42 rates took registers that the span rows then spilled
    thread_start(a, mode, rates=target == "cpu")
    ind = "    "
    if target == "cpu":
        flat_views(a, ind, span > 1)
    if lanes > 1:
        C = padded_states(scheme.n_states, lanes) // lanes
        cond = list(scheme.conductance) + [0.0] * (C * lanes - scheme.n_states)
        a.lines.insert(0, f"GCOND = np.array({[float(x) for x in cond]!r})")
        for k in range(C):
            # conductance of this lane's k-th column (0 for padding)
            a(f"{ind}gc{k} = {a.cast}(GCOND[lane * {C} + {k}])")
        a(f"{ind}for j in range({scheme.n_states}, {2 * padded_states(scheme.n_states, lanes)}):")
        a(f"{ind}    sh[base + j] = {a.cast}(0.0)")
    if span > 1 and target == "cuda" and mode == "objective":
        emit_window_bounds(a, ind)
    a.record(ind, mode, with_occupancy=with_occupancy, first=True)
    a(f"{ind}for r in range(row_start[w], row_start[w + 1]):")
    ind2 = ind + "    "
    a.step_sizes(ind2)
    a(f"{ind2}kk = row_key[r]")
    if edge_rows and target == "cpu" and span == 1:
        # one product loop for edge and constant rows (see _one_lane_row)
        a(f"{ind2}if kk >= 0:")
        _one_lane_row(a, ind2 + "    ", mode, with_occupancy, target,
                      per_sample="rows_i[r, 3] != 0")
    else:
        if edge_rows:
            a(f"{ind2}if kk >= 0 and rows_i[r, 3] != 0:")
            if lanes == 1:
                _one_lane_row(a, ind2 + "    ", mode, with_occupancy, target, per_sample=True)
            else:
                _lanes_row(a, ind2 + "    ", mode, lanes, per_sample=True)
            a(f"{ind2}elif kk >= 0:")
        else:
            a(f"{ind2}if kk >= 0:")
        if span > 1 and target == "cpu":
            emit_span_row_cpu(a, ind2 + "    ", span, mode)
        elif span > 1:
            a(f"{ind2}    kf = {'row_fold[r]' if fold else 'kk'}")
            emit_span_row(a, ind2 + "    ", lanes, span,
                          padded_states(scheme.n_states, lanes) // lanes, mode,
                          stage_code=stage_rows != "none")
        elif lanes == 1:
            _one_lane_row(a, ind2 + "    ", mode, with_occupancy, target)
        else:
            _lanes_row(a, ind2 + "    ", mode, lanes)
    a(f"{ind2}else:")
    if target != "cpu" and stage_rows != "none":
        a.base_rates(ind2 + "    ")
    a.stage_rows(ind2 + "    ", mode, with_occupancy, stage_rows, merged=target == "cpu")
    if span > 1 and target == "cuda" and mode == "objective":
        emit_span_reduce(a, ind, lanes)
    a.finish(ind, mode, writer="lane == 0" if lanes > 1 else None)
    return finished(a)
