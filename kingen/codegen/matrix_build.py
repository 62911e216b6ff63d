"""The propagator form's matrix builders: for each key (a step size and concentration, or an
edge sample's concentrations), D = R(hQ)ⁿ − I, the n RK4 steps between two samples less
the identity (:mod:`kingen.codegen.propagator` says why D and not M). An edge sample's steps
are its candidate's own coarse steps, as the stage form takes them on the sample's row
(:mod:`kingen.solve.schedule`).

- On the GPU, ``build_thread(c, k, i, ...)`` advances the unit vector eᵢ of candidate c
  through key k's steps and stores row i of D in ``D[k, i, :, c]``: one thread per row.
- On the CPU, ``build_thread(c, slot, k, ...)`` steps all S rows of key k together and
  stores them in ``D[slot, k]``: each step runs the rows through one loop over them, which
  the compiler vectorizes, since the rows share the step's rates. Each row takes the same
  operations as when stepped alone, so both give the same D.

The span arrays built from D are :mod:`kingen.codegen.span_build`'s.
"""

from __future__ import annotations

from kingen.codegen.emit import Emitter
from kingen.codegen.span import fold_padded, span_check
from kingen.codegen.span_build import emit_span_build, emit_span_build_cpu
from kingen.codegen.stage import GeneratedCode, finished
from kingen.model.scheme import Scheme


def _key_rates(a: Emitter, ind: str, edges: bool) -> str:
    """Key k's rates and step sizes (an edge key's rates that do not change along it); the
    indent of the constant key's branch."""
    a.base_rates(ind)
    const = ind
    if edges:
        # an edge sample's key: the stage form's steps at its concentrations, from
        # conc[keys_conc[k]] on
        a(f"{ind}ck = keys_conc[k]")
        a(f"{ind}if ck < 0:")
        const = ind + "    "
    a(f"{const}cc = F64(keys_f[k, 1])")
    a.rates(const, "cc", False)
    if edges:
        a(f"{ind}else:")
        a.constant_rates_of_smooth_rows(const)
    a(f"{ind}hd = keys_f[k, 0]")
    a(f"{ind}h = F64(hd)")
    a(f"{ind}hh = F64(0.5) * h")
    a(f"{ind}h6 = h / F64(6.0)")
    return const


def _own_steps_of_key(a: Emitter, ind: str) -> None:
    """``per`` of edge key k: its row's coarse steps (:meth:`Emitter.own_steps`), so that
    its matrix is the product of the steps the stage form takes on that row."""
    a.own_steps(ind, "keys_f[k, 1]", "keys_f[k, 2]", "hd", "keys_i[k]", "keys_f[k, 3]")


def _build_gpu(a: Emitter, d_flush: float, edges: bool) -> None:
    """``build_thread(c, k, i, P, keys_f, keys_i, keys_conc, conc, D)``: row i of key k's
    D, one thread per row."""
    S = a.scheme.n_states
    a("@DEVICE")
    a("def build_thread(c, k, i, P, keys_f, keys_i, keys_conc, conc, D):")
    ind = "    "
    const = _key_rates(a, ind, edges)
    for j in range(S):
        a(f"{ind}p{j} = F64(1.0) if i == {j} else F64(0.0)")
    if edges:
        a(f"{ind}if ck < 0:")
        a(f"{const}for it in range(keys_i[k]):")
        a.rk4_step(const + "    ", smooth=False)
        a(f"{ind}else:")
        _own_steps_of_key(a, const)
        body = a.coarse_step(const, "keys_i[k]", "ck", "hd")
        a.rk4_step(body, smooth=True)
        a(f"{body}fine += cstep")
    else:
        a(f"{ind}for it in range(keys_i[k]):")
        a.rk4_step(ind + "    ", smooth=False)
    for j in range(S):
        a(f"{ind}x = p{j} - (F64(1.0) if i == {j} else F64(0.0))")
        # entries this small change no result; zeroing them keeps CPU products normal (a
        # NaN or inf stays, for the row-end checks to fail its candidate)
        a(f"{ind}D[k, i, {j}, c] = F64(0.0) if abs(x) < {d_flush!r} else x")
    a(f"{ind}for j in range({S}, D.shape[2]):")
    a(f"{ind}    D[k, i, j, c] = 0.0")
    a("")


def _build_cpu(a: Emitter, d_flush: float, edges: bool) -> None:
    """``build_thread(c, slot, k, P, keys_f, keys_i, keys_conc, conc, D)``: the S rows of
    D = R(hQ)ⁿ − I of key k, stepped together: each step runs the S rows through one loop,
    which the compiler vectorizes (the rows share the step's rates, and ``X`` holds a
    state's S rows contiguously). Each row takes the same operations as when stepped alone.
    An edge key's three stage concentrations are read before the loop, so that the loop's
    rates are plain arithmetic."""
    S = a.scheme.n_states
    a("@DEVICE")
    a("def build_thread(c, slot, k, P, keys_f, keys_i, keys_conc, conc, D):")
    ind = "    "
    _key_rates(a, ind, edges)
    a(f"{ind}X = np.empty({S * S}, F64)")
    a(f"{ind}for i in range({S}):")
    for j in range(S):
        a(f"{ind}    X[{j * S} + i] = F64(1.0) if i == {j} else F64(0.0)")

    def steps(ind2: str, smooth: bool) -> None:
        if smooth:
            _own_steps_of_key(a, ind2)
            ind3 = a.coarse_step(ind2, "keys_i[k]", "ck", "hd")
            for q in range(3):
                a(f"{ind3}cs{q} = F64(conc[ci{q}])")
        else:
            a(f"{ind2}for it in range(keys_i[k]):")
            ind3 = ind2 + "    "
        a(f"{ind3}for i in range({S}):")
        ind4 = ind3 + "    "
        for j in range(S):
            a(f"{ind4}p{j} = X[{j * S} + i]")
        a.rk4_step(ind4, smooth=smooth, stage_conc=["cs0", "cs1", "cs2"] if smooth else None)
        for j in range(S):
            a(f"{ind4}X[{j * S} + i] = p{j}")
        if smooth:
            a(f"{ind3}fine += cstep")

    if edges:
        a(f"{ind}if ck < 0:")
        steps(ind + "    ", False)
        a(f"{ind}else:")
        steps(ind + "    ", True)
    else:
        steps(ind, False)
    a(f"{ind}for i in range({S}):")
    for j in range(S):
        a(f"{ind}    x = X[{j * S} + i] - (F64(1.0) if i == {j} else F64(0.0))")
        # entries this small change no result; zeroing them keeps CPU products normal (a
        # NaN or inf stays, for the row-end checks to fail its candidate)
        a(f"{ind}    D[slot, k, i, {j}] = F64(0.0) if abs(x) < {d_flush!r} else x")
    a(f"{ind}    for j in range({S}, D.shape[3]):")
    a(f"{ind}        D[slot, k, i, j] = 0.0")
    a("")


def builders(scheme: Scheme, target: str, d_flush: float, edge_rows: bool, span: int,
              fold: int, lanes: int) -> list[str]:
    """The lines of ``build_thread`` (and of ``span_thread`` with spans) for a kernel of
    ``target`` that carries its own builders.

    Examples
    --------
    >>> s = Scheme.load("models/jonas_1993.toml")
    >>> lines = builders(s, "cpu", 1e-150, True, 16, 0, 1)
    >>> [line.split("(")[0] for line in lines if line.startswith("def ")]
    ['def build_thread', 'def span_thread']
    """
    builder = Emitter(scheme, cast="F64")
    (_build_gpu if target == "cuda" else _build_cpu)(builder, d_flush, edge_rows)
    if span > 1 and target == "cpu":
        emit_span_build_cpu(builder, span, d_flush)
    elif span > 1:
        emit_span_build(builder, span, d_flush, fold_padded(fold, lanes) if fold else 0)
    return builder.lines


def generate_matrix_build(scheme: Scheme, *, d_flush: float = 1e-150, span: int = 1
                          ) -> GeneratedCode:
    """Python source of one of the CPU propagator form's matrix builders, shared by every
    kernel of a scheme that builds with the same ``d_flush`` (and ``span``).

    With ``span`` = 1, ``build_thread``: D = R(hQ)ⁿ − I for a key, at a constant
    concentration or, for an edge key, along its concentrations. With ``span`` >
    1, ``span_thread``: the span arrays of a key from D. Numba compiles (and caches) a
    function once per module, so a scheme's traces and objective kernels, with and without
    spans or a filter, compile each builder once between them (:func:`generate_propagator`
    with ``with_build=False`` calls them).

    Examples
    --------
    >>> from kingen.model.scheme import Scheme
    >>> s = Scheme.load("models/jonas_1993.toml")
    >>> "def build_thread(" in generate_matrix_build(s).source
    True
    >>> code = generate_matrix_build(s, span=16)
    >>> "def span_thread(" in code.source, "def build_thread(" in code.source
    (True, False)
    """
    a = Emitter(scheme, cast="F64")
    if span > 1:
        span_check(scheme.n_states, 1, span, "cpu")
        emit_span_build_cpu(a, span, d_flush)
    else:
        _build_cpu(a, d_flush, True)
    return finished(a)
