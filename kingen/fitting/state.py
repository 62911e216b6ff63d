"""The resume state: what a run file keeps of the search after every generation.

Plain arrays only (never a pickle): the population and its scores, the hall of fame,
CMA-ES's strategy, and the states of the three random generators the search draws from
(Python's ``random``, numpy's global generator that DEAP's CMA-ES uses, and the fit's own
PCG64). :func:`state_fields` declares them (the run file is created with these datasets),
:func:`encode` turns the search's state into them, :func:`checked_state` checks a file's
arrays before any is used and :func:`cma_strategy` rebuilds the CMA-ES strategy.

Examples
--------
>>> from kingen.fitting.config import demo_config, load_config
>>> cfg = load_config(demo_config(), overrides={"output": "unused.h5"})
>>> fields = state_fields(cfg, n_protocols=4)
>>> fields["genes"][0], fields["genes"][1] == (cfg.ga.population, cfg.pmap.n_genes)
('f8', True)
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.fitting.config import FitConfig

STATE_VERSION = 2  # 2: plain arrays in the run file (1 was a pickle)

# The resume state's scalars, and the attributes of DEAP's cma.Strategy that change as it
# runs (the rest are constants DEAP computes from λ, μ and the dimension).
_STATE_INTS = ("version", "generation", "since_improvement", "evaluations")
_STATE_FLOATS = ("best", "reference", "elapsed")
_CMA_VECTORS = ("centroid", "pc", "ps", "diagD")
_CMA_MATRICES = ("C", "B", "BD")
_CMA_FLOATS = ("sigma", "cond")
_CMA_INTS = ("update_count", "lambda_", "mu")
_U64 = (1 << 64) - 1


def state_fields(cfg: FitConfig, n_protocols: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The resume state's arrays, name -> (dtype, typical shape), as the run file keeps them.

    Plain numbers only: the population, the hall of fame, the CMA-ES strategy, the random
    generators' states (see the README, "The run file").
    """
    ga = cfg.ga
    n, r, k = cfg.pmap.n_genes, n_protocols, ga.hall_of_fame
    mu = ga.lambda_ if ga.algorithm == "cmaes" else ga.population
    fields = {name: ("i8", ()) for name in _STATE_INTS}
    fields.update({name: ("f8", ()) for name in _STATE_FLOATS})
    fields.update({
        "genes": ("f8", (mu, n)), "fitness": ("f8", (mu,)), "errors": ("f8", (mu, r)),
        "fail": ("i8", (mu,)), "hof_genes": ("f8", (k, n)), "hof_fitness": ("f8", (k,)),
        # Python's random: (version, 624 Mersenne Twister words and the position,
        # the cached Gaussian or None)
        "python_random": ("i8", (625,)), "python_random_version": ("i8", ()),
        "python_random_has_gauss": ("i8", ()), "python_random_gauss": ("f8", ()),
        # numpy's global (legacy) generator, which DEAP's CMA-ES draws from
        "np_global_key": ("u4", (624,)), "np_global_pos": ("i8", ()),
        "np_global_has_gauss": ("i8", ()), "np_global_gauss": ("f8", ()),
        # the fit's PCG64: 128-bit state and increment as (high, low) 64-bit words
        "rng_pcg64": ("u8", (4,)), "rng_has_uint32": ("i8", ()),
        "rng_uinteger": ("u8", ()),
    })
    if ga.algorithm == "cmaes":
        fields.update({f"cma_{a}": ("f8", (n,)) for a in _CMA_VECTORS})
        fields.update({f"cma_{a}": ("f8", (n, n)) for a in _CMA_MATRICES})
        fields.update({f"cma_{a}": ("f8", ()) for a in _CMA_FLOATS})
        fields.update({f"cma_{a}": ("i8", ()) for a in _CMA_INTS})
    return fields


def checked_state(arrays: dict[str, np.ndarray], cfg: FitConfig, n_protocols: int,
                  path: str) -> tuple[dict[str, Any], tuple, tuple, dict[str, Any]]:
    """Check a run file's resume arrays before any is used; nothing in them is executed.

    Every array must have the type and shape this configuration implies; the random
    generators' states are tried on throw-away generators.

    Returns
    -------
    state, python_random, np_global, pcg64
        The search state's scalars and arrays, and the three generators' states in the form
        ``random.setstate``, ``np.random.set_state`` and ``PCG64.state`` take.

    Raises
    ------
    KingenError
        Naming the array that is missing or malformed.
    """
    want = state_fields(cfg, n_protocols)
    k = cfg.ga.hall_of_fame
    for name, (dtype, shape) in want.items():
        if name not in arrays:
            raise KingenError("malformed resume state: missing", file=path,
                              field=f"/resume/{name}")
        arr = arrays[name]
        ok_shape = arr.shape == shape or (name.startswith("hof_") and arr.ndim == len(
            shape) and arr.shape[0] <= k and arr.shape[1:] == shape[1:])
        if np.dtype(arr.dtype) != np.dtype(dtype) or not ok_shape:
            raise KingenError(f"malformed resume state: {arr.dtype} of shape {arr.shape} "
                              f"where this run needs {np.dtype(dtype)} of shape {shape}",
                              file=path, field=f"/resume/{name}")
    extra = sorted(set(arrays) - set(want))
    if extra:
        raise KingenError("malformed resume state: fields this run does not have",
                          file=path, field="/resume", value=extra)
    if int(arrays["version"]) != STATE_VERSION:
        raise KingenError("resume state of another kingen version; cannot resume",
                          file=path, field="/resume/version", value=int(arrays["version"]))
    s: dict[str, Any] = {name: int(arrays[name]) for name in _STATE_INTS}
    s.update({name: float(arrays[name]) for name in _STATE_FLOATS})
    if not math.isfinite(s["reference"]):
        del s["reference"]  # never set: no finite best yet
    for name in ("genes", "fitness", "errors", "fail", "hof_genes", "hof_fitness"):
        s[name] = np.array(arrays[name])
    gauss = (float(arrays["python_random_gauss"])
             if int(arrays["python_random_has_gauss"]) else None)
    python_state = (int(arrays["python_random_version"]),
                    tuple(int(v) for v in arrays["python_random"]), gauss)
    np_state = ("MT19937", np.array(arrays["np_global_key"]), int(arrays["np_global_pos"]),
                int(arrays["np_global_has_gauss"]), float(arrays["np_global_gauss"]))
    pcg = [int(v) for v in arrays["rng_pcg64"]]
    pcg_state = {"bit_generator": "PCG64",
                 "state": {"state": pcg[0] << 64 | pcg[1], "inc": pcg[2] << 64 | pcg[3]},
                 "has_uint32": int(arrays["rng_has_uint32"]),
                 "uinteger": int(arrays["rng_uinteger"])}
    try:
        random.Random().setstate(python_state)
        np.random.RandomState().set_state(np_state)
        np.random.PCG64().state = pcg_state
    except (ValueError, TypeError, OverflowError) as exc:
        raise KingenError(f"malformed resume state: a random generator's state is invalid "
                          f"({' '.join(str(exc).split())})", file=path, field="/resume"
                          ) from None
    return s, python_state, np_state, pcg_state


def encode(state: dict[str, Any], rng: np.random.Generator | dict[str, Any],
           evaluations: int, python_random: random.Random | None = None
           ) -> dict[str, np.ndarray]:
    """The resume state as of now, as the plain arrays of :func:`state_fields`.

    ``rng`` is the engine's generator, or the state of its bit generator to record.
    ``python_random`` is the generator DEAP's operators draw from (the module's own by
    default).

    The random generators' states are copied now. The population arrays are shared with
    ``state`` (a generation replaces them and never writes into them); CMA-ES's strategy is
    updated in place, so its arrays are copied.
    """
    out: dict[str, Any] = {name: np.int64(state.get(name, 0)) for name in _STATE_INTS}
    out["version"] = np.int64(STATE_VERSION)
    out["evaluations"] = np.int64(evaluations)
    out.update({name: np.float64(state.get(name, math.inf)) for name in _STATE_FLOATS})
    for name in ("genes", "fitness", "errors", "fail", "hof_genes", "hof_fitness"):
        out[name] = state[name]
    version, words, gauss = (python_random or random).getstate()
    out["python_random"] = np.array(words, dtype=np.int64)
    out["python_random_version"] = np.int64(version)
    out["python_random_has_gauss"] = np.int64(gauss is not None)
    out["python_random_gauss"] = np.float64(0.0 if gauss is None else gauss)
    _, key, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002
    out.update(np_global_key=np.array(key, dtype=np.uint32), np_global_pos=np.int64(pos),
               np_global_has_gauss=np.int64(has_gauss), np_global_gauss=np.float64(cached))
    st = rng if isinstance(rng, dict) else rng.bit_generator.state
    words128 = [st["state"]["state"], st["state"]["inc"]]
    out["rng_pcg64"] = np.array([w >> s & _U64 for w in words128 for s in (64, 0)],
                                dtype=np.uint64)
    out["rng_has_uint32"] = np.int64(st["has_uint32"])
    out["rng_uinteger"] = np.uint64(st["uinteger"])
    if "cma" in state:
        cma = state["cma"]
        for a in _CMA_VECTORS + _CMA_MATRICES + _CMA_FLOATS:
            out[f"cma_{a}"] = np.array(getattr(cma, a), dtype=np.float64)
        for a in _CMA_INTS:
            out[f"cma_{a}"] = np.int64(getattr(cma, a))
    return out


def cma_strategy(arrays: dict[str, np.ndarray]) -> Any:
    """A CMA-ES strategy with the stored state (its constants are recomputed by DEAP from
    λ, μ and the dimension, exactly as the run computed them)."""
    from deap import cma

    strategy = cma.Strategy(centroid=list(arrays["cma_centroid"]),
                            sigma=float(arrays["cma_sigma"]),
                            lambda_=int(arrays["cma_lambda_"]), mu=int(arrays["cma_mu"]))
    for a in _CMA_VECTORS + _CMA_MATRICES:
        setattr(strategy, a, np.array(arrays[f"cma_{a}"]))
    for a in _CMA_FLOATS:
        setattr(strategy, a, np.float64(arrays[f"cma_{a}"]))
    strategy.update_count = int(arrays["cma_update_count"])
    return strategy
