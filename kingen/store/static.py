"""What a new run file holds from its creation: the static groups (configuration, scheme,
protocols, data, targets, environment) and every dataset a run fills later, made empty,
since SWMR creates nothing once writing starts.
"""

from __future__ import annotations

import datetime as _dt
import platform
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np

from kingen.experiment.chain import Chain
from kingen.experiment.protocol import Protocol
from kingen.experiment.recordings import Recording, Targets
from kingen.model.scheme import Scheme
from kingen.store.datasets import (
    CHECKSUM,
    MAX_COLUMNS,
    MAX_STATE_DIMS,
    NAME_BYTES,
    REASON_BYTES,
    dumps,
    make_dataset,
    make_extendable,
    make_json_blob,
    make_text_dataset,
    member_key,
    write_json,
)
from kingen.store.encode import write_protocol, write_recording, write_scheme, write_targets
from kingen.store.integrity import mark_writer
from kingen.store.layout import LAYOUT_DOC, LAYOUT_VERSION, MARKER


def default_environment() -> dict[str, str]:
    """The versions a run file records: kingen, Python, the platform and the libraries."""
    import scipy

    from kingen._version import __version__

    env = {"kingen": __version__, "python": platform.python_version(),
           "platform": platform.platform(), "numpy": np.__version__,
           "scipy": scipy.__version__, "h5py": h5py.version.version,
           "hdf5": h5py.version.hdf5_version}
    for lib in ("numba", "deap"):
        try:
            env[lib] = __import__(lib).__version__
        except Exception:  # noqa: BLE001 - an optional library: record what can be found
            pass
    return env


def now_utc() -> str:
    """Now, in ISO 8601 to the second (UTC)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")



def write_static(f: h5py.File, *, config_text: str, config: dict[str, Any], scheme: Scheme,
                 protocols: list[Protocol], recordings: Mapping[str, Recording | None],
                 targets: Mapping[str, Targets | None], free_mask: np.ndarray,
                 population_size: int, environment: Mapping[str, str],
                 state_fields: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
                 chains: Mapping[str, Chain]) -> None:
    """Write a new run file's static groups, and every dataset it fills later, empty."""
    f.attrs["kingen_run"] = MARKER
    f.attrs["layout_version"] = LAYOUT_VERSION
    f.attrs["kingen_version"] = environment.get("kingen", "")
    f.attrs["created"] = now_utc()
    f.attrs["layout"] = LAYOUT_DOC
    f.attrs["description"] = (
        "kingen fit of a kinetic scheme; layout: see its 'layout' attribute and the kingen "
        "documentation, 'The run file'")

    cfg = f.create_group("config")
    make_text_dataset(cfg, "text", config_text)
    make_text_dataset(cfg, "settings", dumps(config))
    cfg["text"].attrs["description"] = "the configuration file as given (TOML)"
    cfg["settings"].attrs["description"] = "the settings the configuration resolved to (JSON)"

    write_scheme(f.create_group("scheme"), scheme)

    pg = f.create_group("protocols")
    pg.attrs["names"] = dumps([p.name for p in protocols])
    for p in protocols:
        g = pg.create_group(member_key(p.name))
        write_protocol(g, p)
        chain = chains.get(p.name)
        if chain is not None and not chain.plain:
            g.attrs["chain"] = dumps(chain.to_dict())

    dg = f.create_group("data")
    for name, rec in recordings.items():
        if rec is not None:
            write_recording(dg.create_group(member_key(name)), name, rec)
    tg = f.create_group("targets")
    for name, tar in targets.items():
        if tar is not None:
            write_targets(tg.create_group(member_key(name)), name, tar)

    env = f.create_group("environment")
    for k, v in environment.items():
        env.attrs[str(k)] = str(v)

    n_par, n_prot = scheme.n_params, len(protocols)
    pnames = dumps(scheme.param_names)
    gen = f.create_group("generations")
    gen.attrs["population_size"] = population_size
    gen.attrs["fitness"] = "total weighted error; lower is better; failed candidates worst"
    make_dataset(gen, "free_mask", free_mask)
    gen["free_mask"].attrs["columns"] = pnames
    rows = population_size
    d = make_extendable(gen, "population", (0, rows, n_par), np.float64, np.nan,
                        unit="internal: ms^-1 (order 1) or mM^-1 ms^-1 (order 2); "
                         "see /scheme/parameters", doc="parameters of every candidate",
                        chunk_rows=1, compress=False)
    d.attrs["columns"] = pnames
    d = make_extendable(gen, "errors", (0, rows, n_prot), np.float64, np.nan, unit="1",
                        doc="error of every candidate under each protocol", chunk_rows=1,
                        compress=False)
    d.attrs["columns"] = dumps([p.name for p in protocols])
    make_extendable(gen, "fitness", (0, rows), np.float64, np.nan, unit="1",
                    doc="total weighted error (lower is better)", chunk_rows=1, compress=False)
    make_extendable(gen, "fail", (0, rows), np.int32, -1,
                    doc="failure code (0: simulated fine; -1: padding)", chunk_rows=1)
    make_extendable(gen, "generation", (0,), np.int64, -1, doc="generation number")
    make_extendable(gen, "size", (0,), np.int64, 0, doc="candidates in the generation")
    for name, unit in (("stats", "1"), ("timings", "s")):
        make_extendable(gen, name, (0, MAX_COLUMNS), np.float64, np.nan, unit=unit,
                        doc=f"one column per key; names in {name}_names")
        make_dataset(gen, f"{name}_names", np.zeros(MAX_COLUMNS, dtype=f"S{NAME_BYTES}"))

    hof = f.create_group("hall_of_fame")
    make_extendable(hof, "params", (0, n_par), np.float64, np.nan, unit="internal",
                    doc="best candidates ever seen, best first")
    hof["params"].attrs["columns"] = pnames
    make_extendable(hof, "fitness", (0,), np.float64, np.nan, unit="1")
    make_dataset(hof, "size", np.int64(0))
    hof["size"].attrs["description"] = "rows of params/fitness that are valid (written last)"

    best = f.create_group("best")
    make_dataset(best, "valid", np.int8(0))
    make_dataset(best, "generation", np.int64(-1))
    make_dataset(best, "params", np.full(n_par, np.nan))
    best["params"].attrs["columns"] = pnames
    best["params"].attrs["unit"] = "internal"
    make_dataset(best, "fitness", np.float64(np.nan))
    make_dataset(best, "errors", np.full(n_prot, np.nan))
    best["errors"].attrs["columns"] = dumps([p.name for p in protocols])
    make_dataset(best, "amplitudes", np.full(n_prot, np.nan))
    best["amplitudes"].attrs["columns"] = dumps([p.name for p in protocols])
    best["amplitudes"].attrs["description"] = ("number of channels fitted per protocol: the "
                                               "fitted current is amplitude x the scheme's "
                                               "one-channel current; NaN: none applies")
    make_json_blob(best, "features", "features per protocol: {protocol: {fit: {}, data: {}}}")
    make_json_blob(best, "polish", "local polish: error before and after, or null")
    make_json_blob(best, "traces_info", "sweep labels, has_data and n_sweeps per protocol")
    tr = best.create_group("traces")
    for p in protocols:
        g = tr.create_group(member_key(p.name))
        g.attrs["name"] = p.name
        filtered = chains.get(p.name) is not None and chains[p.name].filter is not None
        # the unfiltered model beside the fit, for a protocol whose chain has a filter
        for name, unit in (("time_ms", "ms"), ("fit_pA", "pA"), ("data_pA", "pA")) + (
                (("model_pA", "pA"),) if filtered else ()):
            make_extendable(g, name, (0, 0), np.float64, np.nan, unit=unit, chunk_rows=1,
                            doc="one row per sweep, NaN padded to the longest")
        make_extendable(g, "n_samples", (0,), np.int64, 0, doc="samples in each sweep's row")

    res = f.create_group("resume")
    res.attrs["description"] = ("resume state of the last committed generation, in the slot "
                                "/run/commit[1] names: plain arrays (population, hall of "
                                "fame, CMA-ES strategy, random generators' states)")
    for slot in (0, 1):
        g = res.create_group(f"slot_{slot}")
        g.attrs["fields"] = dumps(list(state_fields))
        for name, (dtype, shape) in state_fields.items():
            chunks = [max(1, n) for n in shape] or [1]
            while int(np.prod(chunks)) * dtype.itemsize > 1 << 20:
                chunks[chunks.index(max(chunks))] //= 2
            ds = g.create_dataset(name, shape=(0,) * len(chunks),
                                  maxshape=(None,) * len(chunks), dtype=dtype,
                                  chunks=tuple(chunks), fillvalue=0, **CHECKSUM)
            ds.attrs["ndim"] = len(shape)
        shapes = np.zeros((max(len(state_fields), 1), MAX_STATE_DIMS), dtype=np.int64)
        make_dataset(g, "shapes", shapes)
        g["shapes"].attrs["description"] = "each field's shape, in the order of attribute fields"
    make_dataset(res, "generation", np.full(2, -1, dtype=np.int64))
    make_dataset(res, "crc32", np.zeros(2, dtype=np.int64))
    res["crc32"].attrs["description"] = "CRC-32 of each slot's fields and shapes, written last"

    from kingen.store.profiles import create_group

    create_group(f)

    run = f.create_group("run")
    make_dataset(run, "commit", np.array([0, 0, -1], dtype=np.int64))
    run["commit"].attrs["description"] = ("[generations committed, resume slot, last "
                                          "generation number]; written last")
    make_dataset(run, "finished", np.array(b"", dtype=f"S{REASON_BYTES}"))
    make_dataset(run, "finished_unix", np.float64(np.nan))
    run["finished_unix"].attrs["unit"] = "s since 1970-01-01 UTC"
    run.attrs["resumed"] = "[]"
    lost_workers_blob(run)
    mark_writer(run)


def lost_workers_blob(run: h5py.Group) -> None:
    """The empty ``/run/lost_workers`` list (files from before it lack it)."""
    make_json_blob(run, "lost_workers", "shards a lost Dask worker held, run again elsewhere "
                                    "(JSON list)")
    write_json(run["lost_workers"], [])
