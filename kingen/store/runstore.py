"""The HDF5 run file: everything a fit knows, written as the run goes.

One file per run holds the configuration, the scheme, the protocols, the data and targets,
one row per generation (population, errors, fitness, failure codes, statistics, timings),
the hall of fame, the best candidate with its traces, the environment, and the resume state
of the last generation (plain arrays, never a pickle). The layout is described in the documentation
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

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kingen.errors import KingenError
from kingen.experiment.chain import Chain
from kingen.experiment.protocol import Protocol
from kingen.experiment.recordings import Recording, Targets
from kingen.model.scheme import Scheme
from kingen.store.consistency import check_consistency, state_names, state_schema
from kingen.store.datasets import column_values, dumps, load, load_one, member_key
from kingen.store.integrity import (
    WriterLock,
    corrupt_error,
    mark_writer,
    open_append,
    open_read,
    refuse_inputs,
    refuse_non_run,
)
from kingen.store.reading import reading
from kingen.store.space import need_space, recording_bytes
from kingen.store.static import default_environment, lost_workers_blob, now_utc, write_static
from kingen.store.writing import RunWriter

# --------------------------------------------------------------------------- the store

class RunStore(RunWriter):
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
        self._protocol_names: list[str] = check_consistency(f, str(path))
        self._param_names = column_values(load(f["scheme/parameters"]), "name")

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
        fields = state_schema(state_fields or {})
        names = [pr.name for pr in protocols]
        keys = [member_key(n) for n in names]
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
        need_space(p, 2 * sum(recording_bytes(r) for r in recordings.values()) + (8 << 20))
        # Locked before anything is deleted: a run another process writes is never replaced.
        lock = WriterLock(p)
        lock.acquire()
        try:
            # An earlier run (overwrite) stays until the new one commits its first
            # generation: a fit that stops before that leaves it as it was.
            old = p.exists()
            if old:
                refuse_non_run(p)
            target = p.with_name(f".{p.name}.new") if old else p
            try:
                target.unlink(missing_ok=True)
                f = h5py.File(target, "w", libver="latest")
            except OSError as exc:
                raise KingenError(f"cannot create the run file: {exc}", file=name) from None
            try:
                env = {**default_environment(), **{k: str(v) for k, v in environment.items()}}
                write_static(f, config_text=config_text, config=config, scheme=scheme,
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
        refuse_inputs(p, inputs or {})
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
            f = open_read(p)
            try:
                store = cls(f, p, "r")
                if verify:
                    store.verify()
            except KingenError:
                f.close()
                raise
            except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
                f.close()
                raise corrupt_error(name, exc) from None
            return store
        if lock is None:
            lock = WriterLock(p)
        lock.acquire()
        try:
            with cls.open(p, "r", verify=verify) as reader:
                # validated (and verified) before anything is written; so are both resume
                # slots, since the next generation's state goes into the one not committed
                for slot in (0, 1):
                    state_names(reader._f["resume"][f"slot_{slot}"])
                resumed = reader.resumed  # read here: a refusal must leave the file as it was
            f = open_append(p)
            try:
                store = cls(f, p, "w", lock)
                f["run"].attrs["resumed"] = dumps(resumed + [now_utc()])
                f["run/finished"][0] = np.bytes_(b"")  # running again
                if "lost_workers" not in f["run"]:  # a file written before it existed
                    lost_workers_blob(f["run"])
                mark_writer(f["run"])
                f.flush()
                f.swmr_mode = True
            except KingenError:
                f.close()
                raise
            except (OSError, KeyError, ValueError, RuntimeError) as exc:
                f.close()
                raise corrupt_error(name, exc) from None
        except BaseException:
            lock.release()
            raise
        return store

    @reading
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
        hof = int(load_one(self._ds("hall_of_fame/size")))
        best_valid = int(load_one(self._ds("best/valid"))) == 1
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
                load(ds, chunk)

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



def as_store(run: str | os.PathLike[str] | RunStore) -> tuple[RunStore, bool]:
    """(store, opened_here): open a path for reading, or pass an open store through."""
    if isinstance(run, RunStore):
        run.refresh()
        return run, False
    return RunStore.open(run, "r"), True
