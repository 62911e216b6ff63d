"""The span arrays of a constant key: its currents Mʲ·g (j = 1 … B) and M^B − I.

:mod:`kingen.codegen.span` says what the arrays are and how a propagated row reads them.
They are built once per (key, candidate) after the matrices D = M − I, in float64 whatever
the precision:

- on the GPU (:func:`emit_span_build`) by the S threads of a (key, candidate) together: the
  currents as B products of the vector g with M, and M^B − I by log₂B squarings, with D and
  the vector in the group's shared memory;
- on the CPU (:func:`emit_span_build_cpu`) by one thread, S rows each advanced B products
  with M (the builds are a few per cent of a CPU solve, which its samples dominate).

Both are the same maps as B products of every row with M, regrouped: the arrays agree up to
rounding, and the solvers' results with them.
"""

from __future__ import annotations

from kingen.codegen.emit import Emitter


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
        a(f"{ind}{dv.format(j=j)} = F64(0.0) if abs(x) < {d_flush!r} else x")


def emit_span_build(a: Emitter, span: int, d_flush: float, fold: int = 0) -> None:
    """``span_thread(c, k, i, act, Ms, Vs, GV, DV)``: row i of the span arrays of (key k,
    candidate c), in float64, computed by the S threads of a group together.

    ``a`` must cast to ``F64``. ``Ms`` holds D = M − I of (k, c) row by row (S² words) in
    shared memory, loaded by the group; ``Vs`` is the group's 2·S shared words. ``act`` says
    whether (k, c) exists: every thread of the block takes the barriers, and only those
    that act store. Two parts, each the same map as B products of a row with M, regrouped:

    - the currents, vⱼ = Mʲ·g by vⱼ₊₁ = vⱼ + D·vⱼ (v₀ = g): thread i keeps row i of D in
      registers and computes component i, which is ``GV[k, i, j − 1, c]``; the group
      exchanges v through the two halves of ``Vs``, one barrier per power;
    - M^B − I by log₂B squarings of E = M − I in place, E ← 2E + E·E (as (I + E)² =
      I + 2E + E², so that E's small entries keep their relative precision): thread i
      computes row i, between two barriers (all rows read, then row i written).

    That is S·B + S²·log₂B multiply-adds per thread, against S²·B for B products of the
    thread's row of M (1,280 against 4,096 for S = B = 16).

    With ``fold`` (N' = :func:`kingen.codegen.span.fold_padded` filter state components) it is
    ``span_thread(c, k, i, act, Ms, Vs, GV, DV, WV, HK)`` and k is a fold entry: the B
    currents stay in a local array, and ``GV`` takes their convolution with the filter's
    impulse response ``HK[k, 0]`` (G̃), ``WV[k, n, i, c]`` their weights into state
    component n (``HK[k, 1 + n]``; see :func:`kingen.codegen.span.fold_constants`).

    Examples
    --------
    Spans of 8: one barrier per power of the currents, two per squaring (three squarings).

    >>> from kingen.model.scheme import Scheme
    >>> a = Emitter(Scheme.load("models/jonas_1993.toml"), cast="F64")
    >>> emit_span_build(a, 8, 1e-150)
    >>> a.lines[0].startswith("GSPAN = np.array(")
    True
    >>> [line.strip() for line in a.lines if "range(" in line][:2]
    ['for jj in range(8):', 'for q in range(3):']
    """
    from kingen.codegen.propagator import dot

    S = a.scheme.n_states
    cond = [float(x) for x in a.scheme.conductance]
    a.lines.insert(0, f"GSPAN = np.array({cond!r})")
    a("@DEVICE")
    extra = ", WV, HK" if fold else ""
    a(f"def span_thread(c, k, i, act, Ms, Vs, GV, DV{extra}):")
    ind = "    "
    if fold:
        a(f"{ind}gl = cuda.local.array({span}, F64)")
    for j in range(S):
        a(f"{ind}d{j} = Ms[i * {S} + {j}]")
    a(f"{ind}v = F64(GSPAN[i])")
    a(f"{ind}for jj in range({span}):")
    a(f"{ind}    h = (jj & 1) * {S}")
    a(f"{ind}    Vs[h + i] = v")
    a(f"{ind}    cuda.syncthreads()")
    a(f"{ind}    v = v + ({dot([f'd{j} * Vs[h + {j}]' for j in range(S)])})")
    a(f"{ind}    if act:")
    a(f"{ind}        {'gl[jj]' if fold else 'GV[k, i, jj, c]'} = v")
    for j in range(S):
        a(f"{ind}e{j} = d{j}")
    a(f"{ind}for q in range({span.bit_length() - 1}):")
    for j in range(S):
        terms = [f"e{m} * Ms[{m * S + j}]" for m in range(S)]
        a(f"{ind}    n{j} = F64(2.0) * e{j} + ({dot(terms)})")
    a(f"{ind}    cuda.syncthreads()")
    for j in range(S):
        a(f"{ind}    e{j} = n{j}")
        a(f"{ind}    Ms[i * {S} + {j}] = n{j}")
    a(f"{ind}    cuda.syncthreads()")
    a(f"{ind}if not act:")
    a(f"{ind}    return")
    for j in range(S):
        a(f"{ind}DV[k, i, {j}, c] = F64(0.0) if abs(e{j}) < {d_flush!r} else e{j}")
    a(f"{ind}for j in range({S}, DV.shape[2]):")
    a(f"{ind}    DV[k, i, j, c] = 0.0")
    if fold:
        a(f"{ind}for t in range({span}):")
        a(f"{ind}    acc = F64(0.0)")
        a(f"{ind}    for s in range(t + 1):")
        a(f"{ind}        acc += F64(HK[k, 0, t - s]) * gl[s]")
        a(f"{ind}    GV[k, i, t, c] = acc")
        a(f"{ind}for n in range({fold}):")
        a(f"{ind}    acc = F64(0.0)")
        a(f"{ind}    for s in range({span}):")
        a(f"{ind}        acc += F64(HK[k, 1 + n, s]) * gl[s]")
        a(f"{ind}    WV[k, n, i, c] = acc")
    a("")


def emit_span_build_cpu(a: Emitter, span: int, d_flush: float) -> None:
    """``span_thread(slot, k, D, GV, DV)``: the span arrays of one (candidate, key), all S
    rows, from ``D[slot, k]`` (``a`` must cast to ``F64``)."""
    S = a.scheme.n_states
    a("@DEVICE")
    a("def span_thread(slot, k, D, GV, DV):")
    ind = "    "
    a(f"{ind}for i in range({S}):")
    ind2 = ind + "    "
    _span_rows(a, ind2, span, d_flush, "F64(D[slot, k, {i}, {j}])", "GV[slot, k, i, jj]",
               "DV[slot, k, i, {j}]")
    a("")
