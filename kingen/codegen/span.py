"""Sample spans: B samples of a propagated row from one product.

On a propagated row the state after j more products is p·Mʲ, and the only thing the objective
needs of each sample is its current, p·Mʲ·g (g the conductances). So for a span of B samples
that starts at state p, the currents are B dot products with the precomputed columns
Gⱼ = Mʲ·g (j = 1 … B), and the state moves on by one product with M^B. A sample then costs
2S + 2S²/B flops instead of the 2S² of one product per sample (S states): for a 16-state
scheme and B = 16, 64 instead of 512. The arithmetic is the same map, regrouped: the
results equal the one-product-per-sample form up to rounding.

Two arrays per (key, candidate), built on the device from D = M − I after the build kernel:

- ``GV[k, i, j, c]`` = (Mʲ⁺¹·g)ᵢ, the current of the sample j + 1 products on per unit of
  occupancy of state i;
- ``DV[k, i, :, c]`` = row i of M^B − I (D's layout, so that float32 keeps its small
  entries).

With L lanes per (candidate, sweep) pair each lane computes B/L of a span's currents (and
adds them to its own sums and windows) and C = S/L columns of the next state: the per-sample
bookkeeping is shared out instead of repeated on every lane. A row's last nrep mod B samples
take their currents from GV too, and the state crosses them by single products with D, read
from memory (a few samples per row).

Only the objective mode uses spans: a trace needs every sample's current written anyway.
"""

from __future__ import annotations

from kingen.codegen.emit import Emitter

SPAN_ARGS = " GV, DV,"


def span_check(n_states: int, lanes: int, span: int, target: str = "cuda") -> None:
    """Reject spans the generated code cannot lay out."""
    if span < 2 or span & (span - 1):
        raise ValueError(f"span must be a power of two ≥ 2, got {span}")
    if target == "cuda" and (lanes < 2 or span % lanes):
        raise ValueError(f"a span needs lanes ≥ 2 that divide it (lanes {lanes}, span {span})")


def span_groups(n_states: int) -> int:
    """(key, candidate) matrices one block of ``build_span`` holds in shared memory."""
    return max(1, 128 // n_states)


def _span_rows(a: Emitter, ind: str, span: int, d_flush: float, d_entry: str, gv: str,
               dv: str) -> None:
    """Row i of Mʲ for j = 1 … B by products with M = I + D (``d_entry`` formats D's
    entry {i}, {j}); each power's current into ``gv``, the last power less I into ``dv``
    (which formats column {j})."""
    S = a.scheme.n_states
    cond = a.scheme.conductance
    for j in range(S):
        a(f"{ind}r{j} = F64(1.0) if i == {j} else F64(0.0)")
    a(f"{ind}for jj in range({span}):")
    for j in range(S):
        terms = [f"r{i} * " + d_entry.format(i=i, j=j) for i in range(S)]
        a(f"{ind}    n{j} = r{j} + (" + " + ".join(terms) + ")")
    for j in range(S):
        a(f"{ind}    r{j} = n{j}")
    g = " + ".join(f"{a.const(cond[j])} * r{j}" for j in range(S) if cond[j] != 0.0)
    a(f"{ind}    {gv} = {g or '0.0'}")
    for j in range(S):
        a(f"{ind}x = r{j} - (F64(1.0) if i == {j} else F64(0.0))")
        a(f"{ind}{dv.format(j=j)} = x if abs(x) >= {d_flush!r} else F64(0.0)")


def emit_span_build(a: Emitter, span: int, d_flush: float) -> None:
    """``span_thread(c, k, i, Ms, GV, DV)``: row i of Mʲ for j = 1 … B, in float64.

    ``a`` must cast to ``F64``. ``Ms`` is D = M − I of (key k, candidate c) in shared
    memory, loaded by the S threads of the group, so that the B products of every row read
    it from there rather than from device memory. Row i of Mʲ is e_i advanced by j products
    with M = I + D; its dot product with g is ``GV[k, i, j − 1, c]``.
    """
    S = a.scheme.n_states
    a("@DEVICE")
    a("def span_thread(c, k, i, Ms, GV, DV):")
    ind = "    "
    _span_rows(a, ind, span, d_flush, "Ms[{i}, {j}]", "GV[k, i, jj, c]",
               "DV[k, i, {j}, c]")
    a(f"{ind}for j in range({S}, DV.shape[2]):")
    a(f"{ind}    DV[k, i, j, c] = 0.0")
    a("")


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


def _span_sample(a: Emitter, ind: str, s: str) -> None:
    """Add the current ``g`` of sweep sample ``s`` to this lane's sums and windows.

    Peak windows go to the shared ``wv``/``wi`` (a maximum is the same however often a
    sample is seen); sums go to ``ws``, because stage-form rows are walked by every lane
    alike and their samples are already in ``wv``.
    """
    a(f"{ind}gs = sample0 + {s}")
    a(f"{ind}d = data[U(gs)]")
    a(f"{ind}wt = weight[U(gs)]")
    a(f"{ind}sgg_s += wt * g * g")
    a(f"{ind}sgd_s += wt * g * d")
    if a.n_sums == 3:
        a(f"{ind}sg_s += wt * g")
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


def emit_span_row(a: Emitter, ind: str, lanes: int, span: int, n_cols: int) -> None:
    """A propagated row in spans of ``span`` samples, shared by ``lanes`` threads.

    Entered with the full state in ``p{i}`` on every lane; left the same way, after the
    row's checks. ``n_cols`` is C, the state columns each lane carries.
    """
    from kingen.codegen.propagator import (
        alternating,
        dot,
        lanes_row_enter,
        lanes_row_exit,
    )

    S, F = a.scheme.n_states, a.cast
    C, J = n_cols, span // lanes
    lanes_row_enter(a, ind, C, lanes)
    a(f"{ind}first = lane * {J}")
    for k in range(C):
        a(f"{ind}o{k} = own0[{k}]")
        for i in range(S):
            a(f"{ind}m{i}_{k} = {F}(DV[kk, {i}, U(col + {k}), c])")
    for q in range(J):
        for i in range(S):
            a(f"{ind}u{i}_{q} = {F}(GV[kk, {i}, U(first + {q}), c])")
    a(f"{ind}nb = nrep // {span}")
    a(f"{ind}rem = nrep - nb * {span}")

    if a.n_sections:
        # the span's currents, in sample order, for the filter (after the two halves)
        SP = C * lanes
        a(f"{ind}fb = sh[U(base + {2 * SP + 1}):U(base + {2 * SP + 1 + span})]")

    def currents(ind2: str, src: str, partial: bool) -> None:
        for i in range(S):
            a(f"{ind2}v{i} = {src}[{i}]")
        a(f"{ind2}if rec == 1:")
        ind3 = ind2 + "    "
        if a.n_sections:
            filtered_currents(ind3, partial)
            return
        for q in range(J):
            a(f"{ind3}g = float({dot([f'v{i} * u{i}_{q}' for i in range(S)])}) * drv")
            if partial:
                a(f"{ind3}if first + {q + 1} <= rem:")
                _span_sample(a, ind3 + "    ", f"smp + first + {q + 1}")
            else:
                _span_sample(a, ind3, f"smp + first + {q + 1}")

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
        _span_sample(a, ind3 + "        ", "smp + t + 1")

    def advance(ind2: str, dst: str, matrix: str) -> None:
        for k in range(C):
            if matrix == "span":
                terms = [f"v{i} * m{i}_{k}" for i in range(S)]
            else:
                terms = [f"v{i} * {F}(D[kk, {i}, U(col + {k}), c])" for i in range(S)]
            a(f"{ind2}o{k} = {dot([f'o{k}'] + terms, 2)}")
        for k in range(C):
            a(f"{ind2}{dst}[{k}] = o{k}")
        a(f"{ind2}WARP_SYNC(gmask)")

    def full_span(ind2: str, src: str, dst: str) -> None:
        currents(ind2, src, False)
        advance(ind2, dst, "span")
        a(f"{ind2}if rec == 1:")
        a(f"{ind2}    smp += {span}")

    # the two halves alternate span by span, unrolled by two so each is a fixed slice
    alternating(a, ind, "nb", full_span)
    a(f"{ind}if rem > 0:")
    ind2 = ind + "    "
    a(f"{ind2}cur = half1 if nb % 2 == 1 else half0")
    currents(ind2, "cur", True)
    a(f"{ind2}for t in range(rem):")
    ind3 = ind2 + "    "
    a(f"{ind3}src = half1 if (nb + t) % 2 == 1 else half0")
    a(f"{ind3}dst = own0 if (nb + t) % 2 == 1 else own1")
    for i in range(S):
        a(f"{ind3}v{i} = src[{i}]")
    advance(ind3, "dst", "single")
    a(f"{ind2}if rec == 1:")
    a(f"{ind2}    smp += rem")
    a(f"{ind}last = half1 if (nb + rem) % 2 == 1 else half0")
    lanes_row_exit(a, ind, C, lanes, "objective")


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


# ------------------------------------------------------------------------------ CPU
# One thread per (candidate, sweep) holds the whole state; the span arrays are read from the
# cache like D, from the slot that holds the candidate's matrices: ``GV[slot, k, j, i]`` (a
# current's S coefficients contiguous) and ``DV[slot, k, i, j]``.


def emit_span_build_cpu(a: Emitter, span: int, d_flush: float) -> None:
    """``span_thread(slot, k, D, GV, DV)``: the span arrays of one (candidate, key), all S
    rows, from ``D[slot, k]`` (``a`` must cast to ``F64``)."""
    S = a.scheme.n_states
    a("@DEVICE")
    a("def span_thread(slot, k, D, GV, DV):")
    ind = "    "
    a(f"{ind}for i in range({S}):")
    ind2 = ind + "    "
    _span_rows(a, ind2, span, d_flush, "F64(D[slot, k, {i}, {j}])", "GV[slot, k, jj, i]",
               "DV[slot, k, i, {j}]")
    a("")


def emit_span_row_cpu(a: Emitter, ind: str, span: int) -> None:
    """A propagated row in spans of ``span`` samples, one thread holding the whole state
    ``p{i}`` (objective mode); the row's checks follow as for one product per sample."""
    from kingen.codegen.propagator import dot, row_end_check

    S, F = a.scheme.n_states, a.cast
    p = [f"p{i}" for i in range(S)]
    a(f"{ind}nb = nrep // {span}")
    a(f"{ind}rem = nrep - nb * {span}")

    def currents(ind2: str, count: str) -> None:
        a(f"{ind2}if rec == 1:")
        a(f"{ind2}    for q in range({count}):")
        ind3 = ind2 + "        "
        a(f"{ind3}g = float({dot([f'{x} * GV[slot, kk, q, {i}]' for i, x in enumerate(p)])}) * drv")
        a(f"{ind3}smp += 1")
        a(f"{ind3}code = 0")
        a.store_sample(ind3, "objective", [])

    def advance(ind2: str, matrix: str) -> None:
        for j in range(S):
            terms = [f"p{i} * {matrix}[slot, kk, {i}, {j}]" for i in range(S)]
            a(f"{ind2}n{j} = {dot([f'p{j}'] + terms, 2)}")
        for j in range(S):
            a(f"{ind2}p{j} = n{j}")
            a.flush(ind2, f"p{j}")

    a(f"{ind}for b in range(nb):")
    currents(ind + "    ", str(span))
    advance(ind + "    ", "DV")
    a(f"{ind}if rem > 0:")
    currents(ind + "    ", "rem")
    a(f"{ind}    for t in range(rem):")
    advance(ind + "        ", "D")
    row_end_check(a, ind, " + ".join(p), " or ".join(f"{x} < -tol or {x} > 1.0 + tol"
                                                      for x in p), "objective", None)
    if a.compensated:
        for j in range(S):
            a(f"{ind}e{j} = {F}(0.0)")
