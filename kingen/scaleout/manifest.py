"""The batch manifest (TOML): which fits a batch runs.

A batch is the product cells × schemes × seeds of one base fit configuration, each fit with
its overrides (see the documentation, "Scale out")::

    config = "fit.toml"           # the base fit configuration (required)
    output = "batch"              # the batch's folder (default: the manifest's name)
    seeds = [1, 2, 3]             # default: the configuration's seed

    [overrides]                   # fields of the fit configuration, for every fit
    ga = { generations = 60 }

    [[cells]]                     # default: one cell, the configuration's own data
    name = "cell01"
    recordings = { deactivation = "cell01/deact.abf" }   # protocol name -> file(s)
    targets = { recovery = "cell01/recovery.csv" }

    [[schemes]]                   # default: the configuration's model
    name = "jonas"
    model = "models/jonas_1993.toml"
    parameters = { fixed = ["k34"] }   # replaces the configuration's [parameters]

    [cluster]                     # where it runs (kingen.scaleout.cluster)

Each fit gets a folder ``<output>/<cell>/<scheme>/seed<seed>/`` holding its own
configuration (``fit.toml``, every path in it absolute), its run file (``run.h5``) and its
log (``fit.log``). Paths in the manifest are relative to the manifest; paths in the base
configuration, to the configuration. Mistakes in the manifest itself end in one line naming
the manifest, the field and the value; a fit whose own files are bad fails its row when it
runs, and the rest of the batch goes on.

>>> import tempfile, pathlib, kingen
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "batch.toml").write_text(f'config = "{kingen.demo_config()}"\\nseeds = [1, 2]\\n')
>>> m = load_manifest(d / "batch.toml")
>>> [job.id for job in m.jobs]
['demo/jonas_1993_reversible/seed1', 'demo/jonas_1993_reversible/seed2']
>>> _ = (d / "bad.toml").write_text(f'config = "{kingen.demo_config()}"\\nseeds = [1, -2]\\n')
>>> load_manifest(d / "bad.toml")
Traceback (most recent call last):
...
kingen.errors.KingenError: ...bad.toml: seeds[1] = -2: must be >= 0
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kingen.errors import KingenError
from kingen.experiment.protocol import STANDARD_PROTOCOLS
from kingen.model.fields import Fields, join, loads_toml
from kingen.model.shipped import shipped_scheme
from kingen.scaleout.cluster import ClusterSettings, cluster_settings
from kingen.scaleout.summary import CSV_NAME, HTML_NAME
from kingen.scaleout.tomlout import dumps_toml

_TOP = {"config", "output", "seeds", "overrides", "cells", "schemes", "cluster"}
_CELL = {"name", "recordings", "targets", "overrides"}
_SCHEME = {"name", "model", "parameters", "overrides"}
# Set by the batch itself, per fit: not overridable.
_FIXED_BY_BATCH = {"output", "seed", "model", "protocols"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
MAX_FITS = 100_000


@dataclass
class FitJob:
    """One fit of a batch: where its files go and the configuration it runs."""

    cell: str
    scheme: str
    seed: int
    folder: Path
    config_text: str

    @property
    def id(self) -> str:
        """``cell/scheme/seed<seed>``: the fit's name in the summary and the progress."""
        return f"{self.cell}/{self.scheme}/seed{self.seed}"

    @property
    def config_path(self) -> Path:
        return self.folder / "fit.toml"

    @property
    def run_path(self) -> Path:
        return self.folder / "run.h5"

    @property
    def log_path(self) -> Path:
        return self.folder / "fit.log"

    def as_task(self) -> dict[str, Any]:
        """Plain data for the task that runs it."""
        return {"id": self.id, "cell": self.cell, "scheme": self.scheme, "seed": self.seed,
                "config": str(self.config_path), "config_text": self.config_text,
                "run": str(self.run_path), "log": str(self.log_path)}


@dataclass
class Manifest:
    """A read manifest: its fits, folder and cluster settings."""

    path: Path
    output: Path
    jobs: list[FitJob]
    cluster: ClusterSettings | None = None
    cells: list[str] = field(default_factory=list)
    schemes: list[str] = field(default_factory=list)
    inputs: dict[str, str] = field(default_factory=dict)
    """The files the batch reads (path -> what it is): its outputs never replace one."""


def load_manifest(path: str | Path) -> Manifest:
    """Read and check a batch manifest.

    Raises
    ------
    KingenError
        One line naming the manifest (or the base configuration), the field and the value.
    """
    p = Path(path)
    name = str(p)
    if not p.is_file():
        raise KingenError("manifest not found", file=name)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KingenError(f"cannot read: {exc}", file=name) from None
    doc = loads_toml(text, name)
    c = Fields(name)
    c.keys(doc, _TOP, "")
    here = p.parent.resolve()
    config_name = c.string(doc, "config", "", None)
    if config_name is None:
        raise c.error("missing: the base fit configuration", "config")
    config_path = _resolve(here, config_name)
    if not config_path.is_file():
        raise c.error("configuration file not found", "config", config_name)
    base_doc = _read_config(config_path)
    out_name = c.string(doc, "output", "", None)
    output = _resolve(here, out_name) if out_name else here / p.stem
    seeds_raw = doc.get("seeds")
    if seeds_raw is None:
        seeds = [Fields(str(config_path)).integer(base_doc, "seed", "", 0, ge=0)]
    else:
        if not isinstance(seeds_raw, list) or not seeds_raw:
            raise c.error("must be a non-empty array of integers", "seeds", seeds_raw)
        seeds = [c.integer({i: v}, i, "seeds", ge=0)  # type: ignore[arg-type]
                 for i, v in enumerate(seeds_raw)]
        if len(set(seeds)) != len(seeds):
            raise c.error("a seed is listed twice", "seeds", seeds_raw)
    overrides = _overrides(c, c.table(doc, "overrides"), "overrides")
    cells = _cells(c, c.array(doc, "cells", tables=True), here, base_doc, config_path)
    schemes = _schemes(c, c.array(doc, "schemes", tables=True), here, base_doc, config_path)
    n = len(cells) * len(schemes) * len(seeds)
    if n > MAX_FITS:
        raise c.error(f"{n:,} fits; a batch runs at most {MAX_FITS:,}", "cells")
    cluster = cluster_settings(doc["cluster"], name) if "cluster" in doc else None

    _check_cell_keys(cells, base_doc, config_path)
    base = _absolute_config(base_doc, config_path.parent)
    jobs = []
    for cell_name, cell in cells:
        for scheme_name, scheme in schemes:
            for seed in seeds:
                d = copy.deepcopy(base)
                _merge(d, overrides)
                _merge(d, scheme["overrides"])
                _merge(d, cell["overrides"])
                if scheme["model"] is not None:
                    d["model"] = scheme["model"]
                if scheme["parameters"] is not None:
                    d["parameters"] = copy.deepcopy(scheme["parameters"])
                for i, proto in enumerate(d.get("protocols", [])):
                    key = _protocol_key(proto, i)
                    for what in ("recording", "targets"):
                        if key in cell[what]:
                            proto[what] = cell[what][key]
                folder = output / cell_name / scheme_name / f"seed{seed}"
                d["seed"] = seed
                d["output"] = str(folder / "run.h5")
                jobs.append(FitJob(cell_name, scheme_name, seed, folder, dumps_toml(d)))
    return Manifest(p, output, jobs, cluster, [n for n, _ in cells], [n for n, _ in schemes],
                    _inputs(p, config_path, cells, schemes))


def _inputs(manifest: Path, config: Path, cells: list[tuple[str, dict]],
            schemes: list[tuple[str, dict]]) -> dict[str, str]:
    """Every file a batch names (path -> what it is)."""
    out = {str(manifest): "the batch manifest", str(config): "the batch's base configuration"}
    for _, scheme in schemes:
        if scheme["model"] is not None:
            out[scheme["model"]] = "a scheme file of the batch"
    for _, cell in cells:
        for what, role in (("recording", "a recording of the batch"),
                           ("targets", "a targets file of the batch")):
            for value in cell[what].values():
                for path in [value] if isinstance(value, str) else value:
                    out[path] = role
    return out


def _resolve(base: Path, name: str) -> Path:
    q = Path(name).expanduser()
    return q if q.is_absolute() else (base / q)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KingenError(f"cannot read: {exc}", file=str(path)) from None
    doc = loads_toml(text, str(path))
    protocols = doc.get("protocols")
    if not isinstance(protocols, list) or not protocols or \
            not all(isinstance(t, dict) for t in protocols):
        raise KingenError("must be a non-empty array of tables ([[protocols]])",
                          file=str(path), field="protocols")
    return doc


def _check_cell_keys(cells: list[tuple[str, dict]], base: dict, config_path: Path) -> None:
    """A cell's recordings and targets go to the protocol of that name: two protocols of
    the same name would both get them."""
    keys = [_protocol_key(proto, i) for i, proto in enumerate(base["protocols"])]
    named = {key for _, cell in cells for what in ("recording", "targets")
             for key in cell[what]}
    for key in sorted(named):
        if keys.count(key) > 1:
            raise KingenError(f"{keys.count(key)} protocols are called {key!r}, and a cell "
                              "gives recordings or targets by that name: give each its own "
                              "name (name = \"...\")", file=str(config_path),
                              field="protocols", value=key)


def _overrides(c: Fields, table: dict, where: str) -> dict[str, Any]:
    for key in table:
        if key in _FIXED_BY_BATCH:
            raise c.error("set by the batch for each fit (output, seed, model and protocols "
                          "come from output, seeds, [[schemes]] and [[cells]])",
                          join(where, key), table[key])
        if key == "cluster":
            raise c.error("give [cluster] at the manifest's top level", join(where, key))
    return dict(table)


# the batch's own files beside the cells' folders
_TAKEN = {CSV_NAME.lower(), HTML_NAME.lower()}


def _name(c: Fields, t: dict, where: str, seen: set[str]) -> str:
    value = c.string(t, "name", where)
    if not _NAME.match(value) or value in (".", ".."):
        raise c.error("must be a folder name: letters, digits, _ . + - (at most 64)",
                      join(where, "name"), value)
    if value.lower() in _TAKEN:
        raise c.error("is the name of the batch's own summary", join(where, "name"), value)
    if value in seen:
        raise c.error("two entries with the same name", join(where, "name"), value)
    seen.add(value)
    return value


def _protocol_key(proto: dict, i: int) -> str:
    if isinstance(proto.get("name"), str):
        return proto["name"]
    spec = proto.get("protocol")
    if isinstance(spec, str):
        return spec if spec in STANDARD_PROTOCOLS else Path(spec).stem
    return f"protocols[{i}]"


def _files(c: Fields, t: dict, key: str, where: str, here: Path, known: list[str]
           ) -> dict[str, Any]:
    table = c.table(t, key, where)
    out: dict[str, Any] = {}
    for proto, value in table.items():
        field_name = join(join(where, key), proto)
        if proto not in known:
            raise c.error(f"no protocol of this name in the configuration (protocols are "
                          f"{', '.join(known)})", field_name, proto)
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(
                isinstance(v, str) and v.strip() for v in items):
            raise c.error("must be a file name or a non-empty list of file names",
                          field_name, value)
        paths = [str(_resolve(here, v)) for v in items]
        for v, path in zip(items, paths, strict=True):
            if not Path(path).exists():  # here, not in every fit it would fail
                raise c.error("file not found", field_name, v)
        out[proto] = paths[0] if isinstance(value, str) else paths
    return out


def _cells(c: Fields, raw: list, here: Path, base_doc: dict, config_path: Path
           ) -> list[tuple[str, dict]]:
    if not raw:
        return [(_default_name(config_path), {"recording": {}, "targets": {},
                                              "overrides": {}})]
    known = [_protocol_key(t, i) for i, t in enumerate(base_doc["protocols"])]
    seen: set[str] = set()
    out = []
    for i, t in enumerate(raw):
        where = f"cells[{i}]"
        c.keys(t, _CELL, where)
        name = _name(c, t, where, seen)
        out.append((name, {
            "recording": _files(c, t, "recordings", where, here, known),
            "targets": _files(c, t, "targets", where, here, known),
            "overrides": _overrides(c, c.table(t, "overrides", where),
                                    join(where, "overrides"))}))
    return out


def _schemes(c: Fields, raw: list, here: Path, base_doc: dict, config_path: Path
             ) -> list[tuple[str, dict]]:
    if not raw:
        model = base_doc.get("model")
        stem = Path(model).stem if isinstance(model, str) else "model"
        name = stem if _NAME.match(stem) else "model"
        return [(name, {"model": None, "parameters": None, "overrides": {}})]
    seen: set[str] = set()
    out = []
    for i, t in enumerate(raw):
        where = f"schemes[{i}]"
        c.keys(t, _SCHEME, where)
        name = _name(c, t, where, seen)
        model = c.string(t, "model", where)
        path = _resolve(here, model)
        if not path.is_file():
            path = shipped_scheme(model) or path  # a shipped scheme's name
        if not path.is_file():
            raise c.error("scheme file not found", join(where, "model"), model)
        params = c.table(t, "parameters", where) if "parameters" in t else None
        out.append((name, {"model": str(path), "parameters": params,
                           "overrides": _overrides(c, c.table(t, "overrides", where),
                                                   join(where, "overrides"))}))
    return out


def _default_name(config_path: Path) -> str:
    stem = config_path.stem
    return stem if _NAME.match(stem) else "cell"


def _merge(into: dict, extra: dict) -> None:
    """Tables merge key by key; anything else replaces."""
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


def _absolute_config(doc: dict, base: Path) -> dict:
    """The configuration with every file it names made absolute (the fit's own
    configuration file lives in another folder)."""
    d = copy.deepcopy(doc)
    d.pop("cluster", None)
    if isinstance(d.get("model"), str):
        d["model"] = str(_resolve(base.resolve(), d["model"]))
    for proto in d.get("protocols", []):
        spec = proto.get("protocol")
        if isinstance(spec, str) and spec not in STANDARD_PROTOCOLS:
            proto["protocol"] = str(_resolve(base.resolve(), spec))
        for key in ("recording", "targets"):
            v = proto.get(key)
            if isinstance(v, str):
                proto[key] = str(_resolve(base.resolve(), v))
            elif isinstance(v, list):
                proto[key] = [str(_resolve(base.resolve(), x)) if isinstance(x, str) else x
                              for x in v]
    return d
