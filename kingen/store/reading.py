"""Reading a run file: what :class:`~kingen.store.runstore.RunStore` gives back (the
configuration, the scheme, the protocols and data, the generations, the resume state, the
hall of fame and the best candidate), each read verified and fresh.
"""

from __future__ import annotations

import functools
import json
import math
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
from kingen.store.consistency import state_names
from kingen.store.datasets import as_text, column_values, load, load_one, member_key, read_json
from kingen.store.encode import read_protocol, read_recording, read_targets
from kingen.store.integrity import corrupt_error, missing_error

_F = TypeVar("_F", bound=Callable[..., Any])


def reading(fn: _F) -> _F:
    """Turn HDF5 errors while reading into one-line KingenErrors naming the file."""

    @functools.wraps(fn)
    def wrapper(self: RunReader, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except KingenError:
            raise
        except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
            raise corrupt_error(str(self.path), exc) from None

    return wrapper  # type: ignore[return-value]



class RunReader:
    """The reading half of :class:`~kingen.store.runstore.RunStore` (its base class)."""

    _f: h5py.File
    path: Path
    mode: str
    _protocol_names: list[str]
    _param_names: list[str]

    # ------------------------------------------------------------------ reading: helpers
    def _ds(self, name: str) -> h5py.Dataset:
        ds = self._f.get(name)
        if not isinstance(ds, h5py.Dataset):  # opening checks the required ones: a safety net
            raise missing_error(str(self.path), f"/{name.lstrip('/')}", "dataset")
        if self.mode == "r" and self._f.swmr_mode:
            ds.refresh()
        return ds

    def _commit(self) -> np.ndarray:
        return np.asarray(load(self._ds("run/commit")), dtype=np.int64)

    def _read(self, name: str, sel: Any = ()) -> Any:
        """``self._f[name][sel]``, fresh (a live run) and verified (names a damaged dataset)."""
        return load(self._ds(name), sel)

    # ------------------------------------------------------------------ reading: static
    @property
    @reading
    def config_text(self) -> str:
        """The configuration file's text."""
        return as_text(load_one(self._f["config/text"]))

    @property
    @reading
    def config(self) -> dict[str, Any]:
        """The resolved settings."""
        return json.loads(as_text(load_one(self._f["config/settings"])))

    @property
    @reading
    def environment(self) -> dict[str, str]:
        """Versions, device, backend, precision of the run."""
        return {k: as_text(v) for k, v in self._f["environment"].attrs.items()}

    @property
    @reading
    def created(self) -> str:
        """When the run file was created (ISO 8601, UTC)."""
        return as_text(self._f.attrs.get("created", ""))

    @reading
    def scheme(self) -> Scheme:
        """The scheme, parsed again from its stored file text."""
        g = self._f["scheme"]
        return Scheme.loads(as_text(load_one(g["text"])),
                            path=as_text(g.attrs.get("path", "<scheme>")))

    @reading
    def parameter_table(self) -> dict[str, list[Any]]:
        """``/scheme/parameters`` by column: the parameters as the fit used them (bounds,
        scales and ``fixed`` flags after the configuration's overrides; internal units)."""
        t = load(self._f["scheme/parameters"])
        return {name: column_values(t, name) for name in t.dtype.names}

    @reading
    def local_uncertainty(self) -> dict[str, Any] | None:
        """``/profiles/local``: the noise model, standard errors and correlations at the
        optimum, or None (not computed, or a file from before it existed)."""
        from kingen.store.profiles import read_local

        return read_local(self._f)

    @reading
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
    @reading
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The box the run searched: (lower, upper) per parameter, internal units, scheme
        order. The fit configuration may narrow the scheme file's bounds; :meth:`scheme`
        parses the file's text, so only this gives the run's."""
        table = load(self._f["scheme/parameters"])
        return (np.asarray(column_values(table, "lower"), dtype=np.float64),
                np.asarray(column_values(table, "upper"), dtype=np.float64))

    @property
    def protocol_names(self) -> list[str]:
        """Protocol names, in the order of the error columns."""
        return list(self._protocol_names)

    @property
    def param_names(self) -> list[str]:
        """Parameter names, in the order of the parameter columns."""
        return list(self._param_names)

    @property
    @reading
    def free_mask(self) -> np.ndarray:
        """True for each parameter the fit searched."""
        return np.asarray(load(self._f["generations/free_mask"]), dtype=bool)

    @property
    @reading
    def population_size(self) -> int:
        """Candidates per generation, as configured."""
        return int(self._f["generations"].attrs["population_size"])

    @reading
    def protocols(self) -> list[Protocol]:
        """The protocols, rebuilt from their tables."""
        return [read_protocol(self._f["protocols"][member_key(n)]) for n in self._protocol_names]

    @reading
    def chains(self) -> dict[str, Chain]:
        """The recording chain of each protocol; the plain chain (no filter, one amplitude,
        no offset) where the run file records none, as every run written before chains."""
        g = self._f["protocols"]
        out = {}
        for n in self._protocol_names:
            text = g[member_key(n)].attrs.get("chain")
            out[n] = Chain.from_dict(json.loads(as_text(text)) if text is not None else None)
        return out

    @reading
    def recordings(self) -> dict[str, Recording | None]:
        """The recording fitted for each protocol (None where there was none)."""
        g = self._f["data"]
        return {n: read_recording(g[member_key(n)]) if member_key(n) in g else None
                for n in self._protocol_names}

    @reading
    def targets(self) -> dict[str, Targets | None]:
        """The summary targets of each protocol (None where there were none)."""
        g = self._f["targets"]
        return {n: read_targets(g[member_key(n)]) if member_key(n) in g else None
                for n in self._protocol_names}

    # ------------------------------------------------------------------ reading: the run
    @property
    @reading
    def n_generations(self) -> int:
        """Generations committed."""
        return int(self._commit()[0])

    @property
    @reading
    def resumed(self) -> list[str]:
        """When the run was resumed (ISO 8601, UTC), oldest first."""
        value = json.loads(as_text(self._f["run"].attrs.get("resumed", "[]")))
        return [str(v) for v in value] if isinstance(value, list) else []

    @property
    @reading
    def lost_workers(self) -> list[dict[str, Any]]:
        """The shards a lost Dask worker held and that ran again elsewhere (see
        :meth:`record_lost_workers`); empty for a run in one process."""
        if "lost_workers" not in self._f["run"]:
            return []
        value = read_json(self._ds("run/lost_workers"))
        return [dict(v) for v in value if isinstance(v, dict)] if isinstance(value, list) \
            else []

    @property
    @reading
    def finished(self) -> str | None:
        """Why the run stopped, or None while it runs (or if it was killed)."""
        text = as_text(load_one(self._ds("run/finished")))
        return text or None

    @reading
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
            cols = [as_text(v) for v in self._read(f"generations/{name}_names")]
            table = np.asarray(self._read(f"generations/{name}", np.s_[:g_n]))
            out[name] = {c: table[:, i] for i, c in enumerate(cols) if c}
        for key in ("best", "median", "mean"):
            out[key] = out["stats"].get(key, np.full(g_n, np.nan))
        return out

    @reading
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

    @reading
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
                params[g] = load(pop, (g, i))  # one chunk per generation: cheap
                best[g] = row[i]
        return gens, params, best

    @reading
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
        names = state_names(g)
        shapes = np.asarray(load(g["shapes"]), dtype=np.int64)
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
            arr = np.asarray(load(ds, sel), dtype=ds.dtype).reshape(shape)
            out[name] = arr
            crc = zlib.crc32(arr.tobytes(), crc)
        crc = zlib.crc32(shapes.tobytes(), crc)
        if crc != int(self._read("resume/crc32", slot)) or int(
                self._read("resume/generation", slot)) != generation:
            raise KingenError(f"damaged run file: the resume state of generation {generation} "
                              "fails its checksum", file=str(self.path), field=where)
        return generation, out

    @reading
    def hall_of_fame(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(params (K, n_params), fitness (K,)) or None when none was written."""
        k = int(load_one(self._ds("hall_of_fame/size")))
        if k == 0:
            return None
        return (np.asarray(self._read("hall_of_fame/params", np.s_[:k])),
                np.asarray(self._read("hall_of_fame/fitness", np.s_[:k])))

    @reading
    def best(self) -> dict[str, Any] | None:
        """The best candidate as written by :meth:`write_best`, or None.

        Keys: ``params``, ``fitness``, ``errors`` and ``amplitudes`` (dicts by protocol),
        ``traces`` (as given to :meth:`write_best`), ``features``, ``polish``,
        ``generation`` (the last committed generation when it was written).
        """
        if int(load_one(self._ds("best/valid"))) != 1:
            return None
        b = self._f["best"]
        names = self._protocol_names
        errors = np.asarray(self._read("best/errors"))
        amps = np.asarray(self._read("best/amplitudes"))
        info = read_json(self._ds("best/traces_info"))
        traces: dict[str, dict] = {}
        for pname in names:
            if pname not in info.get("n_sweeps", {}):
                continue
            g = b["traces"][member_key(pname)]
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
            "fitness": float(load_one(self._ds("best/fitness"))),
            "errors": {n: float(e) for n, e in zip(names, errors, strict=True)},
            "amplitudes": {n: float(a) for n, a in zip(names, amps, strict=True)
                           if math.isfinite(a)},
            "traces": traces,
            "features": read_json(self._ds("best/features")) or {},
            "polish": read_json(self._ds("best/polish")),
            "generation": int(load_one(self._ds("best/generation"))),
        }
