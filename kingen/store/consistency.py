"""A run file's consistency, checked once at opening: the marker and layout version, every
group and dataset it has from its creation, counters that agree with the data, and the resume
state's schema (numbers only).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np

from kingen.errors import KingenError
from kingen.store.datasets import (
    MAX_COLUMNS,
    MAX_STATE_DIMS,
    READ_TRIES,
    STATE_KINDS,
    as_text,
    column_values,
    load,
    load_one,
    member_key,
)
from kingen.store.integrity import check_marker, missing_error, need_member
from kingen.store.layout import (
    PROFILE_DATASETS,
    PROTOCOL_ATTRIBUTES,
    PROTOCOL_DATASETS,
    RECORDING_DATASETS,
    REQUIRED_ATTRIBUTES,
    REQUIRED_DATASETS,
    REQUIRED_SUBGROUPS,
    TARGET_DATASETS,
)


def _need_attribute(f: h5py.File, name: str, path: str, attribute: str) -> None:
    """KingenError naming ``/path@attribute`` unless the object at ``path`` has it."""
    if attribute not in f[path].attrs:
        raise missing_error(name, f"/{path}@{attribute}", "attribute")


def _check_required(f: h5py.File, name: str, protocols: list[str]) -> None:
    """Every group and dataset a run file has from its creation is there, checked once at
    opening, so that every reader (and resume, before it writes) refuses a file with a gap
    in one line naming it, rather than failing later or drawing without it."""
    for path in REQUIRED_SUBGROUPS:
        need_member(f, name, path, h5py.Group)
    # A file from before /profiles lacks the whole group; one with part of it is damaged
    # (kingen profile would take it for absent and fail to add it).
    for path in REQUIRED_DATASETS + (PROFILE_DATASETS if "profiles" in f else ()):
        need_member(f, name, path, h5py.Dataset)
    for p in protocols:
        key = member_key(p)
        need_member(f, name, f"best/traces/{key}", h5py.Group)
        paths = list(PROTOCOL_DATASETS)
        for group, parts in (("data", RECORDING_DATASETS), ("targets", TARGET_DATASETS)):
            if key in f[group]:  # optional: a protocol fits a recording, targets or both
                need_member(f, name, f"{group}/{key}", h5py.Group)
                paths += parts
        for path in paths:
            need_member(f, name, path.replace("<p>", key), h5py.Dataset)
        for path, attribute in PROTOCOL_ATTRIBUTES:
            _need_attribute(f, name, path.replace("<p>", key), attribute)
    for path, attribute in REQUIRED_ATTRIBUTES:
        _need_attribute(f, name, path, attribute)


def _inconsistent(name: str, field: str, value: Any, what: str) -> KingenError:
    return KingenError(f"inconsistent run file: {what}", file=name, field=field, value=value)


def check_consistency(f: h5py.File, name: str) -> list[str]:
    """Check once, at opening, that the counters agree with the data; returns the protocol
    names. Attributes carry no checksum, so they are checked against the datasets too."""
    check_marker(f, name)
    _need_attribute(f, name, "protocols", "names")
    try:
        names = json.loads(as_text(f["protocols"].attrs["names"]))
    except (KeyError, ValueError) as exc:
        raise _inconsistent(name, "/protocols.names", None, f"unreadable ({exc})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _inconsistent(name, "/protocols.names", names, "not a list of protocol names")
    for n in names:
        if member_key(n) not in f["protocols"] or not isinstance(
                f["protocols"][member_key(n)], h5py.Group):
            raise _inconsistent(name, "/protocols.names", n, "no group for this protocol")

    _check_required(f, name, names)

    def ds(path: str, ndim: int, kind: str) -> h5py.Dataset:
        obj = f[path]  # there: checked by _check_required
        if obj.ndim != ndim or obj.dtype.kind not in kind:
            raise _inconsistent(name, f"/{path}", f"{obj.dtype} {obj.shape}",
                                f"expected {ndim} dimensions of kind {kind!r}")
        if f.swmr_mode and f.mode == "r":
            obj.refresh()
        return obj

    n_par = ds("scheme/parameters", 1, "V").shape[0]
    n_prot = len(names)
    commit = np.asarray(load(ds("run/commit", 1, "iu")), dtype=np.int64)
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
        sizes = np.asarray(load(gen["size"], np.s_[:rows]))
        bad = np.flatnonzero((sizes < 0) | (sizes > width))
        if bad.size:
            raise _inconsistent(name, f"/generations/size[{bad[0]}]", int(sizes[bad[0]]),
                                f"more candidates than the {width} rows stored")
        last = int(load(gen["generation"], rows - 1))
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
        if path.endswith("_names"):  # resume writes new names beside these: checked first
            for i, raw in enumerate(np.asarray(load(d)).tolist()):
                try:
                    as_text(raw)
                except UnicodeDecodeError:
                    raise _inconsistent(name, f"/{path}[{i}]", raw, "a column name that is "
                                        "not UTF-8 text") from None
    hof_size = int(load_one(ds("hall_of_fame/size", 1, "iu")))
    hof = ds("hall_of_fame/params", 2, "f")
    hof_fit = ds("hall_of_fame/fitness", 1, "f")
    if hof.shape[1:] != (n_par,) or not 0 <= hof_size <= min(hof.shape[0], hof_fit.shape[0]):
        raise _inconsistent(name, "/hall_of_fame/size", hof_size, "does not match the stored "
                            f"hall of fame {hof.shape}")
    for p in names:
        g = f["data"].get(member_key(p))
        if isinstance(g, h5py.Group):
            n_samples = np.asarray(load(ds(f"{g.name[1:]}/n_samples", 1, "iu")))
            cur = ds(f"{g.name[1:]}/current_pA", 2, "f")
            if n_samples.shape[0] != cur.shape[0] or (n_samples > cur.shape[1]).any() or (
                    n_samples < 0).any():
                raise _inconsistent(name, f"{g.name}/n_samples", n_samples.tolist(),
                                    f"does not match the stored sweeps {cur.shape}")
            # Read beside the current sample for sample: another shape misaligns them.
            for other in ["time_ms"] + (["concentration_mM"] if "concentration_mM" in g
                                        else []):
                arr = ds(f"{g.name[1:]}/{other}", 2, "f")
                if arr.shape != cur.shape:
                    raise _inconsistent(name, f"{g.name}/{other}", arr.shape, "does not "
                                        f"match the stored current {cur.shape}")
    _check_scheme(f, name, ds)
    _check_settings(f, name)
    _check_positive(name, "hall_of_fame/params", load(hof, np.s_[:hof_size]), f)
    table = load(f["scheme/parameters"])
    for column in ("value", "lower", "upper"):  # the bounds the reports scale by
        _check_positive(name, f"scheme/parameters.{column}", table[column], f)
    # A live writer rewrites the best candidate (valid = 0 meanwhile) between two reads of
    # a reader: what failed is read again before it is called damaged.
    tries = READ_TRIES if f.swmr_mode and f.mode == "r" else 1
    for attempt in range(tries):
        try:
            if int(load_one(ds("best/valid", 1, "biu"))) == 1:  # else ignored by the readers
                _check_positive(name, "best/params", load(ds("best/params", 1, "f")), f)
                _check_best_json(name, names, ds)
            break
        except KingenError:
            if attempt + 1 == tries:
                raise
            time.sleep(0.05)
    return names


def _check_scheme(f: h5py.File, name: str, ds: Any) -> None:
    """The stored scheme text parses, and is the scheme the tables beside it describe (the
    readers take the parameters' order from the table and their units from the text)."""
    from kingen.model.scheme import Scheme

    try:  # force: the size limits were passed, or lifted, when the run started
        scheme = Scheme.loads(as_text(load_one(ds("scheme/text", 1, "SO"))), "/scheme/text",
                              force=True)
    except KingenError as exc:
        raise _inconsistent(name, "/scheme/text", None, f"not a valid scheme "
                            f"({exc.format().removeprefix('/scheme/text: ')})") from None
    t = load(ds("scheme/transitions", 1, "V"))
    stored = {"states": column_values(load(ds("scheme/states", 1, "V")), "name"),
              "parameters": column_values(load(ds("scheme/parameters", 1, "V")), "name"),
              "transitions": [f"{a} -> {b} ({k})" for a, b, k in zip(
                  column_values(t, "source"), column_values(t, "target"),
                  column_values(t, "param"), strict=True)]}
    text = {"states": list(scheme.states), "parameters": list(scheme.param_names),
            "transitions": [f"{scheme.states[x.source]} -> {scheme.states[x.target]} "
                            f"({scheme.parameters[x.param].name})" for x in scheme.transitions]}
    for table, names in stored.items():
        if names != text[table]:
            k = next((i for i, (a, b) in enumerate(zip(names, text[table])) if a != b),
                     min(len(names), len(text[table])))
            raise _inconsistent(name, "/scheme/text", None, f"not the scheme of the run's "
                                f"tables: {table[:-1]} {k + 1} is {_nth(text[table], k)} in "
                                f"the text, {_nth(names, k)} in /scheme/{table}; restore the "
                                "run file from a copy")


def _nth(items: list[str], k: int) -> str:
    return repr(items[k]) if k < len(items) else "none"


def _check_positive(name: str, path: str, values: np.ndarray, f: h5py.File) -> None:
    """Rate constants a reader takes for fitted values are > 0 (NaN is left: the readers
    pass over a candidate that is not finite)."""
    rows = np.atleast_2d(values)
    bad = np.argwhere(rows <= 0)
    if bad.size:
        i, k = (int(x) for x in bad[0])
        names = column_values(load(f["scheme/parameters"]), "name")
        at = f"[{k}]" if np.ndim(values) == 1 else f"[{i}, {k}]"
        path, dot, column = path.partition(".")
        raise _inconsistent(name, f"/{path}{at}{dot}{column}", float(rows[i, k]),
                            f"the rate constant {names[k]} must be > 0; restore the run file "
                            "from a copy")


def _check_settings(f: h5py.File, name: str) -> None:
    """The stored settings are a JSON object (what each command needs of them is checked
    where it is used: resume, for one, by :func:`kingen.fitting.config.stored_settings`)."""
    text = as_text(load_one(f["config/settings"]))
    try:
        settings = json.loads(text)
    except ValueError as exc:
        raise _inconsistent(name, "/config/settings", text, f"not valid JSON ({exc})"
                            ) from None
    if not isinstance(settings, dict):
        raise _inconsistent(name, "/config/settings", text, "not an object of JSON")


def _json_dataset(name: str, path: str, ds: Any) -> Any:
    """The JSON held (as NUL-padded UTF-8 bytes) in the dataset at ``path``; KingenError
    naming it when the bytes are not UTF-8 JSON."""
    raw = bytes(np.asarray(load(ds(path, 1, "u")), dtype=np.uint8)).rstrip(b"\0")
    try:
        return json.loads(raw.decode("utf-8")) if raw else None
    except UnicodeDecodeError:
        raise _inconsistent(name, f"/{path}", None, "not UTF-8 text") from None
    except ValueError as exc:
        raise _inconsistent(name, f"/{path}", raw.decode("utf-8"),
                            f"not valid JSON ({exc})") from None


def _check_best_json(name: str, names: list[str], ds: Any) -> None:
    """The best candidate's JSON blobs parse, and its traces' metadata (labels, has_data
    and n_sweeps per protocol) agrees with the stored traces: every reader and resume
    refuse a file whose metadata was damaged or edited, rather than trusting it."""
    for path, kinds, want in (("best/features", (dict,), "an object"),
                              ("best/polish", (dict, type(None)), "an object or null")):
        if not isinstance(_json_dataset(name, path, ds), kinds):
            raise _inconsistent(name, f"/{path}", None, f"not {want} of JSON")
    info = _json_dataset(name, "best/traces_info", ds)
    keys = ("labels", "has_data", "n_sweeps")
    if not isinstance(info, dict) or not all(isinstance(info.get(k), dict) for k in keys):
        raise _inconsistent(name, "/best/traces_info", _dumps_short(info), "expected an "
                            "object of labels, has_data and n_sweeps, each by protocol")
    for p, n in info["n_sweeps"].items():
        field = f"/best/traces_info.n_sweeps.{p}"
        if p not in names:
            raise _inconsistent(name, field, n, f"not a protocol of the run (protocols are "
                                f"{', '.join(names)})")
        rows = ds(f"best/traces/{member_key(p)}/n_samples", 1, "iu").shape[0]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= rows:
            raise _inconsistent(name, field, n, f"not a sweep count from 0 to {rows} (the "
                                "rows stored)")
        labels = info["labels"].get(p)
        if not isinstance(labels, list) or len(labels) != n or not all(
                isinstance(x, str) for x in labels):
            raise _inconsistent(name, f"/best/traces_info.labels.{p}", _dumps_short(labels),
                                f"expected a list of {n} sweep labels")
        if not isinstance(info["has_data"].get(p), bool):
            raise _inconsistent(name, f"/best/traces_info.has_data.{p}",
                                _dumps_short(info["has_data"].get(p)), "expected true or "
                                "false")


def _dumps_short(obj: Any) -> str:
    """JSON text of ``obj`` for a message (the message cuts it)."""
    return json.dumps(obj)[:200]


def state_schema(fields: Mapping[str, tuple[Any, tuple[int, ...]]]
                  ) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The resume state fields checked: name -> (NumPy dtype, typical shape)."""
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


def state_names(g: h5py.Group) -> list[str]:
    """A resume slot's field names, checked: each a dataset of numbers, nothing else."""
    where = g.name
    try:
        names = json.loads(as_text(g.attrs["fields"]))
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
