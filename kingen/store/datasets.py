"""HDF5 building blocks of the run file: checksummed datasets, tables, extendable
datasets and JSON blobs, and verified reads (a failed checksum is an error naming the
dataset, never a wrong number).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import h5py
import numpy as np

from kingen.errors import KingenError

MAX_COLUMNS = 32  # columns reserved for per-generation statistics and timings
MAX_STATE_DIMS = 3  # dimensions of a resume-state array
# What a resume state may hold: numbers, never objects (nothing in it can run as code).
STATE_KINDS = "biuf"
NAME_BYTES = 64  # fixed-length column names (fixed length: writable under SWMR)
REASON_BYTES = 1024


# Every dataset is chunked with a Fletcher-32 checksum per chunk, which HDF5 checks on
# every read: a flipped bit is an error naming the dataset, never a wrong number. Strings
# are fixed-length (a variable-length string lives in a heap no filter covers).
CHECKSUM = {"fletcher32": True}
# gzip level 1: a third of level 4's time for nearly its ratio. The per-generation float
# arrays (population, errors, fitness) are stored uncompressed: random doubles shrink little,
# and compressing them on the writer thread held the GIL and stalled the GA at 65k candidates.
_GZIP = {"compression": "gzip", "compression_opts": 1, "shuffle": True, **CHECKSUM}


def member_key(name: str) -> str:
    """HDF5 member name for a protocol name ('/' is a path separator in HDF5).

    >>> member_key("dose/response"), member_key(".")
    ('dose_response', '_.')
    """
    key = name.replace("/", "_")
    return "_" + key if key in ("", ".") else key


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def dumps(obj: Any) -> str:
    """JSON text of ``obj``; NumPy numbers and arrays as plain numbers and lists.

    >>> dumps({"n": np.int64(3), "x": np.array([0.5, 1.0])})
    '{"n": 3, "x": [0.5, 1.0]}'
    """
    return json.dumps(obj, default=_json_default, allow_nan=True)


def as_text(value: Any) -> str:
    """A stored string (bytes, 0-d array or str) as text.

    >>> as_text(b"deactivation"), as_text(np.array(b"ms"))
    ('deactivation', 'ms')
    """
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.shape == ():
        return as_text(value[()])
    return str(value)


TEXT = "text"  # a table column of text: stored as fixed-length UTF-8


def strings(values: Any) -> np.ndarray:
    """Text as a fixed-length UTF-8 string array (one byte or more per item)."""
    raw = [str(v).encode("utf-8") for v in values]
    return np.array(raw, dtype=h5py.string_dtype("utf-8", max([1] + [len(b) for b in raw])))


def make_dataset(group: h5py.Group, name: str, data: Any, *, compress: bool = False
             ) -> h5py.Dataset:
    """A fixed dataset, chunked so that it carries a checksum; a scalar is stored as (1,)."""
    arr = np.asarray(data)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    # one chunk for small data; HDF5's own choice (bounded chunks) for large
    chunks = tuple(max(1, n) for n in arr.shape) if arr.nbytes <= 1 << 20 else True
    opts = _GZIP if compress else CHECKSUM
    if arr.size == 0:
        # HDF5 cannot chunk a zero-length extent: leave room for it to be chunked
        return group.create_dataset(name, shape=arr.shape, maxshape=(None,) * arr.ndim,
                                    dtype=arr.dtype, chunks=(1,) * arr.ndim, **opts)
    return group.create_dataset(name, data=arr, chunks=chunks, **opts)


def make_text_dataset(group: h5py.Group, name: str, text: str) -> h5py.Dataset:
    """A checksummed dataset holding one text."""
    return make_dataset(group, name, strings([text]))


def make_table(group: h5py.Group, name: str, columns: list[tuple[str, Any, np.dtype | Any]],
               rows: int, units: Mapping[str, str] | None = None, doc: str = "") -> h5py.Dataset:
    """A compound dataset (a table); column units go into ``unit_<column>`` attributes."""
    cols = [(c, strings(v) if t is TEXT else np.asarray(v, dtype=t)) for c, v, t in columns]
    dtype = np.dtype([(c, v.dtype) for c, v in cols])
    arr = np.zeros(rows, dtype=dtype)
    for c, values in cols:
        arr[c] = values if rows else []
    ds = make_dataset(group, name, arr)
    for column, unit in (units or {}).items():
        ds.attrs[f"unit_{column}"] = unit
    if doc:
        ds.attrs["description"] = doc
    return ds


def column_values(table: np.ndarray, name: str) -> list[Any]:
    """The values of a table's column, text decoded."""
    return [as_text(v) if isinstance(v, (bytes, str)) else v for v in table[name]]


def make_extendable(group: h5py.Group, name: str, shape: tuple[int, ...], dtype: Any,
                    fill: Any, *, unit: str | None = None, doc: str = "",
                    compress: bool = True, chunk_rows: int | None = None) -> h5py.Dataset:
    """An empty dataset, extendable on every axis of length 0 or marked None."""
    start = tuple(0 if s is None else s for s in shape)
    maxshape = tuple(None for _ in shape)
    row = int(np.prod([max(1, s or 1) for s in shape[1:]])) * np.dtype(dtype).itemsize
    rows = chunk_rows or max(1, min(64, (1 << 16) // max(row, 1)))
    chunks = (rows,) + tuple(max(1, min(s or 1024, 4096)) for s in shape[1:])
    opts = _GZIP if compress else CHECKSUM
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
READ_TRIES = 3


def load(ds: h5py.Dataset, sel: Any = ()) -> Any:
    """``ds[sel]``, verified: a failed checksum is a KingenError naming the dataset."""
    for attempt in range(READ_TRIES):
        try:
            return ds[sel]
        except OSError as exc:
            if attempt + 1 == READ_TRIES or not ds.file.swmr_mode or ds.file.mode != "r":
                raise _damaged(ds, exc) from None
            time.sleep(0.05)
            ds.refresh()
    raise AssertionError("unreachable")  # pragma: no cover


def load_one(ds: h5py.Dataset) -> Any:
    """The single value of a (1,) dataset (scalars are stored so, to carry a checksum)."""
    value = load(ds, 0) if ds.shape == (1,) else None
    if value is None:
        raise KingenError(f"inconsistent run file: shape {ds.shape} where one value belongs",
                          file=ds.file.filename, field=ds.name)
    return value


def grow(ds: h5py.Dataset, shape: tuple[int, ...]) -> None:
    """Extend ``ds`` so it is at least ``shape`` (never shrink: SWMR allows only growth)."""
    new = tuple(max(a, b) for a, b in zip(ds.shape, shape, strict=True))
    if new != ds.shape:
        ds.resize(new)


def padded(rows: list[np.ndarray], width: int, fill: float = np.nan) -> np.ndarray:
    """Rows of different lengths as one (len(rows), width) array, ``fill`` padded.

    >>> padded([np.array([1.0, 2.0]), np.array([3.0])], 3, fill=0.0)
    array([[1., 2., 0.],
           [3., 0., 0.]])
    """
    out = np.full((len(rows), width), fill)
    for i, r in enumerate(rows):
        out[i, : r.size] = r
    return out


def write_json(ds: h5py.Dataset, obj: Any) -> None:
    """JSON as UTF-8 bytes in an extendable uint8 dataset, NUL padded.

    A string dataset cannot change size under SWMR, and the dataset never shrinks, so a
    shorter text leaves NULs behind it, which :func:`read_json` strips.
    """
    raw = np.frombuffer(dumps(obj).encode("utf-8"), dtype=np.uint8)
    grow(ds, (raw.size,))
    full = np.zeros(ds.shape[0], dtype=np.uint8)
    full[: raw.size] = raw
    ds[...] = full


def read_json(ds: h5py.Dataset) -> Any:
    """The JSON a :func:`write_json` dataset holds (None where empty)."""
    raw = bytes(np.asarray(load(ds), dtype=np.uint8)).rstrip(b"\0")
    return json.loads(raw.decode("utf-8")) if raw else None


def make_json_blob(group: h5py.Group, name: str, doc: str) -> h5py.Dataset:
    """An extendable dataset for JSON (see :func:`write_json`), holding null."""
    ds = make_extendable(group, name, (None,), np.uint8, 0, chunk_rows=4096)
    ds.attrs["content"] = "UTF-8 JSON text as bytes, NUL padded"
    ds.attrs["description"] = doc
    write_json(ds, None)
    return ds
