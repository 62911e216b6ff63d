"""Writing a run file as the fit goes: one generation at a time, each committed last, the
hall of fame, the best candidate with its traces, lost workers and why the run stopped.
"""

from __future__ import annotations

import datetime as _dt
import os
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.store.consistency import state_names
from kingen.store.datasets import (
    MAX_COLUMNS,
    MAX_STATE_DIMS,
    NAME_BYTES,
    REASON_BYTES,
    as_text,
    grow,
    load,
    member_key,
    padded,
    read_json,
    write_json,
)
from kingen.store.reading import RunReader
from kingen.store.space import disk_full, need_space


class RunWriter(RunReader):
    """The writing half of :class:`~kingen.store.runstore.RunStore` (its base class)."""

    _replaces: Path | None

    # ------------------------------------------------------------------ writing
    def _need_writer(self) -> None:
        if self.mode != "w" or not self._f.id.valid:
            raise KingenError("run file is open for reading, not writing", file=str(self.path))

    def _need_space(self, *arrays: Any) -> None:
        """Refuse a generation the disk cannot hold, before HDF5 starts writing it: twice
        the arrays' size (compression only shrinks them) and 1 MiB for the file's own
        records (see :func:`~kingen.store.space.need_space`)."""
        need_space(self.path, 2 * sum(np.asarray(a).nbytes for a in arrays) + (1 << 20),
                   " the run file keeps every committed generation; free some space and "
                   f"go on with kingen resume {self.path}")

    def append_generation(self, *, generation: int, population: np.ndarray, errors: np.ndarray,
                          fitness: np.ndarray, fail: np.ndarray, stats: Mapping[str, float],
                          timings: Mapping[str, float],
                          state: Mapping[str, np.ndarray] | None = None) -> None:
        """Append one generation and its resume state, flush, then commit it.

        Parameters
        ----------
        generation
            The generation's number (as the fit counts).
        population
            (N, n_params) parameters, internal units.
        errors
            (N, n_protocols) error of each candidate under each protocol.
        fitness
            (N,) total weighted error (lower is better).
        fail
            (N,) failure code per candidate (0: simulated fine).
        stats, timings
            Scalars for this generation; each key is a column (up to 32 of each).
        state
            The resume state: the arrays declared as ``state_fields`` at :meth:`create`,
            by name (all of them); only the last committed one is kept.
        """
        self._need_writer()
        self._need_space(population, errors, fitness, fail, *(state or {}).values())
        try:
            self._append(generation, population, errors, fitness, fail, stats, timings, state)
        except OSError as exc:
            full = disk_full(exc)
            if full is None:
                raise
            # the disk filled between the check above and HDF5's write (another process
            # wrote to it), or a quota the check cannot see: h5py's own text runs to a
            # paragraph of buffer addresses
            raise KingenError(f"the disk holding the run file filled up while generation "
                              f"{int(generation)} was written (HDF5: {full}): free some space "
                              f"and go on with kingen resume {self.path}, which checks the "
                              "file first", file=str(self.path)) from None

    def _append(self, generation: int, population: np.ndarray, errors: np.ndarray,
                fitness: np.ndarray, fail: np.ndarray, stats: Mapping[str, float],
                timings: Mapping[str, float], state: Mapping[str, np.ndarray] | None) -> None:
        f = self._f
        pop = np.asarray(population, dtype=np.float64)
        n = pop.shape[0]
        n_par, n_prot = len(self._param_names), len(self._protocol_names)
        err = np.asarray(errors, dtype=np.float64).reshape(n, n_prot)
        fit = np.asarray(fitness, dtype=np.float64).reshape(n)
        fl = np.asarray(fail).astype(np.int32).reshape(n)
        if pop.shape != (n, n_par):
            raise ValueError(f"population of shape {pop.shape}, expected (N, {n_par})")
        row, slot, _ = (int(v) for v in self._commit())
        gen = f["generations"]
        width = max(n, gen["population"].shape[1])
        for name, extra in (("population", (n_par,)), ("errors", (n_prot,)),
                            ("fitness", ()), ("fail", ())):
            grow(gen[name], (row + 1, width) + extra)
        for name in ("generation", "size", "stats", "timings"):
            grow(gen[name], (row + 1,) + gen[name].shape[1:])
        # Full padded rows: a row left half-written by a killed run is overwritten whole.
        pad_pop = np.full((width, n_par), np.nan)
        pad_pop[:n] = pop
        pad_err = np.full((width, n_prot), np.nan)
        pad_err[:n] = err
        pad_fit = np.full(width, np.nan)
        pad_fit[:n] = fit
        pad_fail = np.full(width, -1, dtype=np.int32)
        pad_fail[:n] = fl
        gen["population"][row] = pad_pop
        gen["errors"][row] = pad_err
        gen["fitness"][row] = pad_fit
        gen["fail"][row] = pad_fail
        gen["generation"][row] = int(generation)
        gen["size"][row] = n
        gen["stats"][row] = self._columns("generations/stats", stats)
        gen["timings"][row] = self._columns("generations/timings", timings)
        new_slot = 0 if row == 0 else 1 - slot
        self._write_state(new_slot, int(generation), state or {})
        f.flush()
        # The commit is the last write: readers (and resume) trust only what it names.
        f["run/commit"][...] = np.array([row + 1, new_slot, int(generation)], dtype=np.int64)
        f.flush()
        if self._replaces is not None:  # the first commit: now it may take the old run's place
            os.replace(self.path, self._replaces)
            self.path, self._replaces = self._replaces, None

    def _columns(self, name: str, values: Mapping[str, float]) -> np.ndarray:
        names_ds = self._f[f"{name}_names"]
        names = [as_text(v) for v in load(names_ds)]
        row = np.full(MAX_COLUMNS, np.nan)
        for key, value in values.items():
            key_b = str(key).encode("utf-8")[:NAME_BYTES]
            label = key_b.decode("utf-8", "ignore")
            if label not in names:
                free = names.index("") if "" in names else -1
                if free < 0:
                    continue  # table full: keep the first 32 columns rather than fail a run
                names[free] = label
                names_ds[free] = key_b
            try:
                row[names.index(label)] = float(value)
            except (TypeError, ValueError):
                row[names.index(label)] = np.nan
        return row

    def _write_state(self, slot: int, generation: int, state: Mapping[str, np.ndarray]
                     ) -> None:
        g = self._f["resume"][f"slot_{slot}"]
        names = state_names(g)
        if set(state) != set(names):
            raise ValueError(f"resume state fields {sorted(state)}, expected {sorted(names)}")
        shapes = np.zeros((max(len(names), 1), MAX_STATE_DIMS), dtype=np.int64)
        crc = 0
        for i, name in enumerate(names):
            ds = g[name]
            arr = np.array(state[name], dtype=ds.dtype, order="C")  # keeps 0-d as 0-d
            if arr.ndim != ds.ndim - (1 if ds.attrs["ndim"] == 0 else 0):
                raise ValueError(f"resume state {name!r} of shape {arr.shape}, expected "
                                 f"{int(ds.attrs['ndim'])} dimensions")
            data = arr.reshape(1) if arr.ndim == 0 else arr
            grow(ds, data.shape)
            if data.size:
                ds[tuple(slice(0, n) for n in data.shape)] = data
            shapes[i, : arr.ndim] = arr.shape
            crc = zlib.crc32(arr.tobytes(), crc)
        g["shapes"][...] = shapes
        res = self._f["resume"]
        res["generation"][slot] = generation
        res["crc32"][slot] = zlib.crc32(shapes.tobytes(), crc)

    def write_hall_of_fame(self, params: np.ndarray, fitness: np.ndarray) -> None:
        """Replace the hall of fame: (K, n_params) parameters, internal units, best first."""
        self._need_writer()
        hof = self._f["hall_of_fame"]
        p = np.asarray(params, dtype=np.float64).reshape(-1, len(self._param_names))
        fit = np.asarray(fitness, dtype=np.float64).reshape(p.shape[0])
        hof["size"][0] = 0
        grow(hof["params"], p.shape)
        grow(hof["fitness"], fit.shape)
        if p.shape[0]:
            hof["params"][: p.shape[0]] = p
            hof["fitness"][: p.shape[0]] = fit
        self._f.flush()
        hof["size"][0] = p.shape[0]
        self._f.flush()

    def write_best(self, *, params: np.ndarray, fitness: float, errors: Mapping[str, float],
                   amplitudes: Mapping[str, float], traces: Mapping[str, dict],
                   features: Mapping[str, dict], polish: dict | None) -> None:
        """Write the best candidate, its traces and features per protocol.

        ``traces[protocol]`` holds ``time_ms``, ``fit_pA``, ``data_pA`` (lists of arrays, one
        per sweep; ``data_pA`` may be None) and ``labels``; where the protocol's chain has a
        filter, ``model_pA`` (the fit without it), and where it fits them per sweep,
        ``amplitude`` and ``offset_pA`` (one number per sweep). ``amplitudes[protocol]`` is the
        number of channels fitted for that protocol's recording (the fitted current is
        amplitude × the scheme's one-channel current); NaN or absent where none applies.
        ``features[protocol]`` is ``{"fit": {...}, "data": {...}}``.
        """
        self._need_writer()
        f = self._f
        best = f["best"]
        names = self._protocol_names
        best["valid"][0] = 0
        f.flush()
        best["params"][...] = np.asarray(params, dtype=np.float64).reshape(-1)
        best["fitness"][0] = float(fitness)
        best["errors"][...] = [float(errors.get(n, np.nan)) for n in names]
        best["amplitudes"][...] = [float(amplitudes.get(n, np.nan)) for n in names]
        info: dict[str, Any] = {"labels": {}, "has_data": {}, "n_sweeps": {}}
        for pname, tr in traces.items():
            if pname not in names:
                raise KingenError(f"traces for a protocol that is not defined (protocols "
                                  f"are {', '.join(names)})", file=str(self.path),
                                  field="best.traces", value=pname)
            g = best["traces"][member_key(pname)]
            times = [np.asarray(t, dtype=float).ravel() for t in tr["time_ms"]]
            fits = [np.asarray(y, dtype=float).ravel() for y in tr["fit_pA"]]
            data = tr.get("data_pA")
            datas = None if data is None else [np.asarray(y, dtype=float).ravel()
                                               for y in data]
            s, t = len(times), max((a.size for a in times), default=0)
            for ds_name in ("time_ms", "fit_pA", "data_pA"):
                grow(g[ds_name], (s, t))
            shape = g["time_ms"].shape
            g["time_ms"][...] = padded(times, shape[1], np.nan) if s else np.nan
            models = tr.get("model_pA") if "model_pA" in g else None
            if models is not None:
                models = [np.asarray(y, dtype=float).ravel() for y in models]
                grow(g["model_pA"], (s, t))
            for ds_name, rows in (("fit_pA", fits), ("data_pA", datas)) + (
                    (("model_pA", models),) if models is not None else ()):
                full = np.full(shape, np.nan)
                if rows is not None:
                    full[: len(rows)] = padded(rows, shape[1])
                g[ds_name][...] = full
            grow(g["n_samples"], (s,))
            n_samples = np.zeros(g["n_samples"].shape, dtype=np.int64)
            n_samples[:s] = [a.size for a in times]
            g["n_samples"][...] = n_samples
            info["labels"][pname] = [str(x) for x in tr.get("labels", range(s))]
            info["has_data"][pname] = datas is not None
            info["n_sweeps"][pname] = s
            if models is not None:
                info.setdefault("has_model", {})[pname] = True
            if "amplitude" in tr:
                info.setdefault("scales", {})[pname] = {
                    "amplitude": [float(x) for x in tr["amplitude"]],
                    "offset_pA": [float(x) for x in tr["offset_pA"]]}
        write_json(best["traces_info"], info)
        write_json(best["features"], dict(features))
        write_json(best["polish"], polish)
        best["generation"][0] = int(self._commit()[2]) if self._commit()[0] else -1
        f.flush()
        best["valid"][0] = 1
        f.flush()

    def record_lost_workers(self, events: list[Mapping[str, Any]]) -> None:
        """Add to ``/run/lost_workers``: one entry per shard of a generation that a lost
        Dask worker held and that ran again on another worker (``generation``, ``shard``,
        ``rows``, ``worker``, ``time``)."""
        self._need_writer()
        if not events:
            return
        ds = self._f["run/lost_workers"]
        known = read_json(ds) or []
        write_json(ds, list(known) + [dict(e) for e in events])
        self._f.flush()

    def mark_finished(self, reason: str) -> None:
        """Record why the run stopped, as the fit says it (e.g. ``"maximum generations
        (40)"``, ``"no improvement for 15 generations"``)."""
        self._need_writer()
        run = self._f["run"]
        run["finished"][0] = np.bytes_(str(reason).encode("utf-8")[:REASON_BYTES] or b"?")
        run["finished_unix"][0] = _dt.datetime.now(_dt.timezone.utc).timestamp()
        self._f.flush()
