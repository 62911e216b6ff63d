"""The HDF5 run file: everything a fit knows, written as the run goes.

One file per run holds the configuration, the scheme, the protocols, the data and targets,
one row per generation (population, errors, fitness, failure codes, statistics, timings),
the hall of fame, the best candidate with its traces, the environment, and the resume state
of the last generation (plain arrays, never a pickle). The layout is described in the README
("The run file") and in :data:`LAYOUT_DOC`.

Crash safety. The file is written in HDF5's single-writer/multiple-reader (SWMR) mode, whose
metadata is flushed in an order that keeps the file readable at every instant. On top of
that, a generation becomes visible only through ``/run/commit``, a 3-element integer
dataset ``[generations committed, resume slot, generation number]`` written (and flushed)
after the generation's rows and its resume state. Readers trust only that counter, so a run
killed with SIGKILL at any moment leaves every committed generation, and a resume state for
the last one: the state of generation g goes into the slot *not* named by the commit, so a
kill while it is written leaves the previous slot, still named by the commit, intact.

SWMR forbids creating objects once the writer is in SWMR mode, so every dataset is made by
:meth:`RunStore.create` (extendable ones empty); later writes only resize and fill them.
"""

from __future__ import annotations

import datetime as _dt
import errno
import functools
import json
import math
import os
import platform
import shutil
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import h5py
import numpy as np

from kingen.errors import KingenError
from kingen.experiment.chain import Chain
from kingen.experiment.protocol import Protocol
from kingen.experiment.recordings import Recording, Targets
from kingen.model.scheme import Scheme
from kingen.store.datasets import (
    _CHECKSUM,
    MAX_COLUMNS,
    MAX_STATE_DIMS,
    NAME_BYTES,
    REASON_BYTES,
    _col,
    _dataset,
    _dumps,
    _extendable,
    _grow,
    _json_blob,
    _key,
    _load,
    _one,
    _padded,
    _read_json,
    _text,
    _text_dataset,
    _write_json,
)
from kingen.store.encode import (
    _read_protocol,
    _read_recording,
    _read_targets,
    _write_protocol,
    _write_recording,
    _write_scheme,
    _write_targets,
)
from kingen.store.integrity import (
    WriterLock,
    _check_consistency,
    _corrupt,
    _mark_writer,
    _missing,
    _open_append,
    _open_read,
    _refuse_inputs,
    _refuse_non_run,
    _state_names,
    _state_schema,
)
from kingen.store.layout import LAYOUT_DOC, LAYOUT_VERSION, MARKER


def _default_environment() -> dict[str, str]:
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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


_F = TypeVar("_F", bound=Callable[..., Any])


def _reading(fn: _F) -> _F:
    """Turn HDF5 errors while reading into one-line KingenErrors naming the file."""

    @functools.wraps(fn)
    def wrapper(self: RunStore, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except KingenError:
            raise
        except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
            raise _corrupt(str(self.path), exc) from None

    return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------- the store

class RunStore:
    """A kingen run file, open for writing (a running fit) or reading (plots, reports).

    Make one with :meth:`create` (a new run) or :meth:`open` (``"r"``: read, also while a
    run writes it; ``"a"``: continue a run, e.g. after it was killed). Use as a context
    manager, or call :meth:`close`.
    """

    def __init__(self, f: h5py.File, path: Path, mode: str, lock: WriterLock | None = None
                 ) -> None:
        self._f = f
        self.path = path
        self.mode = mode
        self._lock = lock
        self._replaces: Path | None = None  # the run file this one replaces at its first commit
        self._protocol_names: list[str] = _check_consistency(f, str(path))
        self._param_names = _col(_load(f["scheme/parameters"]), "name")

    # ------------------------------------------------------------------ create
    @classmethod
    def create(cls, path: str | os.PathLike[str], *, config_text: str, config: dict[str, Any],
               scheme: Scheme, protocols: list[Protocol],
               recordings: Mapping[str, Recording | None],
               targets: Mapping[str, Targets | None], free_mask: np.ndarray,
               population_size: int, environment: Mapping[str, str],
               state_fields: Mapping[str, tuple[str, tuple[int, ...]]] | None = None,
               inputs: Mapping[str, str] | None = None, overwrite: bool = False,
               chains: Mapping[str, Chain] | None = None) -> RunStore:
        """Write a new run file with all its static groups, then enter SWMR write mode.

        Parameters
        ----------
        path
            The run file to write.
        config_text, config
            The configuration file's text, and the settings it resolved to (JSON-able).
        scheme, protocols
            The model and the experiments, in the order errors are reported.
        recordings, targets
            Per protocol name: the recording fitted (or None), the summary targets (or None).
        free_mask
            True for each parameter the fit searches.
        population_size
            Candidates per generation (rows grow if a generation brings more).
        environment
            Versions, device, backend, precision; library versions are added if missing.
        state_fields
            The resume state's arrays: name -> (NumPy dtype, typical shape), e.g.
            ``{"genes": ("f8", (100, 8))}`` (``()`` for a scalar; the shape sets the number
            of dimensions and the chunks, and may change from one generation to the next);
            :meth:`append_generation` writes them, and :meth:`last_state` reads them back.
            Numbers only (no objects, no text), up to 3 dimensions.
        inputs
            The run's input files (path -> what it is, e.g. ``"model file"``): the output
            may never be one of them, even with ``overwrite``.
        overwrite
            Replace an existing kingen run file instead of refusing. Anything else (a file
            without the run marker, an input of the run, a run file that another process
            is writing) is never replaced.
        chains
            Per protocol name, the recording chain its model current went through
            (:class:`~kingen.experiment.chain.Chain`), kept as the protocol group's ``chain``
            attribute; absent: none.

        Raises
        ------
        KingenError
            If the file exists (and not ``overwrite``, or it is not a kingen run file, or
            another process writes it) or cannot be written, or the inputs disagree
            (protocol names, mask length).
        """
        p = Path(path)
        name = str(p)
        cls.check_new(p, inputs=inputs, overwrite=overwrite)
        fields = _state_schema(state_fields or {})
        names = [pr.name for pr in protocols]
        keys = [_key(n) for n in names]
        if len(set(keys)) != len(keys):
            raise KingenError("protocol names must be distinct", field="protocols",
                              value=", ".join(names))
        for what, mapping in (("recordings", recordings), ("targets", targets)):
            extra = [k for k, v in mapping.items() if k not in names and v is not None]
            if extra:
                raise KingenError(f"{what} for a protocol that is not defined (protocols are "
                                  f"{', '.join(names)})", field=what, value=extra[0])
        mask = np.asarray(free_mask, dtype=bool)
        if mask.shape != (scheme.n_params,):
            raise KingenError(f"free mask of shape {mask.shape} for {scheme.n_params} "
                              "parameters", field="free_mask")
        if population_size < 1:
            raise KingenError("must be >= 1", field="population_size", value=population_size)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KingenError(f"cannot create the folder: {exc.strerror}", file=name) from None
        _need_space(p, 2 * sum(_recording_bytes(r) for r in recordings.values()) + (8 << 20))
        # Locked before anything is deleted: a run another process writes is never replaced.
        lock = WriterLock(p)
        lock.acquire()
        try:
            # An earlier run (overwrite) stays until the new one commits its first
            # generation: a fit that stops before that leaves it as it was.
            old = p.exists()
            if old:
                _refuse_non_run(p)
            target = p.with_name(f".{p.name}.new") if old else p
            try:
                target.unlink(missing_ok=True)
                f = h5py.File(target, "w", libver="latest")
            except OSError as exc:
                raise KingenError(f"cannot create the run file: {exc}", file=name) from None
            try:
                env = {**_default_environment(), **{k: str(v) for k, v in environment.items()}}
                _write_static(f, config_text=config_text, config=config, scheme=scheme,
                              protocols=protocols, recordings=recordings, targets=targets,
                              free_mask=mask, population_size=int(population_size),
                              environment=env, state_fields=fields, chains=chains or {})
                f.flush()
                f.swmr_mode = True
                store = cls(f, target, "w", lock)
                store._replaces = p if old else None
                return store
            except BaseException:
                f.close()
                target.unlink(missing_ok=True)
                raise
        except BaseException:
            lock.release()
            raise

    @staticmethod
    def check_new(path: str | os.PathLike[str], *, inputs: Mapping[str, str] | None = None,
                  overwrite: bool = False) -> None:
        """What :meth:`create` checks of ``path`` before it writes anything: not a folder,
        not one of the run's ``inputs``, and no file there unless ``overwrite``.

        Raises
        ------
        KingenError
            Naming the file.
        """
        p = Path(path)
        if p.is_dir():
            raise KingenError("is a directory, not a run file", file=str(p))
        _refuse_inputs(p, inputs or {})
        if p.exists() and not overwrite:
            raise KingenError("run file already exists (choose another output file, or "
                              "overwrite it)", file=str(p))

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, path: str | os.PathLike[str], mode: str = "r", *, verify: bool = True,
             lock: WriterLock | None = None) -> RunStore:
        """Open a run file.

        Opening checks that the file is a kingen run file of a layout this kingen reads and
        that its counters agree with its data (committed generations, resume slot, widths).

        Parameters
        ----------
        path
            The run file.
        mode
            ``"r"``: read (as an SWMR reader, so a live run can be read; call
            :meth:`refresh` to see new generations). ``"a"``: continue writing it (resume):
            takes the writer lock, verifies every checksum first (a damaged file is never
            written to), and rebuilds a file left by a killed run from its committed content.
        verify
            Read every committed dataset once to check its Fletcher-32 checksums (see
            :meth:`verify`); in mode ``"a"``, before anything is written (pass False only
            right after a verified reading).
        lock
            Mode ``"a"``: the run file's writer lock, already taken by the caller (who read
            the file under it); the store lets go of it when closed, or when opening fails.

        Raises
        ------
        KingenError
            If the file is missing, not HDF5, not a kingen run, corrupt, damaged or
            truncated, inconsistent, of another layout version, lacks a group, dataset or
            attribute, or (mode ``"a"``) another process writes it.

        Examples
        --------
        >>> import kingen
        >>> with kingen.RunStore.open("demo.h5") as store:  # doctest: +SKIP
        ...     print(store.n_generations, store.protocol_names)
        3 ['deactivation', 'desensitization', 'recovery', 'dose_response']
        >>> kingen.RunStore.open("no_such_run.h5")
        Traceback (most recent call last):
        ...
        kingen.errors.KingenError: no_such_run.h5: run file not found
        """
        if mode not in ("r", "a"):
            raise ValueError(f"mode must be 'r' or 'a', not {mode!r}")
        p = Path(path)
        name = str(p)
        if not p.is_file():
            raise KingenError("run file not found", file=name)
        if p.stat().st_size == 0 or not h5py.is_hdf5(p):
            raise KingenError("not an HDF5 file (a run file is the .h5 file written by "
                              "kingen fit)", file=name)
        if mode == "r":
            f = _open_read(p)
            try:
                store = cls(f, p, "r")
                if verify:
                    store.verify()
            except KingenError:
                f.close()
                raise
            except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
                f.close()
                raise _corrupt(name, exc) from None
            return store
        if lock is None:
            lock = WriterLock(p)
        lock.acquire()
        try:
            with cls.open(p, "r", verify=verify) as reader:
                # validated (and verified) before anything is written; so are both resume
                # slots, since the next generation's state goes into the one not committed
                for slot in (0, 1):
                    _state_names(reader._f["resume"][f"slot_{slot}"])
                resumed = reader.resumed  # read here: a refusal must leave the file as it was
            f = _open_append(p)
            try:
                store = cls(f, p, "w", lock)
                f["run"].attrs["resumed"] = _dumps(resumed + [_now()])
                f["run/finished"][0] = np.bytes_(b"")  # running again
                if "lost_workers" not in f["run"]:  # a file written before it existed
                    _lost_workers_blob(f["run"])
                _mark_writer(f["run"])
                f.flush()
                f.swmr_mode = True
            except KingenError:
                f.close()
                raise
            except (OSError, KeyError, ValueError, RuntimeError) as exc:
                f.close()
                raise _corrupt(name, exc) from None
        except BaseException:
            lock.release()
            raise
        return store

    @_reading
    def verify(self) -> None:
        """Read every committed dataset once, so that HDF5 checks all its checksums.

        What a live writer may still be writing (rows past the commit, the resume slot not
        named by it, the hall of fame and best candidate before they are marked valid) is
        left out. Costs one read of the file (about a second per GB from a local disk).

        Raises
        ------
        KingenError
            Naming the first dataset whose checksum fails.
        """
        f = self._f
        rows, slot, _ = (int(v) for v in self._commit())
        hof = int(_one(self._ds("hall_of_fame/size")))
        best_valid = int(_one(self._ds("best/valid"))) == 1
        datasets: list[h5py.Dataset] = []
        f.visititems(lambda _, obj: datasets.append(obj)
                     if isinstance(obj, h5py.Dataset) else None)
        for ds in datasets:
            parts = ds.name.strip("/").split("/")
            top = parts[0]
            if self.mode == "r" and f.swmr_mode:
                ds.refresh()
            end = ds.shape[0] if ds.ndim else 0
            if top == "generations" and ds.maxshape[0] is None:
                end = min(end, rows)
            elif top == "resume" and len(parts) == 3 and (
                    rows == 0 or parts[1] != f"slot_{slot}"):
                continue
            elif top == "hall_of_fame" and parts[1] != "size":
                end = min(end, hof)
            elif top == "best" and parts[1] != "valid" and not best_valid:
                continue
            if ds.chunks is None or end == 0 or ds.size == 0:
                continue
            sel = (slice(0, end),) + tuple(slice(0, n) for n in ds.shape[1:])
            for chunk in ds.iter_chunks(sel):
                _load(ds, chunk)

    # ------------------------------------------------------------------ context
    def close(self) -> None:
        """Flush (when writing), close the file, and let go of the writer lock."""
        try:
            if self._f.id.valid:
                if self.mode == "w":
                    self._f.flush()
                self._f.close()
            if self._replaces is not None:  # never committed: the earlier run stays
                self.path.unlink(missing_ok=True)
                self.path, self._replaces = self._replaces, None
        finally:
            if self._lock is not None:
                self._lock.release()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh(self) -> None:
        """See what a live writer has committed since the file was opened (readers)."""
        if self.mode == "r" and self._f.swmr_mode:
            for name in ("run/commit", "run/finished", "hall_of_fame/size", "best/valid"):
                self._f[name].refresh()

    # ------------------------------------------------------------------ writing
    def _need_writer(self) -> None:
        if self.mode != "w" or not self._f.id.valid:
            raise KingenError("run file is open for reading, not writing", file=str(self.path))

    def _ds(self, name: str) -> h5py.Dataset:
        ds = self._f.get(name)
        if not isinstance(ds, h5py.Dataset):  # opening checks the required ones: a safety net
            raise _missing(str(self.path), f"/{name.lstrip('/')}", "dataset")
        if self.mode == "r" and self._f.swmr_mode:
            ds.refresh()
        return ds

    def _commit(self) -> np.ndarray:
        return np.asarray(_load(self._ds("run/commit")), dtype=np.int64)

    def _read(self, name: str, sel: Any = ()) -> Any:
        """``self._f[name][sel]``, fresh (a live run) and verified (names a damaged dataset)."""
        return _load(self._ds(name), sel)

    def _need_space(self, *arrays: Any) -> None:
        """Refuse a generation the disk cannot hold, before HDF5 starts writing it: twice
        the arrays' size (compression only shrinks them) and 1 MiB for the file's own
        records (see :func:`_need_space`)."""
        _need_space(self.path, 2 * sum(np.asarray(a).nbytes for a in arrays) + (1 << 20),
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
            full = _disk_full(exc)
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
            _grow(gen[name], (row + 1, width) + extra)
        for name in ("generation", "size", "stats", "timings"):
            _grow(gen[name], (row + 1,) + gen[name].shape[1:])
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
        names = [_text(v) for v in _load(names_ds)]
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
        names = _state_names(g)
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
            _grow(ds, data.shape)
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
        _grow(hof["params"], p.shape)
        _grow(hof["fitness"], fit.shape)
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
            g = best["traces"][_key(pname)]
            times = [np.asarray(t, dtype=float).ravel() for t in tr["time_ms"]]
            fits = [np.asarray(y, dtype=float).ravel() for y in tr["fit_pA"]]
            data = tr.get("data_pA")
            datas = None if data is None else [np.asarray(y, dtype=float).ravel()
                                               for y in data]
            s, t = len(times), max((a.size for a in times), default=0)
            for ds_name in ("time_ms", "fit_pA", "data_pA"):
                _grow(g[ds_name], (s, t))
            shape = g["time_ms"].shape
            g["time_ms"][...] = _padded(times, shape[1], np.nan) if s else np.nan
            models = tr.get("model_pA") if "model_pA" in g else None
            if models is not None:
                models = [np.asarray(y, dtype=float).ravel() for y in models]
                _grow(g["model_pA"], (s, t))
            for ds_name, rows in (("fit_pA", fits), ("data_pA", datas)) + (
                    (("model_pA", models),) if models is not None else ()):
                full = np.full(shape, np.nan)
                if rows is not None:
                    full[: len(rows)] = _padded(rows, shape[1])
                g[ds_name][...] = full
            _grow(g["n_samples"], (s,))
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
        _write_json(best["traces_info"], info)
        _write_json(best["features"], dict(features))
        _write_json(best["polish"], polish)
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
        known = _read_json(ds) or []
        _write_json(ds, list(known) + [dict(e) for e in events])
        self._f.flush()

    def mark_finished(self, reason: str) -> None:
        """Record why the run stopped, as the fit says it (e.g. ``"maximum generations
        (40)"``, ``"no improvement for 15 generations"``)."""
        self._need_writer()
        run = self._f["run"]
        run["finished"][0] = np.bytes_(str(reason).encode("utf-8")[:REASON_BYTES] or b"?")
        run["finished_unix"][0] = _dt.datetime.now(_dt.timezone.utc).timestamp()
        self._f.flush()

    # ------------------------------------------------------------------ reading: static
    @property
    @_reading
    def config_text(self) -> str:
        """The configuration file's text."""
        return _text(_one(self._f["config/text"]))

    @property
    @_reading
    def config(self) -> dict[str, Any]:
        """The resolved settings."""
        return json.loads(_text(_one(self._f["config/settings"])))

    @property
    @_reading
    def environment(self) -> dict[str, str]:
        """Versions, device, backend, precision of the run."""
        return {k: _text(v) for k, v in self._f["environment"].attrs.items()}

    @property
    @_reading
    def created(self) -> str:
        """When the run file was created (ISO 8601, UTC)."""
        return _text(self._f.attrs.get("created", ""))

    @_reading
    def scheme(self) -> Scheme:
        """The scheme, parsed again from its stored file text."""
        g = self._f["scheme"]
        return Scheme.loads(_text(_one(g["text"])), path=_text(g.attrs.get("path", "<scheme>")))

    @_reading
    def parameter_table(self) -> dict[str, list[Any]]:
        """``/scheme/parameters`` by column: the parameters as the fit used them (bounds,
        scales and ``fixed`` flags after the configuration's overrides; internal units)."""
        t = _load(self._f["scheme/parameters"])
        return {name: _col(t, name) for name in t.dtype.names}

    @_reading
    def local_uncertainty(self) -> dict[str, Any] | None:
        """``/profiles/local``: the noise model, standard errors and correlations at the
        optimum, or None (not computed, or a file from before it existed)."""
        from kingen.store.profiles import read_local

        return read_local(self._f)

    @_reading
    def profiles(self) -> dict[str, Any] | None:
        """The last committed state of ``kingen profile`` (with its results once finished),
        or None."""
        from kingen.store.profiles import read_state

        return read_state(self._f, str(self.path))

    @property
    def has_profiles_group(self) -> bool:
        """True when the file has the ``/profiles`` group (files from before it lack it)."""
        from kingen.store.profiles import has_group

        return has_group(self._f)

    def write_local_uncertainty(self, obj: Mapping[str, Any]) -> None:
        """Replace ``/profiles/local`` (a fit's writer; JSON-able numbers and text)."""
        from kingen.store.profiles import has_group, write_local

        self._need_writer()
        if has_group(self._f):
            write_local(self._f, dict(obj))

    @property
    @_reading
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The box the run searched: (lower, upper) per parameter, internal units, scheme
        order. The fit configuration may narrow the scheme file's bounds; :meth:`scheme`
        parses the file's text, so only this gives the run's."""
        table = _load(self._f["scheme/parameters"])
        return (np.asarray(_col(table, "lower"), dtype=np.float64),
                np.asarray(_col(table, "upper"), dtype=np.float64))

    @property
    def protocol_names(self) -> list[str]:
        """Protocol names, in the order of the error columns."""
        return list(self._protocol_names)

    @property
    def param_names(self) -> list[str]:
        """Parameter names, in the order of the parameter columns."""
        return list(self._param_names)

    @property
    @_reading
    def free_mask(self) -> np.ndarray:
        """True for each parameter the fit searched."""
        return np.asarray(_load(self._f["generations/free_mask"]), dtype=bool)

    @property
    @_reading
    def population_size(self) -> int:
        """Candidates per generation, as configured."""
        return int(self._f["generations"].attrs["population_size"])

    @_reading
    def protocols(self) -> list[Protocol]:
        """The protocols, rebuilt from their tables."""
        return [_read_protocol(self._f["protocols"][_key(n)]) for n in self._protocol_names]

    @_reading
    def chains(self) -> dict[str, Chain]:
        """The recording chain of each protocol; the plain chain (no filter, one amplitude,
        no offset) where the run file records none, as every run written before chains."""
        g = self._f["protocols"]
        out = {}
        for n in self._protocol_names:
            text = g[_key(n)].attrs.get("chain")
            out[n] = Chain.from_dict(json.loads(_text(text)) if text is not None else None)
        return out

    @_reading
    def recordings(self) -> dict[str, Recording | None]:
        """The recording fitted for each protocol (None where there was none)."""
        g = self._f["data"]
        return {n: _read_recording(g[_key(n)]) if _key(n) in g else None
                for n in self._protocol_names}

    @_reading
    def targets(self) -> dict[str, Targets | None]:
        """The summary targets of each protocol (None where there were none)."""
        g = self._f["targets"]
        return {n: _read_targets(g[_key(n)]) if _key(n) in g else None
                for n in self._protocol_names}

    # ------------------------------------------------------------------ reading: the run
    @property
    @_reading
    def n_generations(self) -> int:
        """Generations committed."""
        return int(self._commit()[0])

    @property
    @_reading
    def resumed(self) -> list[str]:
        """When the run was resumed (ISO 8601, UTC), oldest first."""
        value = json.loads(_text(self._f["run"].attrs.get("resumed", "[]")))
        return [str(v) for v in value] if isinstance(value, list) else []

    @property
    @_reading
    def lost_workers(self) -> list[dict[str, Any]]:
        """The shards a lost Dask worker held and that ran again elsewhere (see
        :meth:`record_lost_workers`); empty for a run in one process."""
        if "lost_workers" not in self._f["run"]:
            return []
        value = _read_json(self._ds("run/lost_workers"))
        return [dict(v) for v in value if isinstance(v, dict)] if isinstance(value, list) \
            else []

    @property
    @_reading
    def finished(self) -> str | None:
        """Why the run stopped, or None while it runs (or if it was killed)."""
        text = _text(_one(self._ds("run/finished")))
        return text or None

    @_reading
    def history(self, *, population: bool = True) -> dict[str, Any]:
        """Every committed generation.

        Returns
        -------
        dict
            ``generation`` (G,), ``best``, ``median``, ``mean`` (G,) from the statistics,
            ``population`` (G, N, n_params) unless ``population`` is False, ``errors``
            (G, N, n_protocols), ``fitness`` (G, N), ``fail`` (G, N), ``size`` (G,),
            ``stats`` and ``timings`` (dicts of (G,) arrays). Rows of a generation
            smaller than the largest are NaN (fail -1) padded.
        """
        g_n = self.n_generations
        out: dict[str, Any] = {}
        names = ["generation", "size", "fitness", "fail", "errors"]
        if population:
            names.append("population")
        for name in names:
            out[name] = np.asarray(self._read(f"generations/{name}", np.s_[:g_n]))
        for name in ("stats", "timings"):
            cols = [_text(v) for v in self._read(f"generations/{name}_names")]
            table = np.asarray(self._read(f"generations/{name}", np.s_[:g_n]))
            out[name] = {c: table[:, i] for i, c in enumerate(cols) if c}
        for key in ("best", "median", "mean"):
            out[key] = out["stats"].get(key, np.full(g_n, np.nan))
        return out

    @_reading
    def generation(self, index: int = -1) -> dict[str, np.ndarray]:
        """One committed generation (``index`` counts rows, negative from the end): its
        ``population``, ``errors``, ``fitness`` and ``fail``, cut to its size."""
        g_n = self.n_generations
        row = index + g_n if index < 0 else index
        if not 0 <= row < g_n:
            raise IndexError(f"generation row {index} of {g_n}")
        n = int(self._read("generations/size", row))
        return {name: np.asarray(self._read(f"generations/{name}", np.s_[row, :n]))
                for name in ("population", "errors", "fitness", "fail")}

    @_reading
    def best_per_generation(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(generation numbers (G,), best candidate of each (G, n_params), its fitness (G,))."""
        g_n = self.n_generations
        fit = np.asarray(self._read("generations/fitness", np.s_[:g_n]))
        gens = np.asarray(self._read("generations/generation", np.s_[:g_n]))
        pop = self._ds("generations/population")
        params = np.full((g_n, len(self._param_names)), np.nan)
        best = np.full(g_n, np.nan)
        for g in range(g_n):
            row = np.where(np.isfinite(fit[g]), fit[g], np.inf)
            if row.size and np.isfinite(row.min()):
                i = int(np.argmin(row))
                params[g] = _load(pop, (g, i))  # one chunk per generation: cheap
                best[g] = row[i]
        return gens, params, best

    @_reading
    def last_state(self) -> tuple[int, dict[str, np.ndarray]]:
        """(generation number, resume state) of the last committed generation.

        The state is the arrays given to :meth:`append_generation`, each checked against
        its declared type and number of dimensions and against the slot's checksum. Nothing
        in it is executed or unpickled: it is numbers only.

        Raises
        ------
        KingenError
            If no generation was committed, or the state is damaged or malformed.
        """
        rows, slot, generation = (int(v) for v in self._commit())
        if rows == 0:
            raise KingenError("no completed generation to resume from", file=str(self.path))
        g = self._f["resume"][f"slot_{slot}"]
        where = f"/resume/slot_{slot}"
        names = _state_names(g)
        shapes = np.asarray(_load(g["shapes"]), dtype=np.int64)
        out: dict[str, np.ndarray] = {}
        crc = 0
        for i, name in enumerate(names):
            ds = g[name]
            ndim = int(ds.attrs["ndim"])
            shape = tuple(int(n) for n in shapes[i, :ndim])
            stored = ds.shape if ndim else ()
            if any(n < 0 for n in shape) or any(
                    n > m for n, m in zip(shape, stored, strict=True)):
                raise KingenError(f"inconsistent run file: resume state of shape {shape} in a "
                                  f"dataset of shape {ds.shape}", file=str(self.path),
                                  field=f"{where}/{name}")
            sel = tuple(slice(0, n) for n in shape) if ndim else 0
            arr = np.asarray(_load(ds, sel), dtype=ds.dtype).reshape(shape)
            out[name] = arr
            crc = zlib.crc32(arr.tobytes(), crc)
        crc = zlib.crc32(shapes.tobytes(), crc)
        if crc != int(self._read("resume/crc32", slot)) or int(
                self._read("resume/generation", slot)) != generation:
            raise KingenError(f"damaged run file: the resume state of generation {generation} "
                              "fails its checksum", file=str(self.path), field=where)
        return generation, out

    @_reading
    def hall_of_fame(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(params (K, n_params), fitness (K,)) or None when none was written."""
        k = int(_one(self._ds("hall_of_fame/size")))
        if k == 0:
            return None
        return (np.asarray(self._read("hall_of_fame/params", np.s_[:k])),
                np.asarray(self._read("hall_of_fame/fitness", np.s_[:k])))

    @_reading
    def best(self) -> dict[str, Any] | None:
        """The best candidate as written by :meth:`write_best`, or None.

        Keys: ``params``, ``fitness``, ``errors`` and ``amplitudes`` (dicts by protocol),
        ``traces`` (as given to :meth:`write_best`), ``features``, ``polish``,
        ``generation`` (the last committed generation when it was written).
        """
        if int(_one(self._ds("best/valid"))) != 1:
            return None
        b = self._f["best"]
        names = self._protocol_names
        errors = np.asarray(self._read("best/errors"))
        amps = np.asarray(self._read("best/amplitudes"))
        info = _read_json(self._ds("best/traces_info"))
        traces: dict[str, dict] = {}
        for pname in names:
            if pname not in info.get("n_sweeps", {}):
                continue
            g = b["traces"][_key(pname)]
            s = int(info["n_sweeps"][pname])
            n = np.asarray(self._read(f"{g.name}/n_samples", np.s_[:s]))
            t = np.asarray(self._read(f"{g.name}/time_ms", np.s_[:s]))
            y = np.asarray(self._read(f"{g.name}/fit_pA", np.s_[:s]))
            d = np.asarray(self._read(f"{g.name}/data_pA", np.s_[:s]))
            traces[pname] = {
                "time_ms": [t[i, : n[i]] for i in range(s)],
                "fit_pA": [y[i, : n[i]] for i in range(s)],
                "data_pA": ([d[i, : n[i]] for i in range(s)] if info["has_data"][pname]
                            else None),
                "labels": list(info["labels"][pname]),
            }
            # written by kingen versions with recording chains, where the chain asked
            if info.get("has_model", {}).get(pname):
                m = np.asarray(self._read(f"{g.name}/model_pA", np.s_[:s]))
                traces[pname]["model_pA"] = [m[i, : n[i]] for i in range(s)]
            if pname in info.get("scales", {}):
                traces[pname].update(info["scales"][pname])
        return {
            "params": np.asarray(self._read("best/params")),
            "fitness": float(_one(self._ds("best/fitness"))),
            "errors": {n: float(e) for n, e in zip(names, errors, strict=True)},
            "amplitudes": {n: float(a) for n, a in zip(names, amps, strict=True)
                           if math.isfinite(a)},
            "traces": traces,
            "features": _read_json(self._ds("best/features")) or {},
            "polish": _read_json(self._ds("best/polish")),
            "generation": int(_one(self._ds("best/generation"))),
        }


def _write_static(f: h5py.File, *, config_text: str, config: dict[str, Any], scheme: Scheme,
                  protocols: list[Protocol], recordings: Mapping[str, Recording | None],
                  targets: Mapping[str, Targets | None], free_mask: np.ndarray,
                  population_size: int, environment: Mapping[str, str],
                  state_fields: Mapping[str, tuple[np.dtype, tuple[int, ...]]],
                  chains: Mapping[str, Chain]) -> None:
    f.attrs["kingen_run"] = MARKER
    f.attrs["layout_version"] = LAYOUT_VERSION
    f.attrs["kingen_version"] = environment.get("kingen", "")
    f.attrs["created"] = _now()
    f.attrs["layout"] = LAYOUT_DOC
    f.attrs["description"] = ("kingen fit of a kinetic scheme; layout: see the kingen README, "
                              "section 'The run file'")

    cfg = f.create_group("config")
    _text_dataset(cfg, "text", config_text)
    _text_dataset(cfg, "settings", _dumps(config))
    cfg["text"].attrs["description"] = "the configuration file as given (TOML)"
    cfg["settings"].attrs["description"] = "the settings the configuration resolved to (JSON)"

    _write_scheme(f.create_group("scheme"), scheme)

    pg = f.create_group("protocols")
    pg.attrs["names"] = _dumps([p.name for p in protocols])
    for p in protocols:
        g = pg.create_group(_key(p.name))
        _write_protocol(g, p)
        chain = chains.get(p.name)
        if chain is not None and not chain.plain:
            g.attrs["chain"] = _dumps(chain.to_dict())

    dg = f.create_group("data")
    for name, rec in recordings.items():
        if rec is not None:
            _write_recording(dg.create_group(_key(name)), name, rec)
    tg = f.create_group("targets")
    for name, tar in targets.items():
        if tar is not None:
            _write_targets(tg.create_group(_key(name)), name, tar)

    env = f.create_group("environment")
    for k, v in environment.items():
        env.attrs[str(k)] = str(v)

    n_par, n_prot = scheme.n_params, len(protocols)
    pnames = _dumps(scheme.param_names)
    gen = f.create_group("generations")
    gen.attrs["population_size"] = population_size
    gen.attrs["fitness"] = "total weighted error; lower is better; failed candidates worst"
    _dataset(gen, "free_mask", free_mask)
    gen["free_mask"].attrs["columns"] = pnames
    rows = population_size
    d = _extendable(gen, "population", (0, rows, n_par), np.float64, np.nan,
                    unit="internal: ms^-1 (order 1) or mM^-1 ms^-1 (order 2); "
                         "see /scheme/parameters", doc="parameters of every candidate",
                    chunk_rows=1, compress=False)
    d.attrs["columns"] = pnames
    d = _extendable(gen, "errors", (0, rows, n_prot), np.float64, np.nan, unit="1",
                    doc="error of every candidate under each protocol", chunk_rows=1,
                    compress=False)
    d.attrs["columns"] = _dumps([p.name for p in protocols])
    _extendable(gen, "fitness", (0, rows), np.float64, np.nan, unit="1",
                doc="total weighted error (lower is better)", chunk_rows=1, compress=False)
    _extendable(gen, "fail", (0, rows), np.int32, -1,
                doc="failure code (0: simulated fine; -1: padding)", chunk_rows=1)
    _extendable(gen, "generation", (0,), np.int64, -1, doc="generation number")
    _extendable(gen, "size", (0,), np.int64, 0, doc="candidates in the generation")
    for name, unit in (("stats", "1"), ("timings", "s")):
        _extendable(gen, name, (0, MAX_COLUMNS), np.float64, np.nan, unit=unit,
                    doc=f"one column per key; names in {name}_names")
        _dataset(gen, f"{name}_names", np.zeros(MAX_COLUMNS, dtype=f"S{NAME_BYTES}"))

    hof = f.create_group("hall_of_fame")
    _extendable(hof, "params", (0, n_par), np.float64, np.nan, unit="internal",
                doc="best candidates ever seen, best first")
    hof["params"].attrs["columns"] = pnames
    _extendable(hof, "fitness", (0,), np.float64, np.nan, unit="1")
    _dataset(hof, "size", np.int64(0))
    hof["size"].attrs["description"] = "rows of params/fitness that are valid (written last)"

    best = f.create_group("best")
    _dataset(best, "valid", np.int8(0))
    _dataset(best, "generation", np.int64(-1))
    _dataset(best, "params", np.full(n_par, np.nan))
    best["params"].attrs["columns"] = pnames
    best["params"].attrs["unit"] = "internal"
    _dataset(best, "fitness", np.float64(np.nan))
    _dataset(best, "errors", np.full(n_prot, np.nan))
    best["errors"].attrs["columns"] = _dumps([p.name for p in protocols])
    _dataset(best, "amplitudes", np.full(n_prot, np.nan))
    best["amplitudes"].attrs["columns"] = _dumps([p.name for p in protocols])
    best["amplitudes"].attrs["description"] = ("number of channels fitted per protocol: the "
                                               "fitted current is amplitude x the scheme's "
                                               "one-channel current; NaN: none applies")
    _json_blob(best, "features", "features per protocol: {protocol: {fit: {}, data: {}}}")
    _json_blob(best, "polish", "local polish: error before and after, or null")
    _json_blob(best, "traces_info", "sweep labels, has_data and n_sweeps per protocol")
    tr = best.create_group("traces")
    for p in protocols:
        g = tr.create_group(_key(p.name))
        g.attrs["name"] = p.name
        filtered = chains.get(p.name) is not None and chains[p.name].filter is not None
        # the unfiltered model beside the fit, for a protocol whose chain has a filter
        for name, unit in (("time_ms", "ms"), ("fit_pA", "pA"), ("data_pA", "pA")) + (
                (("model_pA", "pA"),) if filtered else ()):
            _extendable(g, name, (0, 0), np.float64, np.nan, unit=unit, chunk_rows=1,
                        doc="one row per sweep, NaN padded to the longest")
        _extendable(g, "n_samples", (0,), np.int64, 0, doc="samples in each sweep's row")

    res = f.create_group("resume")
    res.attrs["description"] = ("resume state of the last committed generation, in the slot "
                                "/run/commit[1] names: plain arrays (population, hall of "
                                "fame, CMA-ES strategy, random generators' states)")
    for slot in (0, 1):
        g = res.create_group(f"slot_{slot}")
        g.attrs["fields"] = _dumps(list(state_fields))
        for name, (dtype, shape) in state_fields.items():
            chunks = [max(1, n) for n in shape] or [1]
            while int(np.prod(chunks)) * dtype.itemsize > 1 << 20:
                chunks[chunks.index(max(chunks))] //= 2
            ds = g.create_dataset(name, shape=(0,) * len(chunks),
                                  maxshape=(None,) * len(chunks), dtype=dtype,
                                  chunks=tuple(chunks), fillvalue=0, **_CHECKSUM)
            ds.attrs["ndim"] = len(shape)
        shapes = np.zeros((max(len(state_fields), 1), MAX_STATE_DIMS), dtype=np.int64)
        _dataset(g, "shapes", shapes)
        g["shapes"].attrs["description"] = "each field's shape, in the order of attribute fields"
    _dataset(res, "generation", np.full(2, -1, dtype=np.int64))
    _dataset(res, "crc32", np.zeros(2, dtype=np.int64))
    res["crc32"].attrs["description"] = "CRC-32 of each slot's fields and shapes, written last"

    from kingen.store.profiles import create_group

    create_group(f)

    run = f.create_group("run")
    _dataset(run, "commit", np.array([0, 0, -1], dtype=np.int64))
    run["commit"].attrs["description"] = ("[generations committed, resume slot, last "
                                          "generation number]; written last")
    _dataset(run, "finished", np.array(b"", dtype=f"S{REASON_BYTES}"))
    _dataset(run, "finished_unix", np.float64(np.nan))
    run["finished_unix"].attrs["unit"] = "s since 1970-01-01 UTC"
    run.attrs["resumed"] = "[]"
    _lost_workers_blob(run)
    _mark_writer(run)


def _lost_workers_blob(run: h5py.Group) -> None:
    _json_blob(run, "lost_workers", "shards a lost Dask worker held, run again elsewhere "
                                    "(JSON list)")
    _write_json(run["lost_workers"], [])


def as_store(run: str | os.PathLike[str] | RunStore) -> tuple[RunStore, bool]:
    """(store, opened_here): open a path for reading, or pass an open store through."""
    if isinstance(run, RunStore):
        run.refresh()
        return run, False
    return RunStore.open(run, "r"), True


def _disk_full(exc: OSError) -> str | None:
    """``No space left on device`` or ``Disk quota exceeded`` where ``exc`` (h5py's, which
    carries the C library's words in its text, not in ``errno``) says the disk is full."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return os.strerror(exc.errno)
    text = str(exc)
    for code in (errno.ENOSPC, errno.EDQUOT):
        if os.strerror(code) in text or f"errno = {code}," in text:
            return os.strerror(code)
    return None


def _need_space(path: Path, need: int, then: str = "") -> None:
    """Refuse a write of about ``need`` bytes the disk holding ``path`` has no room for:
    HDF5 that runs out of space part-way cannot close the file (tracebacks by the
    hundred, then a crash, and a file it cannot read again)."""
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return  # nothing to go on: HDF5 will say
    if free < need:
        then = then or " free some space and run it again"
        raise KingenError(f"the disk holding the run file is full ({free / 1e6:.1f} MB free; "
                          f"the next write needs about {need / 1e6:.1f} MB):{then}",
                          file=str(path))


def _recording_bytes(recording: Recording | None) -> int:
    """The size of a recording's samples (0 for none)."""
    if recording is None:
        return 0
    arrays = [recording.time_ms, recording.current_pA, recording.concentration_mM]
    return 8 * sum(sum(np.asarray(a).size for a in (x if isinstance(x, list) else [x]))
                   for x in arrays if x is not None)
