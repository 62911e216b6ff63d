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
import functools
import json
import math
import os
import platform
import struct
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import h5py
import numpy as np

from kingen import units
from kingen.data import DoseResponseTable, Recording, RecoveryTable, Target, Targets
from kingen.errors import KingenError
from kingen.protocol import Protocol, Pulse, Sweep, Transient
from kingen.scheme import Scheme

try:  # POSIX; elsewhere a run file is not locked against a second writer
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

# 2: every dataset carries a Fletcher-32 checksum; the resume state is plain arrays, not a
# pickle. Version 1 files are refused: resuming one would unpickle what the file holds.
LAYOUT_VERSION = 2
MARKER = "kingen run file"
MAX_COLUMNS = 32  # columns reserved for per-generation statistics and timings
MAX_STATE_DIMS = 3  # dimensions of a resume-state array
# What a resume state may hold: numbers, never objects (nothing in it can run as code).
STATE_KINDS = "biuf"
NAME_BYTES = 64  # fixed-length column names (fixed length: writable under SWMR)
REASON_BYTES = 1024
REQUIRED_GROUPS = ("config", "scheme", "protocols", "data", "targets", "environment",
                   "generations", "hall_of_fame", "best", "resume", "run")
# Every dataset is chunked with a Fletcher-32 checksum per chunk, which HDF5 checks on
# every read: a flipped bit is an error naming the dataset, never a wrong number. Strings
# are fixed-length (a variable-length string lives in a heap no filter covers).
_CHECKSUM = {"fletcher32": True}
# gzip level 1: a third of level 4's time for nearly its ratio. The per-generation float
# arrays (population, errors, fitness) are stored uncompressed: random doubles shrink little,
# and compressing them on the writer thread held the GIL and stalled the GA at 65k candidates.
_GZIP = {"compression": "gzip", "compression_opts": 1, "shuffle": True, **_CHECKSUM}
_ALREADY_OPEN = "already open for write"

# The README's section on the run file; also stored in every file (root attribute `layout`).
LAYOUT_DOC = """\
## The run file

`kingen fit` writes one HDF5 file per run (`output` in the configuration). It holds
everything needed to understand, plot, export and resume the run, and it explains itself:
every dataset carries its unit (`unit`, or `unit_<column>` for tables) and most a
`description`; the root group carries this section as its `layout` attribute.

It is written as the run goes, in HDF5's single-writer/multiple-reader (SWMR) mode:
`kingen plot` and `kingen report` work on a live run, and a run killed at any moment
(even with SIGKILL) leaves a file that opens and holds every completed generation;
`kingen resume RUN.h5` continues it. Read it from Python with
`kingen.store.RunStore.open(path)`, or with any HDF5 tool (h5py, HDFView, `h5dump`); open a
live run with `h5py.File(path, "r", libver="latest", swmr=True)` and trust only the
generations counted by `/run/commit`. A killed run's file keeps HDF5's "open for writing"
flag until `kingen resume` (or `h5clear -s RUN.h5`) clears it.

Every dataset carries a Fletcher-32 checksum (scalars are stored as (1,) arrays, text as
fixed-length UTF-8), checked on every read; opening a run file checks them all, and checks
that the counters agree with the data. The resume state is plain arrays of numbers: no
pickle, eval or exec runs on anything a run file holds. One process writes a run file at a
time (an OS lock on `.<name>.lock` beside it, held for the whole run).

Parameter values are in kingen's internal units (ms⁻¹ for first-order rates, mM⁻¹ ms⁻¹
for binding rates); `/scheme/parameters` also gives them in the scheme file's units.
Times are ms, concentrations mM, currents pA, potentials mV, conductances pS. Tables are
HDF5 compound datasets. `P` is the number of rate constants, `R` the number of protocols,
`N` the population size, `G` the generations completed.

- `/` (attributes): `kingen_run = "kingen run file"` (the marker), `layout_version` (2),
  `kingen_version`, `created` (ISO 8601, UTC), `layout` (this text)
- `/config/text`: the configuration file as given (TOML)
- `/config/settings`: the settings it resolved to, defaults filled in (JSON)
- `/scheme/text`: the scheme file as read; `Scheme.loads` rebuilds the scheme from it
- `/scheme` (attributes): `name`, `source`, `path`, `agonist`, `channels`, `file_units`,
  `reversibility_tolerance`
- `/scheme/states`: table: `name`, `conductance` (pS), `initial` (NaN: equilibrium at zero
  agonist)
- `/scheme/parameters`: table: `name`, `value`, `lower`, `upper`, `unit` (internal),
  `file_value`, `file_lower`, `file_upper`, `file_unit` (the scheme file's), `order`, `scale`,
  `fixed`, `derived`
- `/scheme/transitions`: table: `source`, `target` (state names), `rate` (expression), `factor`,
  `param`, `agonist`, `derived`
- `/protocols` (attribute `names`): protocol names in error-column order (JSON); one group per
  protocol, attributes `name`, `kind`, `source`
- `/protocols/<p>/sweeps`: table: `label`, `duration`, `dt` (ms), `holding`, `reversal` (mV),
  `x` (recovery interval, ms, or dose, mM; NaN if none)
- `/protocols/<p>/pulses`: table: `sweep`, `start`, `duration` (ms), `concentration` (mM),
  `rise`, `decay` (10–90 % exchange times, ms)
- `/protocols/<p>/transients`: table: `sweep`, `start` (ms), `peak` (mM), `tau_decay`,
  `tau_rise` (ms)
- `/data/<p>/`: the recording fitted under protocol `p` (absent if none): `time_ms`,
  `current_pA`, `concentration_mM` (optional) as (sweeps × samples) arrays, NaN padded;
  `n_samples` per sweep; `labels`; attributes `source`, `holding_mV`, `meta` (JSON)
- `/targets/<p>/`: summary targets (absent if none): `features` table (`name`, `value`,
  `weight`, `sd`; units from the name's suffix), `dose_response` (`concentration` mM, `peak`,
  `ss` pA), `recovery` (`interval` ms, `ratio`)
- `/environment` (attributes): kingen, Python, NumPy, SciPy, h5py, HDF5, Numba, DEAP versions,
  platform, device name, backend, precision
- `/generations/generation`: (G,) generation numbers
- `/generations/population`: (G, N, P) every candidate's parameters (internal units); attribute
  `columns`
- `/generations/errors`: (G, N, R) error of every candidate under each protocol; attribute
  `columns`
- `/generations/fitness`: (G, N) total weighted error, lower is better
- `/generations/fail`: (G, N) failure code (0 = simulated fine; −1 = padding)
- `/generations/size`: (G,) candidates in each generation (rows beyond are NaN padding)
- `/generations/stats`, `stats_names`: (G, 32) summary statistics (`best`, `median`, `mean`,
  `n_failed`, …), column names in `stats_names`
- `/generations/timings`, `timings_names`: (G, 32) seconds per generation (`solver_s`, `ga_s`,
  `io_s`, `total_s`, …)
- `/generations/free_mask`: (P,) true for each rate constant the fit searched; attribute
  `population_size` on the group
- `/hall_of_fame/params`, `fitness`, `size`: the best candidates ever seen, best first; the
  first `size` rows are valid
- `/best/`: the best candidate, valid when `valid` = 1: `params` (P,), `fitness`, `errors` and
  `amplitudes` (R,: channels fitted per recording; fitted current = amplitude × one-channel
  current),
  `generation`; `features` (JSON: per protocol, features of the fit and of the data), `polish`
  (JSON: local polish before/after, or null)
- `/best/traces/<p>/`: the best candidate's currents: `time_ms`, `fit_pA`, `data_pA` (sweeps ×
  samples, NaN padded), `n_samples`; sweep labels in `/best/traces_info` (JSON)
- `/resume/slot_0`, `slot_1`: the resume state of the last committed generation, in the slot
  `/run/commit[1]` names, as plain arrays (attribute `fields` names them, `shapes` gives their
  shapes): the population (`genes`, `fitness`, `errors`, `fail`), the hall of fame
  (`hof_genes`, `hof_fitness`), counters, Python's `random` state as integers
  (`python_random*`), NumPy's global generator (`np_global_*`), the fit's PCG64
  (`rng_pcg64`, …), the CMA-ES strategy (`cma_*`); `/resume/generation`, `crc32` per slot
- `/run/commit`: `[generations committed, resume slot, last generation number]`, written last
  after each generation: readers trust only it
- `/run/finished`: why the run stopped (`max_generations`, `no_improvement`, `target_error`,
  `wall_time`, `interrupted`, …); empty while running or if the run was killed; `finished_unix`
  when; attributes `resumed` (times the run was resumed), `writer_pid`, `writer_host`

Errors say what is wrong in one line: a file that is not HDF5 or not a readable one, an HDF5
file that is not a kingen run, a truncated file, a damaged dataset (named), counters that
disagree with the data, a file of another `layout_version` (version 1 held a pickle and is
refused), a missing group, a run file another process writes. A run file is never
half-written by `kingen plot`, `kingen report` or `kingen export`: they only read it, and
write their own outputs through temporary files.
"""


# --------------------------------------------------------------------------- helpers

def _key(name: str) -> str:
    """HDF5 member name for a protocol name ('/' is a path separator in HDF5)."""
    key = name.replace("/", "_")
    return "_" + key if key in ("", ".") else key


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, allow_nan=True)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value[()])
    return str(value)


_STR = "text"  # a table column of text: stored as fixed-length UTF-8


def _strings(values: Any) -> np.ndarray:
    """Text as a fixed-length UTF-8 string array (one byte or more per item)."""
    raw = [str(v).encode("utf-8") for v in values]
    return np.array(raw, dtype=h5py.string_dtype("utf-8", max([1] + [len(b) for b in raw])))


def _dataset(group: h5py.Group, name: str, data: Any, *, compress: bool = False
             ) -> h5py.Dataset:
    """A fixed dataset, chunked so that it carries a checksum; a scalar is stored as (1,)."""
    arr = np.asarray(data)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    # one chunk for small data; HDF5's own choice (bounded chunks) for large
    chunks = tuple(max(1, n) for n in arr.shape) if arr.nbytes <= 1 << 20 else True
    opts = _GZIP if compress else _CHECKSUM
    if arr.size == 0:
        # HDF5 cannot chunk a zero-length extent: leave room for it to be chunked
        return group.create_dataset(name, shape=arr.shape, maxshape=(None,) * arr.ndim,
                                    dtype=arr.dtype, chunks=(1,) * arr.ndim, **opts)
    return group.create_dataset(name, data=arr, chunks=chunks, **opts)


def _text_dataset(group: h5py.Group, name: str, text: str) -> h5py.Dataset:
    return _dataset(group, name, _strings([text]))


def _table(group: h5py.Group, name: str, columns: list[tuple[str, Any, np.dtype | Any]],
           rows: int, units: Mapping[str, str] | None = None, doc: str = "") -> h5py.Dataset:
    """A compound dataset (a table); column units go into ``unit_<column>`` attributes."""
    cols = [(c, _strings(v) if t is _STR else np.asarray(v, dtype=t)) for c, v, t in columns]
    dtype = np.dtype([(c, v.dtype) for c, v in cols])
    arr = np.zeros(rows, dtype=dtype)
    for c, values in cols:
        arr[c] = values if rows else []
    ds = _dataset(group, name, arr)
    for column, unit in (units or {}).items():
        ds.attrs[f"unit_{column}"] = unit
    if doc:
        ds.attrs["description"] = doc
    return ds


def _col(table: np.ndarray, name: str) -> list[Any]:
    return [_text(v) if isinstance(v, (bytes, str)) else v for v in table[name]]


def _extendable(group: h5py.Group, name: str, shape: tuple[int, ...], dtype: Any,
                fill: Any, *, unit: str | None = None, doc: str = "",
                compress: bool = True, chunk_rows: int | None = None) -> h5py.Dataset:
    """An empty dataset, extendable on every axis of length 0 or marked None."""
    start = tuple(0 if s is None else s for s in shape)
    maxshape = tuple(None for _ in shape)
    row = int(np.prod([max(1, s or 1) for s in shape[1:]])) * np.dtype(dtype).itemsize
    rows = chunk_rows or max(1, min(64, (1 << 16) // max(row, 1)))
    chunks = (rows,) + tuple(max(1, min(s or 1024, 4096)) for s in shape[1:])
    opts = _GZIP if compress else _CHECKSUM
    ds = group.create_dataset(name, shape=start, maxshape=maxshape, dtype=dtype, chunks=chunks,
                              fillvalue=fill, **opts)
    if unit is not None:
        ds.attrs["unit"] = unit
    if doc:
        ds.attrs["description"] = doc
    return ds


def _damaged(ds: h5py.Dataset, exc: BaseException) -> KingenError:
    detail = " ".join(str(exc).split())
    # HDF5 2 says only "filter returned failure"; the Fletcher-32 filter is the one that
    # fails on damaged data (it runs first when reading, before any decompression)
    failed = any(w in detail.lower() for w in ("checksum", "filter returned failure"))
    what = ("its data fail their Fletcher-32 checksum" if failed
            else f"its data cannot be read (HDF5 says: {detail})")
    return KingenError(f"damaged run file: {what}; restore the file from a copy",
                       file=ds.file.filename, field=ds.name)


# A reader of a live run may catch a chunk while the writer rewrites it in place: a failed
# checksum is read again (after a refresh) before the file is called damaged.
_READ_TRIES = 3


def _load(ds: h5py.Dataset, sel: Any = ()) -> Any:
    """``ds[sel]``, verified: a failed checksum is a KingenError naming the dataset."""
    for attempt in range(_READ_TRIES):
        try:
            return ds[sel]
        except OSError as exc:
            if attempt + 1 == _READ_TRIES or not ds.file.swmr_mode or ds.file.mode != "r":
                raise _damaged(ds, exc) from None
            time.sleep(0.05)
            ds.refresh()
    raise AssertionError("unreachable")  # pragma: no cover


def _one(ds: h5py.Dataset) -> Any:
    """The single value of a (1,) dataset (scalars are stored so, to carry a checksum)."""
    value = _load(ds, 0) if ds.shape == (1,) else None
    if value is None:
        raise KingenError(f"inconsistent run file: shape {ds.shape} where one value belongs",
                          file=ds.file.filename, field=ds.name)
    return value


def _grow(ds: h5py.Dataset, shape: tuple[int, ...]) -> None:
    """Extend ``ds`` so it is at least ``shape`` (never shrink: SWMR allows only growth)."""
    new = tuple(max(a, b) for a, b in zip(ds.shape, shape, strict=True))
    if new != ds.shape:
        ds.resize(new)


def _padded(rows: list[np.ndarray], width: int, fill: float = np.nan) -> np.ndarray:
    out = np.full((len(rows), width), fill)
    for i, r in enumerate(rows):
        out[i, : r.size] = r
    return out


def _default_environment() -> dict[str, str]:
    import scipy

    from kingen import __version__

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


# --------------------------------------------------------------------------- the writer lock

class WriterLock:
    """An OS lock (``flock``) held by the one process that writes a run file.

    The lock is on a hidden sibling, ``.<run file name>.lock``, not on the run file: the
    run file is replaced (``--overwrite``, a killed run's rebuild) while the lock is held.
    The holder writes its PID and host into the lock file, for the refusal message. The
    OS drops the lock when the holder dies, however it dies, so a killed run never leaves
    a stale lock.
    """

    def __init__(self, run_path: Path) -> None:
        self.run_path = run_path
        self.path = run_path.with_name(f".{run_path.name}.lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise KingenError naming the process that holds it."""
        if fcntl is None or self._fd is not None:  # pragma: no cover - not POSIX
            return
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise KingenError(f"cannot create the lock file {self.path.name} beside the "
                                  f"run file: {exc.strerror}", file=str(self.run_path)
                                  ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.read(fd, 200).decode("utf-8", "replace").split()
                os.close(fd)
                who = (f"process {holder[0]} on {holder[1]}" if len(holder) >= 2
                       else "another process")
                raise KingenError(f"the run file is being written by {who} (lock "
                                  f"{self.path.name}); wait for that run to end, or stop it",
                                  file=str(self.run_path)) from None
            # The previous holder removes the lock file before letting go: if the path no
            # longer names the file locked here, lock again.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {platform.node()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Let go of the lock (removing the lock file first, while still holding it)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None


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
               inputs: Mapping[str, str] | None = None, overwrite: bool = False) -> RunStore:
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

        Raises
        ------
        KingenError
            If the file exists (and not ``overwrite``, or it is not a kingen run file, or
            another process writes it) or cannot be written, or the inputs disagree
            (protocol names, mask length).
        """
        p = Path(path)
        name = str(p)
        if p.is_dir():
            raise KingenError("is a directory, not a run file", file=name)
        _refuse_inputs(p, inputs or {})
        if p.exists() and not overwrite:
            raise KingenError("run file already exists (choose another output file, or "
                              "overwrite it)", file=name)
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
        # Locked before anything is deleted: a run another process writes is never replaced.
        lock = WriterLock(p)
        lock.acquire()
        try:
            if p.exists():
                _refuse_non_run(p)
            try:
                p.unlink(missing_ok=True)
                f = h5py.File(p, "w", libver="latest")
            except OSError as exc:
                raise KingenError(f"cannot create the run file: {exc}", file=name) from None
            try:
                env = {**_default_environment(), **{k: str(v) for k, v in environment.items()}}
                _write_static(f, config_text=config_text, config=config, scheme=scheme,
                              protocols=protocols, recordings=recordings, targets=targets,
                              free_mask=mask, population_size=int(population_size),
                              environment=env, state_fields=fields)
                f.flush()
                f.swmr_mode = True
                return cls(f, p, "w", lock)
            except BaseException:
                f.close()
                p.unlink(missing_ok=True)
                raise
        except BaseException:
            lock.release()
            raise

    # ------------------------------------------------------------------ open
    @classmethod
    def open(cls, path: str | os.PathLike[str], mode: str = "r", *, verify: bool = True
             ) -> RunStore:
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

        Raises
        ------
        KingenError
            If the file is missing, not HDF5, not a kingen run, corrupt, damaged or
            truncated, inconsistent, of another layout version, lacks a group, or (mode
            ``"a"``) another process writes it.

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
        lock = WriterLock(p)
        lock.acquire()
        try:
            with cls.open(p, "r", verify=verify):
                pass  # validated (and verified) before anything is written
            f = _open_append(p)
            try:
                store = cls(f, p, "w", lock)
                resumed = json.loads(_text(f["run"].attrs.get("resumed", "[]")))
                f["run"].attrs["resumed"] = _dumps(resumed + [_now()])
                f["run/finished"][0] = np.bytes_(b"")  # running again
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
        ds = self._f[name]
        if self.mode == "r" and self._f.swmr_mode:
            ds.refresh()
        return ds

    def _commit(self) -> np.ndarray:
        return np.asarray(_load(self._ds("run/commit")), dtype=np.int64)

    def _read(self, name: str, sel: Any = ()) -> Any:
        """``self._f[name][sel]``, fresh (a live run) and verified (names a damaged dataset)."""
        return _load(self._ds(name), sel)

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
        per sweep; ``data_pA`` may be None) and ``labels``. ``amplitudes[protocol]`` is the
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
            for ds_name, rows in (("fit_pA", fits), ("data_pA", datas)):
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
        _write_json(best["traces_info"], info)
        _write_json(best["features"], dict(features))
        _write_json(best["polish"], polish)
        best["generation"][0] = int(self._commit()[2]) if self._commit()[0] else -1
        f.flush()
        best["valid"][0] = 1
        f.flush()

    def mark_finished(self, reason: str) -> None:
        """Record why the run stopped (e.g. ``"max_generations"``, ``"interrupted"``)."""
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


# --------------------------------------------------------------------------- static writers

def _write_json(ds: h5py.Dataset, obj: Any) -> None:
    """JSON as UTF-8 bytes in an extendable uint8 dataset, NUL padded.

    A string dataset cannot change size under SWMR, and the dataset never shrinks, so a
    shorter text leaves NULs behind it, which :func:`_read_json` strips.
    """
    raw = np.frombuffer(_dumps(obj).encode("utf-8"), dtype=np.uint8)
    _grow(ds, (raw.size,))
    full = np.zeros(ds.shape[0], dtype=np.uint8)
    full[: raw.size] = raw
    ds[...] = full


def _read_json(ds: h5py.Dataset) -> Any:
    raw = bytes(np.asarray(_load(ds), dtype=np.uint8)).rstrip(b"\0")
    return json.loads(raw.decode("utf-8")) if raw else None


def _json_blob(group: h5py.Group, name: str, doc: str) -> h5py.Dataset:
    ds = _extendable(group, name, (None,), np.uint8, 0, chunk_rows=4096)
    ds.attrs["content"] = "UTF-8 JSON text as bytes, NUL padded"
    ds.attrs["description"] = doc
    _write_json(ds, None)
    return ds


def _write_static(f: h5py.File, *, config_text: str, config: dict[str, Any], scheme: Scheme,
                  protocols: list[Protocol], recordings: Mapping[str, Recording | None],
                  targets: Mapping[str, Targets | None], free_mask: np.ndarray,
                  population_size: int, environment: Mapping[str, str],
                  state_fields: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> None:
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
        _write_protocol(pg.create_group(_key(p.name)), p)

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
        for name, unit in (("time_ms", "ms"), ("fit_pA", "pA"), ("data_pA", "pA")):
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

    run = f.create_group("run")
    _dataset(run, "commit", np.array([0, 0, -1], dtype=np.int64))
    run["commit"].attrs["description"] = ("[generations committed, resume slot, last "
                                          "generation number]; written last")
    _dataset(run, "finished", np.array(b"", dtype=f"S{REASON_BYTES}"))
    _dataset(run, "finished_unix", np.float64(np.nan))
    run["finished_unix"].attrs["unit"] = "s since 1970-01-01 UTC"
    run.attrs["resumed"] = "[]"
    _mark_writer(run)


def _mark_writer(run: h5py.Group) -> None:
    """Record which process writes the file (attributes are fixed once SWMR starts)."""
    run.attrs["writer_pid"] = os.getpid()
    run.attrs["writer_host"] = platform.node()


def _live_writer(f: h5py.File) -> int | None:
    """The id of a process on this host that is still writing the file, if any."""
    run = f["run"]
    pid = int(run.attrs.get("writer_pid", 0))
    if not pid or _text(run.attrs.get("writer_host", "")) != platform.node():
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def _write_scheme(g: h5py.Group, s: Scheme) -> None:
    g.attrs.update({"name": s.name, "source": s.source, "path": s.path, "agonist": s.agonist,
                    "channels": s.channels, "file_units": _dumps(s.file_units),
                    "reversibility_tolerance": s.reversibility_tolerance})
    _text_dataset(g, "text", s.text)
    g["text"].attrs["description"] = "the scheme file as read; Scheme.loads(text) rebuilds it"
    init = s.initial if s.initial is not None else np.full(s.n_states, np.nan)
    _table(g, "states", [("name", s.states, _STR), ("conductance", s.conductance, "f8"),
                         ("initial", init, "f8")], s.n_states,
           {"conductance": "pS", "initial": "1"}, "initial NaN: equilibrium at zero agonist")
    pars = s.parameters
    fac = np.array([units.parse_rate_unit(p.unit)[0] for p in pars])
    _table(g, "parameters", [
        ("name", [p.name for p in pars], _STR),
        ("value", s.values, "f8"), ("lower", s.lower, "f8"), ("upper", s.upper, "f8"),
        ("unit", [p.internal_unit for p in pars], _STR),
        ("file_value", s.values / fac, "f8"), ("file_lower", s.lower / fac, "f8"),
        ("file_upper", s.upper / fac, "f8"), ("file_unit", [p.unit for p in pars], _STR),
        ("order", [p.order for p in pars], "i4"), ("scale", [p.scale for p in pars], _STR),
        ("fixed", [p.fixed for p in pars], "?"), ("derived", [p.derived for p in pars], "?"),
    ], s.n_params, {"value": "see column unit", "file_value": "see column file_unit"},
        "value/lower/upper in internal units; file_* in the scheme file's units")
    ts = s.transitions
    _table(g, "transitions", [
        ("source", [s.states[t.source] for t in ts], _STR),
        ("target", [s.states[t.target] for t in ts], _STR),
        ("rate", [t.expression for t in ts], _STR),
        ("factor", [t.factor for t in ts], "f8"),
        ("param", [s.parameters[t.param].name for t in ts], _STR),
        ("agonist", [t.agonist for t in ts], "?"), ("derived", [t.derived for t in ts], "?"),
    ], len(ts), doc="rate = factor * param [* agonist concentration]")


def _write_protocol(g: h5py.Group, p: Protocol) -> None:
    g.attrs.update({"name": p.name, "kind": p.kind, "source": p.source,
                    "meta": _dumps(p.meta)})
    sw = p.sweeps
    _table(g, "sweeps", [
        ("label", [s.label for s in sw], _STR), ("duration", [s.duration for s in sw], "f8"),
        ("dt", [s.dt for s in sw], "f8"), ("holding", [s.holding for s in sw], "f8"),
        ("reversal", [s.reversal for s in sw], "f8"),
        ("x", [np.nan if s.x is None else s.x for s in sw], "f8"),
    ], len(sw), {"duration": "ms", "dt": "ms", "holding": "mV", "reversal": "mV",
                 "x": "ms (recovery interval) or mM (dose); NaN: none"})
    pulses = [(i, q) for i, s in enumerate(sw) for q in s.pulses]
    _table(g, "pulses", [
        ("sweep", [i for i, _ in pulses], "i4"), ("start", [q.start for _, q in pulses], "f8"),
        ("duration", [q.duration for _, q in pulses], "f8"),
        ("concentration", [q.concentration for _, q in pulses], "f8"),
        ("rise", [q.rise for _, q in pulses], "f8"), ("decay", [q.decay for _, q in pulses], "f8"),
    ], len(pulses), {"start": "ms", "duration": "ms", "concentration": "mM",
                     "rise": "ms (10-90 %)", "decay": "ms (10-90 %)"})
    trs = [(i, q) for i, s in enumerate(sw) for q in s.transients]
    _table(g, "transients", [
        ("sweep", [i for i, _ in trs], "i4"), ("start", [q.start for _, q in trs], "f8"),
        ("peak", [q.peak for _, q in trs], "f8"),
        ("tau_decay", [q.tau_decay for _, q in trs], "f8"),
        ("tau_rise", [q.tau_rise for _, q in trs], "f8"),
    ], len(trs), {"start": "ms", "peak": "mM", "tau_decay": "ms", "tau_rise": "ms"})


def _read_protocol(g: h5py.Group) -> Protocol:
    sweeps = _load(g["sweeps"])
    pulses = _load(g["pulses"])
    trs = _load(g["transients"])
    out = []
    for i, row in enumerate(sweeps):
        ps = tuple(Pulse(float(q["start"]), float(q["duration"]), float(q["concentration"]),
                         float(q["rise"]), float(q["decay"])) for q in pulses if q["sweep"] == i)
        ts = tuple(Transient(float(q["start"]), float(q["peak"]), float(q["tau_decay"]),
                             float(q["tau_rise"])) for q in trs if q["sweep"] == i)
        x = float(row["x"])
        out.append(Sweep(_text(row["label"]), float(row["duration"]), float(row["dt"]), ps, ts,
                         float(row["holding"]), float(row["reversal"]),
                         None if math.isnan(x) else x))
    return Protocol(_text(g.attrs["name"]), _text(g.attrs["kind"]), tuple(out),
                    source=_text(g.attrs.get("source", "<built-in>")),
                    meta=json.loads(_text(g.attrs.get("meta", "{}"))))


def _write_recording(g: h5py.Group, name: str, rec: Recording) -> None:
    times = rec.times_list()
    width = max((t.size for t in times), default=0)
    g.attrs.update({"protocol": name, "source": rec.source,
                    "recording_protocol": rec.protocol or "",
                    "holding_mV": np.nan if rec.holding_mV is None else rec.holding_mV,
                    "meta": _dumps({k: v for k, v in rec.meta.items()})})
    _dataset(g, "labels", _strings(rec.sweep_labels))
    _dataset(g, "n_samples", np.array([t.size for t in times], dtype=np.int64))
    for ds_name, rows, unit in (("time_ms", times, "ms"),
                                ("current_pA", rec.currents_list(), "pA")):
        _dataset(g, ds_name, _padded(rows, width), compress=True)
        g[ds_name].attrs["unit"] = unit
    if rec.concentration_mM is not None:
        concs = [np.asarray(rec.sweep_concentration(i)) for i in range(rec.n_sweeps)]
        _dataset(g, "concentration_mM", _padded(concs, width), compress=True)
        g["concentration_mM"].attrs["unit"] = "mM"
    g.attrs["description"] = "one row per sweep, NaN padded; n_samples gives each length"


def _read_recording(g: h5py.Group) -> Recording:
    n = _load(g["n_samples"])
    labels = [_text(v) for v in _load(g["labels"])]

    def rows(name: str) -> list[np.ndarray]:
        a = _load(g[name])
        return [a[i, : n[i]] for i in range(len(n))]

    hold = float(g.attrs.get("holding_mV", np.nan))
    return Recording(_text(g.attrs.get("recording_protocol", "")) or None, rows("time_ms"),
                     rows("current_pA"), labels,
                     rows("concentration_mM") if "concentration_mM" in g else None,
                     None if math.isnan(hold) else hold, _text(g.attrs.get("source", "")),
                     json.loads(_text(g.attrs.get("meta", "{}"))))


def _write_targets(g: h5py.Group, name: str, t: Targets) -> None:
    g.attrs["protocol"] = name
    g.attrs["sources"] = _dumps(t.sources)
    feats = list(t.features.items())
    _table(g, "features", [
        ("name", [k for k, _ in feats], _STR), ("value", [v.value for _, v in feats], "f8"),
        ("weight", [v.weight for _, v in feats], "f8"),
        ("sd", [np.nan if v.sd is None else v.sd for _, v in feats], "f8"),
    ], len(feats), doc="value and sd in the unit of the feature name's suffix (internal)")
    if t.dose_response is not None:
        d = t.dose_response
        ss = np.full(len(d.concentration_mM), np.nan) if d.ss_pA is None else d.ss_pA
        _table(g, "dose_response", [("concentration", d.concentration_mM, "f8"),
                                    ("peak", d.peak_pA, "f8"), ("ss", ss, "f8")],
               len(d.concentration_mM), {"concentration": "mM", "peak": "pA", "ss": "pA"})
    if t.recovery is not None:
        r = t.recovery
        _table(g, "recovery", [("interval", r.interval_ms, "f8"), ("ratio", r.ratio, "f8")],
               len(r.interval_ms), {"interval": "ms", "ratio": "1"})


def _read_targets(g: h5py.Group) -> Targets:
    feats = {}
    for row in _load(g["features"]):
        sd = float(row["sd"])
        feats[_text(row["name"])] = Target(float(row["value"]), float(row["weight"]),
                                           None if math.isnan(sd) else sd)
    dose = rec = None
    if "dose_response" in g:
        d = _load(g["dose_response"])
        ss = np.asarray(d["ss"], dtype=float)
        dose = DoseResponseTable(np.asarray(d["concentration"], dtype=float),
                                 np.asarray(d["peak"], dtype=float),
                                 None if np.all(np.isnan(ss)) else ss)
    if "recovery" in g:
        r = _load(g["recovery"])
        rec = RecoveryTable(np.asarray(r["interval"], dtype=float),
                            np.asarray(r["ratio"], dtype=float))
    return Targets(feats, dose, rec, json.loads(_text(g.attrs.get("sources", "[]"))))


# --------------------------------------------------------------------------- opening

def _corrupt(name: str, exc: BaseException) -> KingenError:
    detail = " ".join(str(exc).split()) or type(exc).__name__
    return KingenError(f"not a readable HDF5 file: corrupt or truncated run file (HDF5 says: "
                       f"{detail})", file=name)


def _unreadable(p: Path) -> KingenError:
    # HDF5's own words vary between its versions and say little more: left out
    return KingenError("not a readable HDF5 file: its header (superblock) or metadata is "
                       "damaged, or the file is incomplete", file=str(p))


def _superblock(p: Path) -> tuple[int, int] | None:
    """(consistency flags, end-of-file address) of a version 2 or 3 HDF5 superblock.

    None for other superblocks (or a user block before it): the checks that use it are
    then left to HDF5.
    """
    with open(p, "rb") as fh:
        head = fh.read(48)
    if len(head) < 48 or head[:8] != b"\x89HDF\r\n\x1a\n" or head[8] not in (2, 3):
        return None
    if head[9] != 8:  # size of offsets: kingen files, like h5py's, use 8
        return None
    return head[11], struct.unpack("<Q", head[28:36])[0]


def _check_eof(p: Path) -> tuple[int, int] | None:
    """The superblock's (flags, end of file); KingenError if the file is shorter."""
    info = _superblock(p)
    size = p.stat().st_size
    if info is not None and info[1] > size:
        # Checked here because an SWMR reader skips HDF5's own check, then waits on
        # metadata that is not there.
        raise KingenError(f"truncated run file: {size} bytes where its HDF5 header says "
                          f"{info[1]} (an incomplete copy?)", file=str(p))
    return info


def _open_read(p: Path) -> h5py.File:
    """Open for reading: as an SWMR reader when a writer has (or had) the file open."""
    info = _check_eof(p)
    swmr_first = info is None or info[0] != 0
    attempts = (True, False) if swmr_first else (False,)
    error: Exception | None = None
    for swmr in attempts:
        try:
            if swmr:
                return h5py.File(p, "r", libver="latest", swmr=True, locking=False)
            return h5py.File(p, "r", locking=False)
        # h5py raises RuntimeError for some damaged superblocks
        except (OSError, RuntimeError, ValueError) as exc:
            error = error or exc
    assert error is not None
    raise _unreadable(p) from None


def _open_append(p: Path) -> h5py.File:
    _check_eof(p)
    try:
        return h5py.File(p, "a", libver="latest")
    except (OSError, RuntimeError, ValueError) as exc:
        if _ALREADY_OPEN not in str(exc):
            raise _unreadable(p) from None
    # The superblock still says a writer has the file: either one does, or a run was
    # killed. A live writer would have to be stopped first; a killed run's file is
    # rebuilt from what it committed.
    _rebuild(p)
    try:
        return h5py.File(p, "a", libver="latest")
    except (OSError, RuntimeError, ValueError):
        raise _unreadable(p) from None


def _rebuild(p: Path) -> None:
    """Copy a file left open by a killed writer into a fresh file, then swap it in.

    HDF5 refuses to open such a file for writing (its superblock still marks the writer);
    an SWMR reader can read it, and everything it committed is copied. A kill during the
    copy leaves the original untouched.
    """
    tmp = p.with_name(f".{p.name}.rebuild.tmp")
    src = _open_read(p)
    try:
        _validate(src, str(p))
        pid = _live_writer(src)
        if pid is not None:
            raise KingenError(f"the run is still being written by process {pid}: stop it "
                              "before resuming", file=str(p))
        with h5py.File(tmp, "w", libver="latest") as dst:
            for k, v in src.attrs.items():
                dst.attrs[k] = v
            for member in src:
                src.copy(src[member], dst, name=member)
    except BaseException:
        src.close()
        tmp.unlink(missing_ok=True)
        raise
    src.close()
    os.replace(tmp, p)


def _validate(f: h5py.File, name: str) -> None:
    marker = f.attrs.get("kingen_run")
    if marker is None or _text(marker) != MARKER:
        raise KingenError("an HDF5 file, but not a kingen run file (no 'kingen_run' "
                          "attribute on its root group)", file=name)
    version = f.attrs.get("layout_version")
    try:
        version = int(version)
    except (TypeError, ValueError):
        raise KingenError("run file without a valid layout version", file=name,
                          field="/layout_version", value=version) from None
    if version > LAYOUT_VERSION:
        raise KingenError(f"run file of layout version {version}, written by a newer kingen; "
                          f"this kingen reads up to version {LAYOUT_VERSION}: upgrade kingen "
                          "(pip install -U kingen)", file=name, field="/layout_version",
                          value=version)
    if version < LAYOUT_VERSION:
        # Version 1 kept the resume state as a pickle, which runs code when it is read: such
        # a file is not read at all (not even its plots), rather than half-trusted.
        raise KingenError(f"run file of layout version {version}, from an older kingen: its "
                          "resume state is a Python pickle, which could run code when read, "
                          f"so this kingen (layout version {LAYOUT_VERSION}) refuses it; run "
                          "the fit again", file=name, field="/layout_version", value=version)
    for group in REQUIRED_GROUPS:
        if group not in f or not isinstance(f[group], h5py.Group):
            raise KingenError("missing group: the run file is incomplete or was edited",
                              file=name, field=f"/{group}")


def _inconsistent(name: str, field: str, value: Any, what: str) -> KingenError:
    return KingenError(f"inconsistent run file: {what}", file=name, field=field, value=value)


def _check_consistency(f: h5py.File, name: str) -> list[str]:
    """Check once, at opening, that the counters agree with the data; returns the protocol
    names. Attributes carry no checksum, so they are checked against the datasets too."""
    _validate(f, name)
    try:
        names = json.loads(_text(f["protocols"].attrs["names"]))
    except (KeyError, ValueError) as exc:
        raise _inconsistent(name, "/protocols.names", None, f"unreadable ({exc})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _inconsistent(name, "/protocols.names", names, "not a list of protocol names")
    for n in names:
        if _key(n) not in f["protocols"] or not isinstance(f["protocols"][_key(n)], h5py.Group):
            raise _inconsistent(name, "/protocols.names", n, "no group for this protocol")

    def ds(path: str, ndim: int, kind: str) -> h5py.Dataset:
        obj = f.get(path)
        if not isinstance(obj, h5py.Dataset):
            raise _inconsistent(name, f"/{path}", None, "missing dataset")
        if obj.ndim != ndim or obj.dtype.kind not in kind:
            raise _inconsistent(name, f"/{path}", f"{obj.dtype} {obj.shape}",
                                f"expected {ndim} dimensions of kind {kind!r}")
        if f.swmr_mode and f.mode == "r":
            obj.refresh()
        return obj

    n_par = ds("scheme/parameters", 1, "V").shape[0]
    n_prot = len(names)
    commit = np.asarray(_load(ds("run/commit", 1, "iu")), dtype=np.int64)
    if commit.shape != (3,):
        raise _inconsistent(name, "/run/commit", commit.shape, "expected 3 counters")
    rows, slot = int(commit[0]), int(commit[1])
    gen = {k: ds(f"generations/{k}", nd, kind) for k, nd, kind in (
        ("population", 3, "f"), ("errors", 3, "f"), ("fitness", 2, "f"), ("fail", 2, "i"),
        ("generation", 1, "i"), ("size", 1, "i"), ("stats", 2, "f"), ("timings", 2, "f"))}
    if rows < 0 or any(d.shape[0] < rows for d in gen.values()):
        short = min(d.shape[0] for d in gen.values())
        raise _inconsistent(name, "/run/commit[0]", rows, f"generations committed, but "
                            f"{short} rows stored")
    if slot not in (0, 1):
        raise _inconsistent(name, "/run/commit[1]", slot, "resume slot out of range (0 or 1)")
    width = gen["population"].shape[1]
    widths = {"population": (width, n_par), "errors": (width, n_prot), "fitness": (width,),
              "fail": (width,), "stats": (MAX_COLUMNS,), "timings": (MAX_COLUMNS,)}
    for k, want in widths.items():
        if gen[k].shape[1:] != want:
            raise _inconsistent(name, f"/generations/{k}", gen[k].shape,
                                f"rows of the wrong width (expected {want})")
    if rows:
        sizes = np.asarray(_load(gen["size"], np.s_[:rows]))
        bad = np.flatnonzero((sizes < 0) | (sizes > width))
        if bad.size:
            raise _inconsistent(name, f"/generations/size[{bad[0]}]", int(sizes[bad[0]]),
                                f"more candidates than the {width} rows stored")
        last = int(_load(gen["generation"], rows - 1))
        if last != int(commit[2]):
            raise _inconsistent(name, "/run/commit[2]", int(commit[2]), "is not the last "
                                f"committed generation number ({last})")
        res = f["resume"]
        if f"slot_{slot}" not in res:
            raise _inconsistent(name, f"/resume/slot_{slot}", None, "missing resume slot")
    for path, length in (("generations/free_mask", n_par), ("best/params", n_par),
                         ("best/errors", n_prot), ("best/amplitudes", n_prot),
                         ("generations/stats_names", MAX_COLUMNS),
                         ("generations/timings_names", MAX_COLUMNS)):
        d = ds(path, 1, "biufS")
        if d.shape[0] != length:
            raise _inconsistent(name, f"/{path}", d.shape[0], f"length, expected {length}")
    hof_size = int(_one(ds("hall_of_fame/size", 1, "iu")))
    hof = ds("hall_of_fame/params", 2, "f")
    hof_fit = ds("hall_of_fame/fitness", 1, "f")
    if hof.shape[1:] != (n_par,) or not 0 <= hof_size <= min(hof.shape[0], hof_fit.shape[0]):
        raise _inconsistent(name, "/hall_of_fame/size", hof_size, "does not match the stored "
                            f"hall of fame {hof.shape}")
    for p in names:
        g = f["data"].get(_key(p))
        if isinstance(g, h5py.Group):
            n_samples = np.asarray(_load(ds(f"{g.name[1:]}/n_samples", 1, "iu")))
            cur = ds(f"{g.name[1:]}/current_pA", 2, "f")
            if n_samples.shape[0] != cur.shape[0] or (n_samples > cur.shape[1]).any() or (
                    n_samples < 0).any():
                raise _inconsistent(name, f"{g.name}/n_samples", n_samples.tolist(),
                                    f"does not match the stored sweeps {cur.shape}")
    return names


def _state_schema(fields: Mapping[str, tuple[Any, tuple[int, ...]]]
                  ) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    out = {}
    for name, (dtype, shape) in fields.items():
        dt = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        if (not name or "/" in name or name in ("shapes", ".") or dt.kind not in STATE_KINDS
                or len(shape) > MAX_STATE_DIMS):
            raise ValueError(f"resume state field {name!r}: numbers of up to "
                             f"{MAX_STATE_DIMS} dimensions only ({dt}, {shape})")
        out[name] = (dt, shape)
    return out


def _state_names(g: h5py.Group) -> list[str]:
    """A resume slot's field names, checked: each a dataset of numbers, nothing else."""
    where = g.name
    try:
        names = json.loads(_text(g.attrs["fields"]))
    except (KeyError, ValueError):
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise KingenError("inconsistent run file: no list of resume state fields",
                          file=g.file.filename, field=f"{where}.fields")
    if set(g) != set(names) | {"shapes"}:
        raise KingenError("inconsistent run file: resume state fields do not match the slot's "
                          "datasets", file=g.file.filename, field=where,
                          value=sorted(set(g) ^ (set(names) | {"shapes"})))
    shapes = g["shapes"]
    if not isinstance(shapes, h5py.Dataset) or shapes.shape != (
            max(len(names), 1), MAX_STATE_DIMS) or shapes.dtype.kind != "i":
        raise KingenError("inconsistent run file: malformed table of resume state shapes",
                          file=g.file.filename, field=f"{where}/shapes")
    for n in names:
        ds = g[n]
        ndim = ds.attrs.get("ndim") if isinstance(ds, h5py.Dataset) else None
        if (ndim is None or ds.dtype.kind not in STATE_KINDS or ds.dtype.fields is not None
                or int(ndim) != ds.ndim - (ds.ndim == 1 and int(ndim) == 0)):
            raise KingenError("malformed resume state: only arrays of numbers are read",
                              file=g.file.filename, field=f"{where}/{n}",
                              value=str(getattr(ds, "dtype", type(ds).__name__)))
    return names


def _refuse_inputs(p: Path, inputs: Mapping[str, str]) -> None:
    """KingenError if ``p`` is one of the run's input files."""
    for path, role in inputs.items():
        q = Path(path)
        same = q.resolve() == p.resolve()
        if not same and q.exists() and p.exists():
            same = os.path.samefile(q, p)
        if same:
            raise KingenError(f"output is this fit's {role} ({path}); refusing to overwrite "
                              "an input: choose another output file", file=str(p))


def _refuse_non_run(p: Path) -> None:
    """KingenError unless ``p`` carries the kingen run-file marker (it is then replaced)."""
    if not is_run_file(p):
        raise KingenError("not a kingen run file; refusing to overwrite it (choose another "
                          "output file, or remove this one yourself)", file=str(p))


def is_run_file(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is an HDF5 file with the kingen run marker (of any layout version,
    damaged or not: only the marker is read)."""
    p = Path(path)
    try:
        if not p.is_file() or p.stat().st_size == 0 or not h5py.is_hdf5(p):
            return False
        with _open_read(p) as f:
            marker = f.attrs.get("kingen_run")
            return marker is not None and _text(marker) == MARKER
    except (KingenError, OSError, RuntimeError, ValueError):
        return False


def as_store(run: str | os.PathLike[str] | RunStore) -> tuple[RunStore, bool]:
    """(store, opened_here): open a path for reading, or pass an open store through."""
    if isinstance(run, RunStore):
        run.refresh()
        return run, False
    return RunStore.open(run, "r"), True


__all__ = ["LAYOUT_DOC", "LAYOUT_VERSION", "RunStore", "as_store", "is_run_file"]
