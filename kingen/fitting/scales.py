"""Amplitudes and offsets of a recorded protocol, in closed form from the kernel's sums.

A protocol's recording chain (:class:`~kingen.experiment.chain.Chain`) passes g through the
recording's filter inside the kernel, before every sum and window, and may fit the
amplitude per sweep or with a linear rundown, and an offset per sweep or per protocol:
A_k·g + c_k, solved jointly in closed form from the kernel's Σw·g², Σw·g·d and Σw·g
(:func:`solve_scales`); e_trace is then Σ w (A_k g + c_k − d)² / Σ w d².

The plain case (one amplitude per protocol, no offset) is compiled, with the rest of each
candidate's scoring (:func:`score_rows`): it runs on every candidate of every generation.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from kingen.fitting.params import PARALLEL_FROM_ROWS, serial_and_parallel


def _score_rows(sgg: np.ndarray, sgd: np.ndarray, fail: np.ndarray, spans: np.ndarray,
                dd: np.ndarray, plain: np.ndarray, fixed: np.ndarray, coef: np.ndarray,
                weight: np.ndarray, nonfinite: int, traces: bool, finish: bool,
                errors: np.ndarray, amps: np.ndarray, chi2_p: np.ndarray,
                fitness: np.ndarray, fcode: np.ndarray, chi2: np.ndarray) -> None:
    """Rows of :meth:`~kingen.fitting.objective.Objective.reduce`, each in one pass.

    ``traces``: each ``plain`` protocol's trace error and amplitude (0 and NaN for the
    others) and, with a noise model (``chi2`` of N rows), its χ²_p = error · dd · coef (0 for
    the others). A protocol's sums over its sweeps (in sweep order), its amplitude
    (``fixed[p]`` unless NaN, else least squares clamped at 0) and e_trace as in the module
    docstring, with numpy's arithmetic. ``finish``:
    the fitness Σ_p weight_p · term_p in protocol order (the terms χ²_p with a noise model,
    else the errors), the first failure code by sweep (``nonfinite`` for a non-finite
    fitness without one), χ² (+inf where failed or not finite), and for a failed row
    fitness and errors +inf.
    """
    noise = chi2.shape[0] > 0
    for i in numba.prange(sgg.shape[0]):
        if traces:
            for p in range(spans.shape[0]):
                errors[i, p] = 0.0
                amps[i, p] = np.nan
                if noise:
                    chi2_p[i, p] = 0.0
                if not plain[p]:
                    continue
                s_gg, s_gd = sgg[i, spans[p, 0]], sgd[i, spans[p, 0]]
                for k in range(spans[p, 0] + 1, spans[p, 1]):
                    s_gg += sgg[i, k]
                    s_gd += sgd[i, k]
                if fixed[p] == fixed[p]:
                    amp = fixed[p]
                else:
                    amp = s_gd / s_gg if s_gg > 0 else 0.0
                    amp = amp if amp >= 0.0 or amp != amp else 0.0  # np.maximum(amp, 0.0)
                sse = dd[p] - 2.0 * amp * s_gd + amp * amp * s_gg
                e = 0.0 + (sse if sse >= 0.0 or sse != sse else 0.0) / dd[p]
                errors[i, p] = e
                amps[i, p] = amp
                if noise:
                    chi2_p[i, p] = e * dd[p] * coef[p]
        if finish:
            f = 0.0
            for p in range(weight.size):
                f += weight[p] * (chi2_p[i, p] if noise else errors[i, p])
            code = 0
            for k in range(fail.shape[1]):  # a branch-free scan first: most rows pass
                code |= fail[i, k]
            if code != 0:
                for k in range(fail.shape[1]):
                    if fail[i, k] != 0:
                        code = fail[i, k]
                        break
            if code == 0 and not math.isfinite(f):
                code = nonfinite
            fcode[i] = code
            if noise:
                c = 0.0
                for p in range(weight.size):
                    c += chi2_p[i, p]
                chi2[i] = c if code == 0 and math.isfinite(c) else np.inf
            if code != 0:
                f = np.inf
                for p in range(errors.shape[1]):
                    errors[i, p] = np.inf
            fitness[i] = f


# Every candidate of every generation passes through it: at 65,536 the numpy arrays of the
# reduction (N x protocols temporaries, a dozen passes) cost several ms; from
# PARALLEL_FROM_ROWS rows the rows go to numba's threads, each computed alone, so the
# result is the same however they are shared out.
_score_serial, _score_parallel = serial_and_parallel(
    _score_rows, cache=True, nogil=True, error_model="numpy")


def score_rows(sgg: np.ndarray, sgd: np.ndarray, fail: np.ndarray, spans: np.ndarray,
               dd: np.ndarray, plain: np.ndarray, fixed: np.ndarray, coef: np.ndarray,
               weight: np.ndarray, nonfinite: int, traces: bool, finish: bool,
               errors: np.ndarray, amps: np.ndarray, chi2_p: np.ndarray, fitness: np.ndarray,
               fcode: np.ndarray, chi2: np.ndarray) -> None:
    """:func:`_score_rows` on the calling thread, or from
    :data:`~kingen.fitting.params.PARALLEL_FROM_ROWS` rows on numba's threads."""
    kernel = _score_parallel if sgg.shape[0] >= PARALLEL_FROM_ROWS else _score_serial
    kernel(sgg, sgd, fail, spans, dd, plain, fixed, coef, weight, nonfinite, traces, finish,
           errors, amps, chi2_p, fitness, fcode, chi2)


def solve_scales(sgg: np.ndarray, sgd: np.ndarray, sg: np.ndarray | None, sd: np.ndarray,
                 sw: np.ndarray, sdd: np.ndarray, *, amplitude: str = "per-protocol",
                 offset: str = "none", fixed: float | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Amplitudes and offsets of one protocol's K sweeps by linear least squares, in closed
    form from per-sweep sums, for N candidates at once.

    The model of sweep k is a_k·g + c_k (g the one-channel current, through the
    recording's filter), fitted to the data d with weights w; ``sgg``, ``sgd``, ``sg``
    (N, K) are Σw·g², Σw·g·d, Σw·g from the kernel, ``sd``, ``sw``, ``sdd`` (K,) the data's
    Σw·d, Σw, Σw·d². ``amplitude``: one a for all sweeps (``per-protocol``), one per sweep
    (``per-sweep``) or a_k = A·(1 + ρ·k) (``rundown``, linear in A and A·ρ); ``fixed``
    holds it at a value. ``offset``: c_k = 0 (``none``), one c for all sweeps
    (``per-protocol``) or one per sweep (``per-sweep``). A per-sweep offset is eliminated
    sweep by sweep (the sums are centred on the sweep's weighted mean); a per-protocol one
    is solved jointly with the amplitude (a 2×2 or 3×3 system, or for per-sweep
    amplitudes a scalar equation). An amplitude below 0 is clamped to 0 (the offsets then
    refitted), as for one amplitude per protocol.

    Returns
    -------
    sse, amplitudes, offsets
        (N,) Σw·(a_k·g + c_k − d)² over the sweeps (≥ 0); (N, K) a_k; (N, K) c_k.

    Examples
    --------
    Two sweeps whose data are 3·g + 5 and 2·g − 1 (g = 1, 2, 3 on each):

    >>> g = np.array([1.0, 2.0, 3.0])
    >>> sums = lambda d: ((g * g).sum(), (g * d).sum(), g.sum(), d.sum(), 3.0, (d * d).sum())
    >>> s0, s1 = sums(3 * g + 5), sums(2 * g - 1)
    >>> cols = [np.array([[a, b]]) if i < 3 else np.array([a, b]) for i, (a, b)
    ...         in enumerate(zip(s0, s1))]
    >>> sse, a, c = solve_scales(*cols, amplitude="per-sweep", offset="per-sweep")
    >>> np.round(a, 9).tolist(), np.round(c, 9).tolist(), round(float(sse[0]), 9)
    ([[3.0, 2.0]], [[5.0, -1.0]], 0.0)
    """
    G = np.asarray(sgg, dtype=np.float64)
    X = np.asarray(sgd, dtype=np.float64)
    n, K = G.shape
    S = np.zeros_like(G) if sg is None else np.asarray(sg, dtype=np.float64)
    D, W, Y = (np.asarray(v, dtype=np.float64)[None, :] for v in (sd, sw, sdd))
    k = np.arange(K, dtype=np.float64)[None, :]
    with np.errstate(all="ignore"):
        if offset == "per-protocol":
            amp, off = _with_protocol_offset(G, X, S, D, W, k, amplitude, fixed)
        else:
            has = W > 0
            inv_w = np.where(has, 1.0 / np.where(has, W, 1.0), 0.0)
            if offset == "per-sweep":
                # c_k = (Σw·d − a_k Σw·g) / Σw: what is left for a_k is the centred sums
                Gc, Xc = G - S * S * inv_w, X - S * D * inv_w
            else:
                Gc, Xc = G, X
            amp = _amplitudes(Gc, Xc, k, amplitude, fixed)
            off = (D - amp * S) * inv_w if offset == "per-sweep" else np.zeros_like(G)
        sse = (Y - 2.0 * amp * X - 2.0 * off * D + amp * amp * G + 2.0 * amp * off * S
               + off * off * W).sum(axis=1)
    return np.where(sse >= 0.0, sse, np.where(np.isnan(sse), sse, 0.0)), amp, off


def _amplitudes(G: np.ndarray, X: np.ndarray, k: np.ndarray, mode: str,
                fixed: float | None) -> np.ndarray:
    """a_k minimising Σ_k (a_k² G_k − 2 a_k X_k) for the amplitude ``mode`` (see
    :func:`solve_scales`), clamped ≥ 0."""
    if fixed is not None:
        return np.full(G.shape, float(fixed))
    if mode == "per-sweep":
        return np.maximum(np.where(G > 0, X / np.where(G > 0, G, 1.0), 0.0), 0.0)
    m0, r0 = G.sum(axis=1), X.sum(axis=1)
    a = np.maximum(np.where(m0 > 0, r0 / np.where(m0 > 0, m0, 1.0), 0.0), 0.0)
    if mode != "rundown":
        return np.repeat(a[:, None], G.shape[1], axis=1)
    m1, m2, r1 = (k * G).sum(axis=1), (k * k * G).sum(axis=1), (k * X).sum(axis=1)
    det = m0 * m2 - m1 * m1
    # one sweep (or one with data) determines no slope: then a_k = a, the plain amplitude
    ok = det > 1e-12 * m0 * m2
    safe = np.where(ok, det, 1.0)
    A = np.where(ok, (r0 * m2 - r1 * m1) / safe, a)
    B = np.where(ok, (m0 * r1 - m1 * r0) / safe, 0.0)
    neg = ~(A >= 0.0)
    A, B = np.where(neg, 0.0, A), np.where(neg, 0.0, B)
    return A[:, None] + B[:, None] * k


def _with_protocol_offset(G: np.ndarray, X: np.ndarray, S: np.ndarray, D: np.ndarray,
                          W: np.ndarray, k: np.ndarray, mode: str, fixed: float | None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Amplitudes and the one offset of a protocol, solved jointly (:func:`solve_scales`)."""
    n, K = G.shape
    sw, sd = float(W.sum()), float(D.sum())
    c_alone = sd / sw if sw > 0 else 0.0
    if fixed is not None:
        amp = np.full(G.shape, float(fixed))
    elif mode == "per-sweep":
        # a_k = (X_k − c S_k) / G_k, then c from Σ_k: c (Σw − Σ S²/G) = Σw·d − Σ S X / G
        inv_g = np.where(G > 0, 1.0 / np.where(G > 0, G, 1.0), 0.0)
        den = sw - (S * S * inv_g).sum(axis=1)
        c = np.where(den > 0, (sd - (S * X * inv_g).sum(axis=1)) / np.where(den > 0, den,
                                                                          1.0), c_alone)
        amp = np.maximum((X - c[:, None] * S) * inv_g, 0.0)
    else:
        basis = [np.ones_like(k)] + ([k] if mode == "rundown" and K > 1 else [])
        m = len(basis) + 1
        M = np.empty((n, m, m))
        r = np.empty((n, m))
        for i, bi in enumerate(basis):
            for j, bj in enumerate(basis):
                M[:, i, j] = (bi * bj * G).sum(axis=1)
            M[:, i, -1] = M[:, -1, i] = (bi * S).sum(axis=1)
            r[:, i] = (bi * X).sum(axis=1)
        M[:, -1, -1] = sw
        r[:, -1] = sd
        det = np.linalg.det(M)
        ok = np.isfinite(det) & (np.abs(det) > 1e-12 * np.abs(np.prod(
            np.diagonal(M, axis1=1, axis2=2), axis=1)))
        theta = np.zeros((n, m))
        if ok.any():
            theta[ok] = np.linalg.solve(M[ok], r[ok][..., None])[..., 0]
        theta[~ok] = 0.0
        theta[~(theta[:, 0] >= 0.0)] = 0.0  # a negative (or undefined) amplitude: none
        amp = sum(theta[:, [i]] * b for i, b in enumerate(basis))
        amp = np.broadcast_to(amp, G.shape).copy()
    # the offset that goes with these amplitudes (after any clamp)
    c = (sd - (amp * S).sum(axis=1)) / sw if sw > 0 else np.zeros(n)
    return amp, np.repeat(c[:, None], K, axis=1)
