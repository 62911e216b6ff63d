"""Sample spans: B samples of a propagated row from one product.

On a propagated row the state after j more products is p·Mʲ, and the only thing the objective
needs of each sample is its current, p·Mʲ·g (g the conductances). So for a span of B samples
that starts at state p, the currents are B dot products with the precomputed columns
Gⱼ = Mʲ·g (j = 1 … B), and the state moves on by one product with M^B. A sample then costs
2S + 2S²/B flops instead of the 2S² of one product per sample (S states): for a 16-state
scheme and B = 16, 64 instead of 512. The arithmetic is the same map, regrouped: the
results equal the one-product-per-sample form up to rounding.

Two arrays per (key, candidate), built from D = M − I after the build kernel
(:mod:`kingen.codegen.span_build`):

- ``GV[k, i, j, c]`` = (Mʲ⁺¹·g)ᵢ, the current of the sample j + 1 products on per unit of
  occupancy of state i;
- ``DV[k, i, :, c]`` = row i of M^B − I (D's layout, so that float32 keeps its small
  entries).

With L lanes per (candidate, sweep) pair each lane computes B/L of a span's currents (and
adds them to its own sums and windows) and C = S/L columns of the next state: the per-sample
bookkeeping is shared out instead of repeated on every lane. A row's last nrep mod B samples
take their currents from GV too, and the state crosses them by single products with D, read
from memory (a few samples per row).

A trace stores the same dot products' currents, each lane its own J of a span (occupancies,
which need every sample's state, take one product per sample instead).

**The recording filter, folded into the span (GPU).** The filter's cascade of second-order
sections in transposed direct form II is a linear state-space system of order
N = 2 × sections, in the very coordinates of the kernel's ``fz{q}_0``, ``fz{q}_1``:
z' = A·z + B·u, y = C·z + D·u (:func:`filter_state_space`). For a span that starts at state
p and filter state z, with inputs uₛ = drv·p·Gₛ (s = 1 … B):

- sample t's filtered current is yₜ = (C·Aᵗ⁻¹)·z + drv·p·G̃ₜ, with
  G̃ₜ = Σₛ₌₁..ₜ hₜ₋ₛ·Gₛ and h₀ = D, hₖ = C·Aᵏ⁻¹·B (the impulse response);
- the filter's state after the span is A^B·z + drv·W·p, with W = Σₛ (A^(B−s)·B)·Gₛᵀ.

So with a filter ``GV`` holds G̃ in place of G (built from G by a short convolution in
``build_span``), ``WV[f, n, i, c]`` holds W, and C·Aᵗ⁻¹ and A^B are per-sweep constants
(``FC``, :func:`fold_constants`). A lane's J = B/L currents cost J·(S + N) multiply-adds
instead of J·S, and the lanes share out the N components of the next filter state
(⌈N/L⌉ each, S + N multiply-adds per component), which they exchange through the pair's
shared memory at the span's barrier (a lane with one component holds its constants in
registers; with fewer lanes, which hold more columns of M^B each, they are read from the
cache at every span). Robert & Howe (S = 16) with an 8-pole filter (N = 8)
on 8 lanes, B = 16: 104 multiply-adds per lane per span, against 64 without a filter and
384 with the serial pass below (its 16 samples × 4 sections, one long dependent chain on
every lane). Those constants leave the span loop too few registers on the GPU, so with a
folded filter a span's dot products are summed interleaved over the state (each p_i read
once and used by every sum), which holds fewer values at a time. The filter state stays
in the sections' coordinates, so stage-form and edge
rows, which run the sections one sample at a time
(:meth:`kingen.codegen.emit.Emitter.filter_sample`), alternate with span rows within a
sweep; so do a row's last nrep mod B samples, which take single products and pass their
currents through the sections on every lane alike.

A constant key can serve sweeps with different filters (two protocols of one batch), and
G̃ and W depend on the filter: the span arrays are indexed by fold entries, one per
(key, filter) pair that some row uses (``row_fold[r]``, :func:`fold_keys`), not by key.
Filters of more than :data:`~kingen.codegen.emit.SECTIONS_IN_REGISTERS` sections (long
measured responses) keep the serial pass: each lane puts its J currents in the pair's
buffer and every lane runs all B of them through the sections. The CPU backend always runs
the sections serially: one thread holds the whole pair there (its span rows are
:mod:`kingen.codegen.span_cpu`).
"""

from __future__ import annotations

import math

import numpy as np

from kingen.codegen.emit import SECTIONS_IN_REGISTERS, Emitter

SPAN_ARGS = " GV, DV,"
# with a folded filter: its arrays and each row's fold entry (see the module's docstring)
SPAN_ARGS_FOLDED = " GV, DV, WV, FC, row_fold,"


def fold_order(n_sections: int, target: str = "cuda") -> int:
    """The filter state's order N when spans fold the filter in (0: they do not).

    >>> fold_order(4), fold_order(0), fold_order(5), fold_order(4, "cpu")
    (8, 0, 0, 0)
    """
    if target != "cuda" or not 0 < n_sections <= SECTIONS_IN_REGISTERS:
        return 0
    return 2 * n_sections


def fold_padded(order: int, lanes: int) -> int:
    """Filter state components once padded to a multiple of ``lanes`` (⌈N/L⌉ per lane)."""
    return math.ceil(order / lanes) * lanes


def span_shared_extra(n_sections: int, lanes: int, span: int) -> int:
    """Shared-memory words per pair a span row needs beyond the state's two buffers: two
    halves of the filter state when the filter is folded, else the span's currents for
    the serial pass (none without a filter or spans)."""
    if not n_sections or span < 2:
        return 0
    order = fold_order(n_sections)
    return 2 * fold_padded(order, lanes) if order else span


def filter_state_space(sections: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                      float]:
    """(A, B, C, D) of a cascade of second-order sections in transposed direct form II.

    ``sections`` has rows b0, b1, b2, a1, a2 (the kernels' ``flt`` layout; more columns are
    ignored). The state is the sections' own, ``[z⁰₀, z⁰₁, z¹₀, z¹₁, …]`` as
    :func:`scipy.signal.sosfilt` keeps it, so that z' = A·z + B·u and y = C·z + D·u give
    its output and its state sample for sample.

    Examples
    --------
    >>> from scipy import signal
    >>> sos = signal.butter(4, 0.2, output="sos")
    >>> A, B, C, D = filter_state_space(sos[:, [0, 1, 2, 4, 5]])
    >>> h = signal.sosfilt(sos, np.eye(1, 5)[0])
    >>> bool(np.allclose(h, [D, C @ B, C @ A @ B, C @ A @ A @ B, C @ A @ A @ A @ B]))
    True
    """
    n = sections.shape[0]
    A = np.zeros((2 * n, 2 * n))
    B = np.zeros(2 * n)
    cx, dx = np.zeros(2 * n), 1.0  # a section's input x = cx·z + dx·u
    for q in range(n):
        b0, b1, b2, a1, a2 = (float(v) for v in sections[q, :5])
        cy, dy = b0 * cx, b0 * dx  # y = b0·x + z₀
        cy[2 * q] += 1.0
        A[2 * q] = b1 * cx - a1 * cy  # z₀' = b1·x − a1·y + z₁
        A[2 * q, 2 * q + 1] += 1.0
        B[2 * q] = b1 * dx - a1 * dy
        A[2 * q + 1] = b2 * cx - a2 * cy  # z₁' = b2·x − a2·y
        B[2 * q + 1] = b2 * dx - a2 * dy
        cx, dx = cy, dy
    return A, B, cx, dx


def fold_constants(sections: np.ndarray, span: int, lanes: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The constants of one filter folded into spans of ``span`` samples.

    Returns ``run`` (B + N', N): rows C·Aᵗ (t = 0 … B − 1, the weight of the span's
    starting filter state in its sample t + 1), then the rows of A^B (padded with zero
    rows to N' = :func:`fold_padded`); and ``build`` (1 + N', B): the impulse response
    h₀ … h_(B−1), then row n holds (A^(B−1−s)·B)ₙ for s = 0 … B − 1.

    Examples
    --------
    >>> from scipy import signal
    >>> sos = signal.bessel(2, 0.3, output="sos")
    >>> run, build = fold_constants(sos[:, [0, 1, 2, 4, 5]], 4, 4)
    >>> run.shape, build.shape
    ((8, 2), (5, 4))
    >>> bool(np.allclose(build[0], signal.sosfilt(sos, np.eye(1, 4)[0])))
    True
    """
    A, B, C, D = filter_state_space(sections)
    order = A.shape[0]
    padded = fold_padded(order, lanes)
    run = np.zeros((span + padded, order))
    build = np.zeros((1 + padded, span))
    ca = C.copy()
    for t in range(span):
        run[t] = ca
        build[0, t] = D if t == 0 else float(run[t - 1] @ B)
        ca = ca @ A
    run[span:span + order] = np.linalg.matrix_power(A, span)
    ab = B.copy()  # A^(B−1−s)·B, from s = B − 1 down
    for s in range(span - 1, -1, -1):
        build[1:1 + order, s] = ab
        ab = A @ ab
    return run, build


def fold_keys(row_key: np.ndarray, row_start: np.ndarray, n_span_keys: int,
              sections: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fold entries: one per (span key, filter) pair that some row uses.

    Returns ``row_fold`` (per schedule row: its entry, −1 for a row without spans),
    ``fold_key`` (per entry: its key, whose D the span build reads) and ``fold_sweep``
    (per entry: a sweep with its filter). Sweeps whose sections are equal share a filter.

    Examples
    --------
    Key 0 used by two sweeps with different filters, key 1 by one:

    >>> flt = np.zeros((2, 1, 7))
    >>> flt[:, 0, 0] = [1.0, 0.5]
    >>> [x.tolist() for x in fold_keys(np.array([0, 1, 0, -1]), np.array([0, 2, 4]), 2, flt)]
    [[0, 1, 2, -1], [0, 1, 0], [0, 0, 1]]
    """
    filter_of: dict[bytes, int] = {}
    fid = [filter_of.setdefault(np.ascontiguousarray(sections[w, :, :5]).tobytes(), w)
           for w in range(sections.shape[0])]
    entries: dict[tuple[int, int], int] = {}
    row_fold = np.full(row_key.shape, -1, dtype=np.int64)
    for w in range(row_start.size - 1):
        for r in range(int(row_start[w]), int(row_start[w + 1])):
            k = int(row_key[r])
            if 0 <= k < n_span_keys:
                row_fold[r] = entries.setdefault((k, fid[w]), len(entries))
    fold_key = np.array([k for k, _ in entries], dtype=np.int64)
    fold_sweep = np.array([w for _, w in entries], dtype=np.int64)
    return row_fold, fold_key, fold_sweep


def fold_arrays(row_key: np.ndarray, row_start: np.ndarray, n_span_keys: int,
                sections: np.ndarray, span: int, lanes: int) -> tuple[np.ndarray, ...]:
    """What the GPU reads of a folded filter: ``row_fold`` and ``fold_key``
    (:func:`fold_keys`; one entry at least, as a device array is never empty), the build's
    constants per entry (entry, 1 + N', B) and the run's per sweep (sweep, B + N', N), as
    :func:`fold_constants` gives them."""
    row_fold, fold_key, fold_sweep = fold_keys(row_key, row_start, n_span_keys, sections)
    per_sweep = [fold_constants(x, span, lanes) for x in sections]
    if not fold_key.size:
        fold_key = fold_sweep = np.zeros(1, dtype=np.int64)
    build = np.ascontiguousarray([per_sweep[w][1] for w in fold_sweep])
    return row_fold, fold_key, build, np.ascontiguousarray([x[0] for x in per_sweep])


def span_check(n_states: int, lanes: int, span: int, target: str = "cuda") -> None:
    """Reject spans the generated code cannot lay out."""
    if span < 2 or span & (span - 1):
        raise ValueError(f"span must be a power of two ≥ 2, got {span}")
    if target == "cuda" and (lanes < 2 or span % lanes):
        raise ValueError(f"a span needs lanes ≥ 2 that divide it (lanes {lanes}, span {span})")


def _load_ahead(a: Emitter, ind: str, J: int, offset: int, into: str) -> None:
    """Load this lane's J samples of the span ``offset`` samples on into ``d{into}{q}`` and
    ``w{into}{q}``.

    A row's last span loads samples it will not use: on the GPU the data carry two spans of
    zeros past their end (:mod:`kingen.solve.batch`), so no index is clamped.
    """
    for q in range(J):
        a.prefetch(ind, "objective", offset + q + 1, at="smp + first",
                   into=(f"d{into}{q}", f"w{into}{q}"), clamp=False)


def emit_window_bounds(a: Emitter, ind: str) -> None:
    """``wlo``/``whi``: the samples any used window covers, so that a sample outside them
    costs two comparisons instead of one test per window; the span rows' own sums."""
    a(f"{ind}wlo = 1 << 30")
    a(f"{ind}whi = -1")
    for q in range(a.n_windows):
        a(f"{ind}if wo{q} >= 0:")
        a(f"{ind}    wlo = min(wlo, wl{q})")
        a(f"{ind}    whi = max(whi, wh{q})")
        a(f"{ind}ws{q} = 0.0")
    a(f"{ind}sgg_s = 0.0")
    a(f"{ind}sgd_s = 0.0")
    if a.n_sums == 3:
        a(f"{ind}sg_s = 0.0")


def _span_sample(a: Emitter, ind: str, s: str, mode: str = "objective",
                 loaded: str | None = None, windows: bool = True) -> None:
    """Add the current ``g`` of sweep sample ``s`` to this lane's sums and windows (or store it).

    Peak windows go to the shared ``wv``/``wi`` (a maximum is the same however often a
    sample is seen); sums go to ``ws``, because stage-form rows are walked by every lane
    alike and their samples are already in ``wv``. With ``loaded`` = "a0" (say) the
    sample's data and weight were loaded a span ahead, into ``da0`` and ``wa0``
    (:func:`_load_ahead`). ``windows`` False: the sample lies outside every window.
    """
    a(f"{ind}gs = sample0 + {s}")
    if mode != "objective":
        a(f"{ind}trace[c, U(gs)] = g")
        return
    if loaded is None:
        a(f"{ind}d = data[U(gs)]")
        a(f"{ind}wt = weight[U(gs)]")
    else:
        a(f"{ind}d = d{loaded}")
        a(f"{ind}wt = w{loaded}")
    a(f"{ind}sgg_s += wt * g * g")
    a(f"{ind}sgd_s += wt * g * d")
    if a.n_sums == 3:
        a(f"{ind}sg_s += wt * g")
    if not windows:
        return
    if a.n_windows:
        a(f"{ind}if {s} >= wlo and {s} <= whi:")
    for q in range(a.n_windows):
        a(f"{ind}    if wo{q} >= 0 and {s} >= wl{q} and {s} <= wh{q}:")
        a(f"{ind}        if wo{q} == 0:")
        a(f"{ind}            if abs(g) > abs(wv{q}) or wi{q} < 0:")
        a(f"{ind}                wv{q} = g")
        a(f"{ind}                wi{q} = {s}")
        a(f"{ind}        else:")
        a(f"{ind}            ws{q} += g")


def emit_span_row(a: Emitter, ind: str, lanes: int, span: int, n_cols: int,
                  mode: str = "objective", stage_code: bool = False) -> None:
    """A propagated row in spans of ``span`` samples, shared by ``lanes`` threads (``mode``'s).

    Entered with the full state in ``p{i}`` on every lane (and the filter's in ``fz``);
    left the same way, after the row's checks. ``n_cols`` is C, the state columns each lane
    carries. The span arrays are read at ``kf``: the row's fold entry with a folded filter
    (``row_fold[r]``), else its key. ``stage_code``: the kernel also steps rows in stage
    form, which leaves the spans fewer registers.
    """
    from kingen.codegen.propagator import alternating, dot, lanes_row_enter, lanes_row_exit

    S, F = a.scheme.n_states, a.cast
    C, J = n_cols, span // lanes
    order = fold_order(a.n_sections)
    NZ = fold_padded(order, lanes) // lanes if order else 0
    z = [f"fz{n // 2}_{n % 2}" for n in range(order)]
    lanes_row_enter(a, ind, C, lanes)
    a(f"{ind}first = lane * {J}")
    for k in range(C):
        a(f"{ind}o{k} = own0[{k}]")
        for i in range(S):
            a(f"{ind}m{i}_{k} = {F}(DV[kf, {i}, U(col + {k}), c])")
    for q in range(J):
        for i in range(S):
            a(f"{ind}u{i}_{q} = {F}(GV[kf, {i}, U(first + {q}), c])")
    a(f"{ind}nb = nrep // {span}")
    a(f"{ind}rem = nrep - nb * {span}")
    # A span's samples are a new cache line of the data and the weights (B samples of each),
    # which came from L2 or memory while the lane waited, at every span. Loaded a span ahead,
    # they arrive while the lane computes. A filter's rows read theirs as before: folded
    # into the spans they held more registers and ran 10 % slower loaded ahead
    # (analysis/h200/optimization_log_ideal.md, step 3); left out of the spans, every lane
    # walks all of the span's samples.
    ahead = mode == "objective" and not order and not a.n_sections
    if ahead:
        _load_ahead(a, ind, J, 0, "a")

    SP = C * lanes
    # the weights of the starting filter state in this lane's samples (C·Aᵗ), and this
    # lane's components of the state after a span (rows of A^B and of W): in registers
    # when a lane has one component; with more (fewer lanes, which already hold more
    # columns of M^B each) read at every span, from the cache
    held = NZ == 1

    def zc(q: int, n: int) -> str:
        return f"zc{q}_{n}" if held else f"FC[w, U(first + {q}), {n}]"

    def za(k: int, n: int) -> str:
        return f"za{k}_{n}" if held else f"FC[w, U({span} + zr + {k}), {n}]"

    def zw(i: int, k: int) -> str:
        return f"zw{i}_{k}" if held else f"{F}(WV[kf, U(zr + {k}), {i}, c])"

    if order:
        a(f"{ind}zr = lane * {NZ}")
    if order and held:
        for q in range(J):
            for n in range(order):
                a(f"{ind}zc{q}_{n} = FC[w, U(first + {q}), {n}]")
        for n in range(order):
            a(f"{ind}za0_{n} = FC[w, U({span} + zr), {n}]")
        for i in range(S):
            a(f"{ind}zw{i}_0 = {F}(WV[kf, U(zr), {i}, c])")
    if order:
        # the filter state's two halves, which alternate with the state's
        NP = NZ * lanes
        a(f"{ind}zh0 = sh[U(base + {2 * SP + 1}):U(base + {2 * SP + 1 + NP})]")
        a(f"{ind}zh1 = sh[U(base + {2 * SP + 1 + NP}):U(base + {2 * SP + 1 + 2 * NP})]")
    elif a.n_sections:
        # the span's currents, in sample order, for the filter (after the two halves)
        a(f"{ind}fb = sh[U(base + {2 * SP + 1}):U(base + {2 * SP + 1 + span})]")

    def currents(ind2: str, src: str, partial: bool, zdst: str = "") -> None:
        if order:
            # a folded filter's rows take their remainder by single products, never here
            assert not partial, "a folded filter's span rows have no partial span"
            interleaved_dots(ind2, src)
        else:
            for i in range(S):
                a(f"{ind2}v{i} = {src}[{i}]")
        a(f"{ind2}if rec == 1:")
        ind3 = ind2 + "    "
        if order:
            folded_currents(ind3, zdst)
            return
        if a.n_sections:
            filtered_currents(ind3, partial)
            return
        if ahead and not partial:
            # this span's data and weights arrived during the last span; the next span's
            # are asked for now. With registers to spare two sets alternate with the
            # halves, and nothing is copied; in a kernel with stage code the second set
            # spilled (the float64 launch with 0.2 ms exchange 138.5 ms against 109.3 ms
            # with copies, analysis/h200/optimization_log_exchange.md, step 8)
            use, load = ("a", "b") if src == "half0" else ("b", "a")
            if stage_code:
                for q in range(J):
                    a(f"{ind3}db{q} = da{q}")
                    a(f"{ind3}wb{q} = wa{q}")
                use, load = "b", "a"
            _load_ahead(a, ind3, J, span, load)
            if a.n_windows and not stage_code:
                # most spans lie outside every window: one test per span rather than two
                # compares per sample (4 in 10 of a float64 span's instructions; with stage
                # code the second copy of the samples gained nothing)
                a(f"{ind3}if smp + {span} >= wlo and smp + 1 <= whi:")
                span_samples(ind3 + "    ", use, True)
                a(f"{ind3}else:")
                span_samples(ind3 + "    ", use, False)
            else:
                span_samples(ind3, use, True)
            return
        if not partial:
            span_samples(ind3, None, True)
            return
        for q in range(J):
            a(f"{ind3}g = float({dot([f'v{i} * u{i}_{q}' for i in range(S)])}) * drv")
            a(f"{ind3}if first + {q + 1} <= rem:")
            _span_sample(a, ind3 + "    ", f"smp + first + {q + 1}", mode)

    def span_samples(ind3: str, use: str | None, windows: bool) -> None:
        # this lane's J samples of a whole span; ``use``: their data's registers, or None
        for q in range(J):
            a(f"{ind3}g = float({dot([f'v{i} * u{i}_{q}' for i in range(S)])}) * drv")
            _span_sample(a, ind3, f"smp + first + {q + 1}", mode,
                         None if use is None else f"{use}{q}", windows)

    def interleaved_dots(ind2: str, src: str) -> None:
        # With a folded filter, a whole span's dot products with the state (the lane's J
        # currents, its share of the next filter state, its C columns of the next state)
        # interleaved over the state's components: each p_i is read and used by all of
        # them at once, so few are held at a time. The filter's constants left the loop
        # too few registers, and its spills bound it; interleaved, it spills less and runs
        # 12 % faster. Without a filter the loop does not spill, and the partial sums of
        # ``dot`` are faster there (analysis/h200/optimization_log_exchange.md, step 11)
        # (sum, its coefficients, whether it adds to the value it holds: the columns do)
        sums = ([(f"gd{q}", [f"u{i}_{q}" for i in range(S)], False) for q in range(J)]
                + [(f"zd{k}", [zw(i, k) for i in range(S)], False) for k in range(NZ)]
                + [(f"o{k}", [f"m{i}_{k}" for i in range(S)], True) for k in range(C)])
        for i in range(S):
            a(f"{ind2}v{i} = {src}[{i}]")
            for name, coef, onto in sums:
                a(f"{ind2}{name} = v{i} * {coef[i]}" if i == 0 and not onto else
                  f"{ind2}{name} += v{i} * {coef[i]}")

    def folded_currents(ind3: str, zdst: str) -> None:
        # yₜ = (C·Aᵗ⁻¹)·z + drv·p·G̃ₜ for this lane's J samples, then this lane's share of
        # the next filter state A^B·z + drv·W·p; the lanes read it all after the advance's
        # barrier (the two halves alternate, so no lane overwrites one still being read)
        for q in range(J):
            a(f"{ind3}g = float(gd{q}) * drv + "
              f"({dot([f'{zc(q, n)} * {x}' for n, x in enumerate(z)])})")
            _span_sample(a, ind3, f"smp + first + {q + 1}", mode)
        for k in range(NZ):
            a(f"{ind3}{zdst}[U(zr + {k})] = "
              f"{dot([f'{za(k, n)} * {x}' for n, x in enumerate(z)])} + "
              f"float(zd{k}) * drv")

    def filtered_currents(ind3: str, partial: bool) -> None:
        # A filter runs through the samples in order: each lane puts its J currents in the
        # pair's buffer, and every lane then filters all of the span's samples alike (its
        # state stays the same on every lane) and reduces its own J of them. The buffer is
        # rewritten only after the advance's barrier, once every lane has read it.
        for q in range(J):
            a(f"{ind3}fb[first + {q}] = {dot([f'v{i} * u{i}_{q}' for i in range(S)])}")
        a(f"{ind3}WARP_SYNC(gmask)")
        a(f"{ind3}for t in range({'rem' if partial else span}):")
        a(f"{ind3}    g = float(fb[t]) * drv")
        a.filter_sample(ind3 + "    ")
        a(f"{ind3}    if t >= first and t < first + {J}:")
        _span_sample(a, ind3 + "        ", "smp + t + 1", mode)

    def advance(ind2: str, dst: str, matrix: str) -> None:
        # with a folded filter a whole span's columns were summed with its currents
        for k in range(0 if order and matrix == "span" else C):
            if matrix == "span":
                terms = [f"v{i} * m{i}_{k}" for i in range(S)]
            else:
                terms = [f"v{i} * {F}(D[kk, {i}, U(col + {k}), c])" for i in range(S)]
            a(f"{ind2}o{k} = {dot([f'o{k}'] + terms, 2)}")
        for k in range(C):
            a(f"{ind2}{dst}[{k}] = o{k}")
        a(f"{ind2}WARP_SYNC(gmask)")

    def full_span(ind2: str, src: str, dst: str) -> None:
        zdst = "zh1" if dst == "own1" else "zh0"
        currents(ind2, src, False, zdst)
        advance(ind2, dst, "span")
        a(f"{ind2}if rec == 1:")
        for n, x in enumerate(z):
            a(f"{ind2}    {x} = float({zdst}[{n}])")
        a(f"{ind2}    smp += {span}")

    # the two halves alternate span by span, unrolled by two so each is a fixed slice
    alternating(a, ind, "nb", full_span)
    a(f"{ind}if rem > 0:")
    ind2 = ind + "    "
    if not order:
        a(f"{ind2}cur = half1 if nb % 2 == 1 else half0")
        currents(ind2, "cur", True)
    a(f"{ind2}for t in range(rem):")
    ind3 = ind2 + "    "
    a(f"{ind3}src = half1 if (nb + t) % 2 == 1 else half0")
    a(f"{ind3}dst = own0 if (nb + t) % 2 == 1 else own1")
    for i in range(S):
        a(f"{ind3}v{i} = src[{i}]")
    advance(ind3, "dst", "single")
    if order:
        # a few samples per row: each current summed over the lanes, and passed through
        # the sections on every lane alike (their state stays the same on every lane)
        a(f"{ind3}if rec == 1:")
        ind4 = ind3 + "    "
        a(f"{ind4}gp = " + " + ".join(f"gc{k} * o{k}" for k in range(C)))
        off = 1
        while off < lanes:
            a(f"{ind4}gp += SHFL_XOR(gmask, gp, {off})")
            off *= 2
        a(f"{ind4}g = float(gp) * drv")
        a.filter_sample(ind4)
        a(f"{ind4}if lane == 0:")
        _span_sample(a, ind4 + "    ", "smp + t + 1", mode)
    a(f"{ind2}if rec == 1:")
    a(f"{ind2}    smp += rem")
    a(f"{ind}last = half1 if (nb + rem) % 2 == 1 else half0")
    lanes_row_exit(a, ind, C, lanes, mode)


def emit_span_reduce(a: Emitter, ind: str, lanes: int) -> None:
    """Combine the lanes' sums and windows before lane 0 writes them.

    Peak windows keep the larger magnitude, and on a tie the earlier sample, as one thread
    walking the samples in order would.
    """
    off = 1
    while off < lanes:
        a(f"{ind}sgg_s += SHFL_XOR(gmask, sgg_s, {off})")
        a(f"{ind}sgd_s += SHFL_XOR(gmask, sgd_s, {off})")
        if a.n_sums == 3:
            a(f"{ind}sg_s += SHFL_XOR(gmask, sg_s, {off})")
        for q in range(a.n_windows):
            a(f"{ind}ws{q} += SHFL_XOR(gmask, ws{q}, {off})")
            a(f"{ind}ov = SHFL_XOR(gmask, wv{q}, {off})")
            a(f"{ind}oi = SHFL_XOR(gmask, wi{q}, {off})")
            a(f"{ind}if oi >= 0 and (wi{q} < 0 or abs(ov) > abs(wv{q}) or "
              f"(abs(ov) == abs(wv{q}) and oi < wi{q})):")
            a(f"{ind}    wv{q} = ov")
            a(f"{ind}    wi{q} = oi")
        off *= 2
    a(f"{ind}sgg += sgg_s")
    a(f"{ind}sgd += sgd_s")
    if a.n_sums == 3:
        a(f"{ind}sg += sg_s")
    for q in range(a.n_windows):
        a(f"{ind}if wo{q} >= 1:")
        a(f"{ind}    wv{q} += ws{q}")
