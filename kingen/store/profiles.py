"""The run file's ``/profiles`` group: local uncertainty and profile likelihoods.

``/profiles/local`` holds the local uncertainty at the optimum (noise model, standard errors
and correlations from the Fisher information), written at the end of a fit and by ``kingen
profile``. ``/profiles/slot_0`` and ``slot_1`` hold the profile computation's whole state
(grids, profile values, the re-optimised parameters, the optimiser's state, the results):
each step goes into the slot *not* named by ``/profiles/commit``, which is written last
(``[steps committed, slot, CRC-32 of the slot's bytes]``). A run killed at any moment
leaves the previous step intact, and ``kingen profile`` continues from it.

Everything is JSON text (UTF-8 bytes in an extendable, checksummed uint8 dataset), parsed
with :func:`json.loads` and checked field by field by its reader; nothing is executed.

Files written before the group existed lack it: :func:`add_group` adds it by copying the
file to a temporary one beside it and swapping that in, so a kill leaves the original.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from kingen.errors import KingenError
from kingen.store.datasets import dumps, grow, load, make_dataset, make_json_blob, read_json

GROUP = "profiles"


def create_group(f: h5py.File) -> h5py.Group:
    """Create the empty ``/profiles`` group (before SWMR mode: datasets cannot be made later)."""
    g = f.create_group(GROUP)
    g.attrs["description"] = ("local uncertainty at the optimum and profile likelihoods "
                              "(JSON); see the kingen documentation, 'Identifiability'")
    make_json_blob(g, "local", "noise model, standard errors and correlations at the optimum")
    for slot in (0, 1):
        make_json_blob(g, f"slot_{slot}", "profile state and results, in the slot commit[1] names")
    make_dataset(g, "commit", np.array([0, 0, 0], dtype=np.int64))
    g["commit"].attrs["description"] = ("[steps committed, slot, CRC-32 of the slot's bytes]; "
                                        "written last")
    return g


def add_group(p: Path) -> None:
    """Give a run file that lacks ``/profiles`` the group (copy, add, swap in atomically).

    The caller holds the run file's writer lock.
    """
    from kingen.store.integrity import open_read

    tmp = p.with_name(f".{p.name}.profiles.tmp")
    src = open_read(p)
    try:
        with h5py.File(tmp, "w", libver="latest") as dst:
            for k, v in src.attrs.items():
                dst.attrs[k] = v
            for member in src:
                src.copy(src[member], dst, name=member)
            create_group(dst)
    except BaseException:
        src.close()
        tmp.unlink(missing_ok=True)
        raise
    src.close()
    os.chmod(tmp, p.stat().st_mode & 0o777)
    os.replace(tmp, p)


def has_group(f: h5py.File) -> bool:
    """True when the file has a complete ``/profiles`` group."""
    g = f.get(GROUP)
    return isinstance(g, h5py.Group) and all(
        isinstance(g.get(n), h5py.Dataset) for n in ("local", "slot_0", "slot_1", "commit"))


def _fresh(ds: h5py.Dataset) -> h5py.Dataset:
    if ds.file.swmr_mode and ds.file.mode == "r":
        ds.refresh()
    return ds


def write_local(f: h5py.File, obj: dict[str, Any]) -> None:
    """Replace ``/profiles/local`` (flushed)."""
    from kingen.store.datasets import write_json

    write_json(f[GROUP]["local"], obj)
    f.flush()


def read_local(f: h5py.File) -> dict[str, Any] | None:
    """``/profiles/local`` as written, or None (none written, or an older file)."""
    if not has_group(f):
        return None
    obj = read_json(_fresh(f[GROUP]["local"]))
    return obj if isinstance(obj, dict) else None


def commit_state(f: h5py.File, state: dict[str, Any]) -> int:
    """Write the profile state into the free slot, flush, then commit it; returns the step."""
    g = f[GROUP]
    steps, slot, _ = (int(v) for v in load(g["commit"]))
    new = 0 if steps == 0 else 1 - slot
    raw = np.frombuffer(dumps(state).encode("utf-8"), dtype=np.uint8)
    ds = g[f"slot_{new}"]
    grow(ds, (raw.size,))
    full = np.zeros(ds.shape[0], dtype=np.uint8)
    full[: raw.size] = raw
    ds[...] = full
    f.flush()
    g["commit"][...] = np.array([steps + 1, new, zlib.crc32(raw.tobytes())], dtype=np.int64)
    f.flush()
    return steps + 1


def read_state(f: h5py.File, name: str) -> dict[str, Any] | None:
    """The last committed profile state, or None; a slot that fails its CRC is an error."""
    if not has_group(f):
        return None
    g = f[GROUP]
    commit = np.asarray(load(_fresh(g["commit"])), dtype=np.int64)
    if commit.shape != (3,) or commit[1] not in (0, 1) or commit[0] < 0:
        raise KingenError("inconsistent run file: malformed profile commit", file=name,
                          field="/profiles/commit", value=commit.tolist())
    steps, slot, crc = (int(v) for v in commit)
    if steps == 0:
        return None
    raw = bytes(np.asarray(load(_fresh(g[f"slot_{slot}"])), dtype=np.uint8)).rstrip(b"\0")
    if zlib.crc32(raw) != crc:
        raise KingenError("damaged run file: the profile state fails its CRC-32", file=name,
                          field=f"/profiles/slot_{slot}")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise KingenError("damaged run file: the profile state is not JSON", file=name,
                          field=f"/profiles/slot_{slot}") from None
    if not isinstance(obj, dict):
        raise KingenError("malformed profile state", file=name, field=f"/profiles/slot_{slot}")
    return obj
