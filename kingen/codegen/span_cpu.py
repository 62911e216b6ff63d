"""The propagator form's span rows on the CPU (the GPU's are :mod:`kingen.codegen.span`).

One thread per (candidate, sweep) holds the whole state; the span arrays are read from the
cache like D, from the slot that holds the candidate's matrices: ``GV[slot, k, i, j]`` (a
coefficient's B samples contiguous) and ``DV[slot, k, i, j]``, so that a span's currents
and its product are loops over contiguous entries, which the compiler vectorizes (with
``gw`` and ``pv``, the thread's scratch of B and S values: see
:func:`kingen.codegen.propagator.flat_views`).
"""

from __future__ import annotations

from kingen.codegen.emit import Emitter


def emit_span_row_cpu(a: Emitter, ind: str, span: int, mode: str = "objective") -> None:
    """A propagated row in spans of ``span`` samples, one thread holding the whole state
    ``p{i}`` (``mode``'s); the row's checks follow as for one product per sample."""
    from kingen.codegen.propagator import dot, row_end_check

    S, F = a.scheme.n_states, a.cast
    p = [f"p{i}" for i in range(S)]
    a(f"{ind}nb = nrep // {span}")
    a(f"{ind}rem = nrep - nb * {span}")

    # the key's blocks of the flat views (kingen.codegen.propagator.flat_views)
    a(f"{ind}gb = (slot * GV.shape[1] + kk) * {span * S}")
    a(f"{ind}vb = (slot * DV.shape[1] + kk) * {S * S}")
    a(f"{ind}db = (slot * D.shape[1] + kk) * {S * S}")

    def currents(ind2: str, count: str) -> None:
        # the currents of all B samples (the remainder's too: a loop of a known count is
        # vectorized whole) in a loop of their own, which the compiler vectorizes (GV holds
        # a coefficient's samples contiguously); the sums over the samples follow
        a(f"{ind2}if rec == 1:")
        a(f"{ind2}    for q in range({span}):")
        terms = [f"{x} * GVf[U(gb + {i * span} + q)]" for i, x in enumerate(p)]
        a(f"{ind2}        gw[q] = {dot(terms)}")
        a(f"{ind2}    for q in range({count}):")
        ind3 = ind2 + "        "
        a(f"{ind3}g = float(gw[q]) * drv")
        a(f"{ind3}smp += 1")
        a(f"{ind3}code = 0")
        a.store_sample(ind3, mode, [])

    def advance(ind2: str, matrix: str, start: str) -> None:
        # one loop over the new state's components, vectorized like the currents (a row
        # of the matrix is contiguous); each component is the same sum as when unrolled,
        # and the same flush (a NaN stays NaN, for the row's checks)
        a(f"{ind2}for j in range({S}):")
        terms = [f"p{i} * {matrix}[U({start} + {i * S} + j)]" for i in range(S)]
        a(f"{ind2}    v = {dot(['pv[j]'] + terms, 2)}")
        tiny = a.const(a.flush_below) if a.flush_below > 0.0 else None
        a(f"{ind2}    pv[j] = {F}(0.0) if abs(v) < {tiny} else v" if tiny else
          f"{ind2}    pv[j] = v")

    # the state lives in pv over the row (a wide store, then narrow loads of it, which the
    # core forwards; narrow stores then a wide load would stall), its scalars read anew
    # each span for the currents and the product's broadcasts
    for j in range(S):
        a(f"{ind}pv[{j}] = p{j}")
    # the spans and then the remainder's single products in one loop, whose product reads
    # M^B or M: one copy of the S² multiply-adds, not two, halves what Numba compiles here
    a(f"{ind}for b in range(nb + rem):")
    ind2 = ind + "    "
    for j in range(S):
        a(f"{ind2}p{j} = pv[{j}]")
    a(f"{ind2}if b <= nb:")
    currents(ind2 + "    ", f"{span} if b < nb else rem")
    a(f"{ind2}M = DVf if b < nb else Df")
    a(f"{ind2}mb = vb if b < nb else db")
    advance(ind2, "M", "mb")
    for j in range(S):
        a(f"{ind}p{j} = pv[{j}]")
    row_end_check(a, ind, " + ".join(p), " | ".join(f"({x} < -tol) | ({x} > 1.0 + tol)"
                                                      for x in p), mode, None)
    if a.compensated:
        for j in range(S):
            a(f"{ind}e{j} = {F}(0.0)")
