"""The fit configuration file (TOML): read, validate every field, resolve paths.

Everything is checked here, before any simulation: each problem ends in one
:class:`~kingen.errors.KingenError` line naming the file, the field and the value. Paths are
relative to the configuration file. See :data:`EXAMPLE` for every field with its default.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kingen.data import Recording, Targets, load_recording, load_targets
from kingen.errors import KingenError
from kingen.objective import ProtocolData
from kingen.params import ParameterMap, apply_overrides, apply_ties
from kingen.protocol import STANDARD_PROTOCOLS, load_protocol, standard_protocol
from kingen.scheme import Scheme
from kingen.solve.schedule import DEFAULT_COURANT, RK4_STABILITY_LIMIT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ALGORITHMS = ("mu_plus_lambda", "cmaes")
OPERATORS = ("auto", "deap", "numpy")
# At and above this many offspring the numpy operators replace DEAP's per-individual ones.
NUMPY_OPERATORS_FROM = 2048

EXAMPLE = '''\
model = "model.toml"        # required: the kinetic scheme to fit
output = "fit.h5"           # run file (default: <config name>.h5 beside the config)
seed = 0                    # random seed (same seed, backend, precision: same result)
backend = "auto"            # auto | cpu | cuda
precision = "float64"       # float64 | float32
# step = 0.001              # fixed RK4 step, ms (default: automatic, per segment)
courant = 2.5               # h·ρ of the automatic step choice, in (0, 2.785)
polish = true               # refine the best by least squares in log space at the end
polish_evaluations = 40     # at most this many least-squares iterations

[[protocols]]
protocol = "deactivation"   # standard name, or a protocol TOML file
name = "deactivation"       # default: the protocol's own name; must be unique
exchange = 0.2              # standard protocols: 10-90 % exchange time, ms (default 0)
dt = 0.05                   # standard protocols: sampling interval, ms
                            #   (default: the recording's, else 0.02)
recording = "deact.csv"     # CSV, NWB or ABF; or a list of files (sweeps in order)
targets = "features.csv"    # summary targets (feature CSV, dose or recovery table), or a list
weight = 1.0                # weight of this protocol's error in the fitness
# amplitude = 100           # fix the number of channels (default: solved by least squares)
mask = []                   # [[t0, t1], ...] ms ranges of every sweep to ignore
subtract_baseline = true    # subtract the recording's mean pre-pulse current

[parameters]
# free = ["k01", "k10"]     # search only these (all others fixed); default: all free ones
# fixed = ["k31"]           # hold these at their values
# tied = { k_b = "k_a" }    # k_b = k_a; or { k_b = { to = "k_a", factor = 2 } }
# k12 = { bounds = [1, 100], value = 20, scale = "log", fixed = false }  # file units

[ga]
algorithm = "mu_plus_lambda"  # mu_plus_lambda | cmaes
population = 64             # μ (cmaes: parents kept; default λ/2)
offspring = 64              # λ: candidates evaluated per generation (default: population)
generations = 100           # maximum number of generations
cxpb = 0.6                  # crossover probability
mutpb = 0.3                 # mutation probability (cxpb + mutpb <= 1)
eta_cx = 15.0               # SBX distribution index
eta_mut = 20.0              # polynomial-mutation distribution index
indpb = 0.0                 # per-gene mutation probability (0: 1 / number of genes)
tournament = 3              # tournament size
hall_of_fame = 10           # best candidates kept
sigma = 0.25                # cmaes: initial step, fraction of each gene's range
operators = "auto"          # deap | numpy | auto (numpy from 2048 offspring on)
start_from_model = false    # put the model file's values in the initial population

[stop]
patience = 0                # stop after this many generations without improvement (0: off)
min_improvement = 1e-6      # relative improvement of the best that counts
target_error = 0.0          # stop once the best fitness is at or below this (0: off)
wall_time = 0.0             # stop after this many seconds (0: off)
'''


@dataclass
class GASettings:
    """Search settings (see :data:`EXAMPLE`)."""

    algorithm: str = "mu_plus_lambda"
    population: int = 64
    offspring: int = 0
    generations: int = 100
    cxpb: float = 0.6
    mutpb: float = 0.3
    eta_cx: float = 15.0
    eta_mut: float = 20.0
    indpb: float = 0.0
    tournament: int = 3
    hall_of_fame: int = 10
    sigma: float = 0.25
    operators: str = "auto"
    start_from_model: bool = False

    @property
    def lambda_(self) -> int:
        """Offspring per generation."""
        return self.offspring or self.population


@dataclass
class StopSettings:
    """Stopping rules (see :data:`EXAMPLE`)."""

    patience: int = 0
    min_improvement: float = 1e-6
    target_error: float = 0.0
    wall_time: float = 0.0


@dataclass
class FitConfig:
    """A validated fit configuration with everything loaded.

    Attributes
    ----------
    path, text
        The configuration file and its text.
    scheme
        The scheme with the configuration's parameter overrides and ties applied.
    pmap
        Genes ↔ parameters.
    protocols
        The protocols with their data.
    """

    path: str
    text: str
    model_path: str
    scheme: Scheme
    pmap: ParameterMap
    ties: dict[str, tuple[str, float]]
    protocols: list[ProtocolData]
    ga: GASettings
    stop: StopSettings
    seed: int = 0
    backend: str = "auto"
    precision: str = "float64"
    step: float | None = None
    courant: float = DEFAULT_COURANT
    output: str = "fit.h5"
    polish: bool = True
    polish_evaluations: int = 40
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def recordings(self) -> dict[str, Recording | None]:
        """Recording per protocol name."""
        return {p.protocol.name: p.recording for p in self.protocols}

    @property
    def targets(self) -> dict[str, Targets | None]:
        """Targets per protocol name."""
        return {p.protocol.name: p.targets for p in self.protocols}

    def to_dict(self) -> dict[str, Any]:
        """JSON-able settings as resolved (for the run file)."""
        return {
            "config_path": str(Path(self.path).resolve()) if self.path[:1] != "<" else self.path,
            "model": self.model_path, "seed": self.seed, "backend": self.backend,
            "precision": self.precision, "step": self.step, "courant": self.courant,
            "output": self.output, "polish": self.polish,
            "polish_evaluations": self.polish_evaluations,
            "ga": asdict(self.ga), "stop": asdict(self.stop),
            "ties": {k: list(v) for k, v in self.ties.items()},
            "free": self.pmap.gene_names,
            "protocols": [{"name": p.protocol.name, "kind": p.protocol.kind,
                           "source": p.protocol.source, "weight": p.weight,
                           "amplitude": p.amplitude, "mask": [list(m) for m in p.mask],
                           "subtract_baseline": p.subtract_baseline,
                           "recording": None if p.recording is None else p.recording.source,
                           "targets": None if p.targets is None else list(p.targets.sources)}
                          for p in self.protocols],
        }


# ---------------------------------------------------------------------- reading

_TOP = {"model", "output", "seed", "backend", "precision", "step", "courant", "polish",
        "polish_evaluations", "protocols", "parameters", "ga", "stop"}
_PROTOCOL = {"protocol", "name", "exchange", "dt", "recording", "targets", "weight",
             "amplitude", "mask", "subtract_baseline"}
_PARAM_KEYS = {"bounds", "value", "scale", "fixed"}


class _Checker:
    def __init__(self, file: str) -> None:
        self.file = file

    def error(self, message: str, where: str, value: Any = None) -> KingenError:
        return KingenError(message, file=self.file, field=where, value=value)

    def keys(self, table: dict, allowed: set[str], where: str) -> None:
        for key in table:
            if key not in allowed:
                raise self.error(f"unknown key (known: {', '.join(sorted(allowed))})",
                                 f"{where}{key}" if where else key)

    def table(self, doc: dict, key: str) -> dict:
        value = doc.get(key, {})
        if not isinstance(value, dict):
            raise self.error("must be a table", key, value)
        return value

    def number(self, t: dict, key: str, default: float, where: str, *, lo: float | None = None,
               hi: float | None = None, strict: bool = False) -> float:
        value = t.get(key, default)
        name = f"{where}{key}"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
                value):
            raise self.error("must be a finite number", name, value)
        if lo is not None and (value <= lo if strict else value < lo):
            raise self.error(f"must be {'>' if strict else '>='} {lo:g}", name, value)
        if hi is not None and value > hi:
            raise self.error(f"must be <= {hi:g}", name, value)
        return float(value)

    def integer(self, t: dict, key: str, default: int, where: str, lo: int = 0) -> int:
        value = t.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error("must be an integer", f"{where}{key}", value)
        if value < lo:
            raise self.error(f"must be >= {lo}", f"{where}{key}", value)
        return int(value)

    def boolean(self, t: dict, key: str, default: bool, where: str) -> bool:
        value = t.get(key, default)
        if not isinstance(value, bool):
            raise self.error("must be true or false", f"{where}{key}", value)
        return value

    def choice(self, t: dict, key: str, default: str, options: tuple[str, ...], where: str
               ) -> str:
        value = t.get(key, default)
        if value not in options:
            raise self.error(f"must be one of {', '.join(options)}", f"{where}{key}", value)
        return str(value)

    def string(self, t: dict, key: str, where: str, default: str | None = None) -> str | None:
        value = t.get(key, default)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise self.error("must be a non-empty string", f"{where}{key}", value)
        return value

    def paths(self, t: dict, key: str, where: str, base: Path) -> list[Path]:
        value = t.get(key)
        if value is None:
            return []
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(
                isinstance(v, str) and v.strip() for v in items):
            raise self.error("must be a file name or a non-empty list of file names",
                             f"{where}{key}", value)
        out = []
        for v in items:
            p = (base / v) if not Path(v).is_absolute() else Path(v)
            if not p.is_file():
                raise self.error("file not found", f"{where}{key}", v)
            out.append(p)
        return out


def load_config(path: str | Path, *, overrides: dict[str, Any] | None = None) -> FitConfig:
    """Read and validate a fit configuration, loading the model, protocols and data.

    Parameters
    ----------
    path
        The TOML file.
    overrides
        Command-line values that replace the file's: ``backend``, ``precision``, ``seed``,
        ``output``, ``generations``, ``population``.

    Raises
    ------
    KingenError
        On the first problem found, naming the file, the field and the value.
    """
    p = Path(path)
    name = str(path)
    if not p.is_file():
        raise KingenError("configuration file not found", file=name)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KingenError(f"cannot read: {exc}", file=name) from None
    return loads_config(text, path=name, base=p.parent, overrides=overrides)


def loads_config(text: str, *, path: str = "<config>", base: str | Path = ".",
                 overrides: dict[str, Any] | None = None, scheme: Scheme | None = None
                 ) -> FitConfig:
    """Validate configuration text; relative paths are taken from ``base``.

    ``scheme``, if given, is used instead of reading the configuration's model file (a
    resumed run uses the scheme stored in its run file); the model file need not exist.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KingenError(f"malformed TOML: {exc}", file=path) from None
    base = Path(base)
    c = _Checker(path)
    c.keys(doc, _TOP, "")
    ov = dict(overrides or {})
    for key in ("backend", "precision", "seed", "output"):
        if ov.get(key) is not None:
            doc[key] = ov[key]

    # ---- model
    model = c.string(doc, "model", "")
    if model is None:
        raise c.error("missing: the scheme file to fit", "model")
    model_path = base / model if not Path(model).is_absolute() else Path(model)
    if scheme is None:
        if not model_path.is_file():
            raise c.error("scheme file not found", "model", model)
        scheme = Scheme.load(model_path)

    # ---- top-level settings
    seed = c.integer(doc, "seed", 0, "")
    backend = c.choice(doc, "backend", "auto", ("auto", "cpu", "cuda"), "")
    precision = c.choice(doc, "precision", "float64", ("float64", "float32"), "")
    step = None
    if "step" in doc:
        step = c.number(doc, "step", 0.0, "", lo=0.0, strict=True)
    courant = c.number(doc, "courant", DEFAULT_COURANT, "", lo=0.0, strict=True)
    if courant >= RK4_STABILITY_LIMIT:
        raise c.error(f"must be below RK4's stability limit {RK4_STABILITY_LIMIT}", "courant",
                      courant)
    polish = c.boolean(doc, "polish", True, "")
    polish_evaluations = c.integer(doc, "polish_evaluations", 40, "", lo=1)
    output = c.string(doc, "output", "", default=None)
    if output is None:
        stem = Path(path).stem if path[:1] != "<" else "fit"
        out_path = base / f"{stem}.h5"
    else:
        out_path = Path(output) if Path(output).is_absolute() or "output" in ov else (
            base / output)

    # ---- parameters
    scheme, ties = _parameters(c, c.table(doc, "parameters"), scheme)
    pmap = ParameterMap(scheme, ties)
    if pmap.n_genes == 0:
        raise c.error("no free parameter to fit", "parameters")

    # ---- GA and stopping rules
    ga = _ga(c, c.table(doc, "ga"), ov)
    stop = _stop(c, c.table(doc, "stop"))

    # ---- protocols and data
    raw = doc.get("protocols")
    if raw is None:
        raise c.error("missing: give at least one [[protocols]] table", "protocols")
    if not isinstance(raw, list) or not raw or not all(isinstance(t, dict) for t in raw):
        raise c.error("must be a non-empty array of tables ([[protocols]])", "protocols")
    items = [_protocol(c, t, i, base) for i, t in enumerate(raw)]
    seen: set[str] = set()
    for i, item in enumerate(items):
        if item.protocol.name in seen:
            raise c.error("two protocols with the same name (give one a distinct name = ...)",
                          f"protocols[{i}].name", item.protocol.name)
        seen.add(item.protocol.name)

    cfg = FitConfig(path=path, text=text, model_path=str(model_path), scheme=scheme,
                    pmap=pmap, ties=ties, protocols=items, ga=ga, stop=stop, seed=seed,
                    backend=backend, precision=precision, step=step, courant=courant,
                    output=str(out_path), polish=polish, polish_evaluations=polish_evaluations)
    cfg.settings = cfg.to_dict()
    return cfg


def _parameters(c: _Checker, t: dict, scheme: Scheme
                ) -> tuple[Scheme, dict[str, tuple[str, float]]]:
    names = scheme.param_names
    reserved = {"free", "fixed", "tied"}

    def known(name: Any, where: str) -> str:
        if not isinstance(name, str) or name not in names:
            raise c.error(f"unknown parameter (parameters are {', '.join(names)})", where, name)
        return name

    def name_list(key: str) -> list[str] | None:
        if key not in t:
            return None
        v = t[key]
        if not isinstance(v, list):
            raise c.error("must be a list of parameter names", f"parameters.{key}", v)
        return [known(x, f"parameters.{key}") for x in v]

    overrides: dict[str, dict] = {}
    for key, spec in t.items():
        if key in reserved:
            continue
        known(key, f"parameters.{key}")
        if not isinstance(spec, dict):
            raise c.error("must be a table such as { bounds = [1, 100] }", f"parameters.{key}",
                          spec)
        c.keys(spec, _PARAM_KEYS, f"parameters.{key}.")
        o: dict[str, Any] = {}
        if "bounds" in spec:
            b = spec["bounds"]
            if (not isinstance(b, list) or len(b) != 2 or any(
                    isinstance(x, bool) or not isinstance(x, (int, float)) for x in b)):
                raise c.error("must be [lower, upper]", f"parameters.{key}.bounds", b)
            o["bounds"] = [float(b[0]), float(b[1])]
        if "value" in spec:
            o["value"] = c.number(spec, "value", 0.0, f"parameters.{key}.")
        if "scale" in spec:
            o["scale"] = c.choice(spec, "scale", "log", ("log", "linear"), f"parameters.{key}.")
        if "fixed" in spec:
            o["fixed"] = c.boolean(spec, "fixed", False, f"parameters.{key}.")
        overrides[key] = o
    free = name_list("free")
    fixed = name_list("fixed") or []
    derived = {p.name for p in scheme.parameters if p.derived}
    for n in fixed + (free or []):
        if n in derived:
            raise c.error("is derived (computed for microscopic reversibility); it cannot be "
                          "listed as free or fixed", "parameters", n)
    if free is not None:
        for p in scheme.parameters:
            if not p.derived:
                overrides.setdefault(p.name, {})["fixed"] = p.name not in free
    for n in fixed:
        if free is not None and n in free:
            raise c.error("listed both as free and as fixed", "parameters.fixed", n)
        overrides.setdefault(n, {})["fixed"] = True
    scheme = apply_overrides(scheme, overrides, file=c.file)

    ties: dict[str, tuple[str, float]] = {}
    raw = t.get("tied", {})
    if not isinstance(raw, dict):
        raise c.error("must be a table such as { k_b = \"k_a\" }", "parameters.tied", raw)
    for target, spec in raw.items():
        where = f"parameters.tied.{target}"
        known(target, where)
        if isinstance(spec, str):
            source, factor = spec, 1.0
        elif isinstance(spec, dict):
            c.keys(spec, {"to", "factor"}, f"{where}.")
            source = spec.get("to")
            factor = c.number(spec, "factor", 1.0, f"{where}.", lo=0.0, strict=True)
        else:
            raise c.error("must be a parameter name or { to = \"k_a\", factor = 2 }", where,
                          spec)
        known(source, f"{where}.to")
        ps = {p.name: p for p in scheme.parameters}
        if source == target:
            raise c.error("a parameter cannot be tied to itself", where, source)
        if ps[target].derived or ps[source].derived:
            raise c.error("derived parameters cannot be tied", where, source)
        if source in raw:
            raise c.error("tied to a parameter that is itself tied", where, source)
        if ps[target].order != ps[source].order:
            raise c.error("tied to a parameter of another order (a binding rate and a "
                          "first-order rate)", where, source)
        ties[target] = (source, factor)
    if ties:
        scheme = apply_ties(scheme, ties)
    return scheme, ties


def _ga(c: _Checker, t: dict, ov: dict) -> GASettings:
    w = "ga."
    c.keys(t, set(GASettings.__dataclass_fields__), w)
    if ov.get("generations") is not None:
        t = {**t, "generations": ov["generations"]}
    if ov.get("population") is not None:
        t = {**t, "population": ov["population"]}
        t.pop("offspring", None)
    ga = GASettings(
        algorithm=c.choice(t, "algorithm", "mu_plus_lambda", ALGORITHMS, w),
        population=c.integer(t, "population", 64, w, lo=2),
        offspring=c.integer(t, "offspring", 0, w, lo=0),
        generations=c.integer(t, "generations", 100, w, lo=1),
        cxpb=c.number(t, "cxpb", 0.6, w, lo=0.0, hi=1.0),
        mutpb=c.number(t, "mutpb", 0.3, w, lo=0.0, hi=1.0),
        eta_cx=c.number(t, "eta_cx", 15.0, w, lo=0.0, strict=True),
        eta_mut=c.number(t, "eta_mut", 20.0, w, lo=0.0, strict=True),
        indpb=c.number(t, "indpb", 0.0, w, lo=0.0, hi=1.0),
        tournament=c.integer(t, "tournament", 3, w, lo=1),
        hall_of_fame=c.integer(t, "hall_of_fame", 10, w, lo=1),
        sigma=c.number(t, "sigma", 0.25, w, lo=0.0, strict=True),
        operators=c.choice(t, "operators", "auto", OPERATORS, w),
        start_from_model=c.boolean(t, "start_from_model", False, w),
    )
    if ga.cxpb + ga.mutpb > 1.0 + 1e-12:
        raise c.error("cxpb + mutpb must be <= 1", "ga.mutpb", ga.mutpb)
    if ga.algorithm == "mu_plus_lambda" and ga.offspring and ga.offspring < 1:
        raise c.error("must be >= 1", "ga.offspring", ga.offspring)
    return ga


def _stop(c: _Checker, t: dict) -> StopSettings:
    w = "stop."
    c.keys(t, set(StopSettings.__dataclass_fields__), w)
    return StopSettings(
        patience=c.integer(t, "patience", 0, w),
        min_improvement=c.number(t, "min_improvement", 1e-6, w, lo=0.0),
        target_error=c.number(t, "target_error", 0.0, w, lo=0.0),
        wall_time=c.number(t, "wall_time", 0.0, w, lo=0.0),
    )


def _protocol(c: _Checker, t: dict, i: int, base: Path) -> ProtocolData:
    w = f"protocols[{i}]."
    c.keys(t, _PROTOCOL, w)
    spec = c.string(t, "protocol", w)
    if spec is None:
        raise c.error("missing: a standard protocol name or a protocol file", f"{w}protocol")
    recordings = c.paths(t, "recording", w, base)
    target_files = c.paths(t, "targets", w, base)
    recs = [load_recording(p) for p in recordings]
    for p, r in zip(recordings, recs, strict=True):
        if r.n_sweeps == 0 or all(np.asarray(r.sweep_current(k)).size == 0
                                  for k in range(r.n_sweeps)):
            raise c.error("empty recording: no sweeps", f"{w}recording", str(p))
    standard = spec in STANDARD_PROTOCOLS
    if standard:
        dt_default = _recording_dt(recs) or 0.02
        exchange = c.number(t, "exchange", 0.0, w, lo=0.0)
        dt = c.number(t, "dt", dt_default, w, lo=0.0, strict=True)
        protocol = standard_protocol(spec, exchange=exchange, dt=dt)
    else:
        p = base / spec if not Path(spec).is_absolute() else Path(spec)
        if not p.is_file():
            raise c.error(f"not a standard protocol ({', '.join(STANDARD_PROTOCOLS)}) and no "
                          "such protocol file", f"{w}protocol", spec)
        for key in ("exchange", "dt"):
            if key in t:
                raise c.error("only for standard protocols (set it in the protocol file)",
                              f"{w}{key}", t[key])
        protocol = load_protocol(p)
    name = c.string(t, "name", w)
    if name is not None:
        protocol = replace(protocol, name=name)
    recording = _merge_recordings(recs) if recs else None
    if recording is not None and recording.protocol is not None:
        ok = {protocol.name, protocol.kind, Path(protocol.source).stem, spec}
        if recording.protocol not in ok:
            raise c.error(f"the recording is of protocol '{recording.protocol}', which is not "
                          f"the protocol it is given for ('{protocol.name}')",
                          f"{w}recording", recording.source)
    targets = load_targets(target_files) if target_files else None
    if targets is not None and not (targets.features or targets.recovery is not None
                                    or targets.dose_response is not None):
        raise c.error("empty targets: no feature or table", f"{w}targets", target_files[0].name)
    if recording is None and targets is None:
        raise c.error("no data: give recording = ... and/or targets = ...", f"{w}recording")
    amplitude = None
    if "amplitude" in t:
        amplitude = c.number(t, "amplitude", 0.0, w, lo=0.0, strict=True)
    mask_raw = t.get("mask", [])
    if not isinstance(mask_raw, list) or not all(
            isinstance(m, list) and len(m) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in m)
            and m[0] < m[1] for m in mask_raw):
        raise c.error("must be a list of [t0, t1] ranges with t0 < t1 (ms)", f"{w}mask",
                      mask_raw)
    return ProtocolData(
        protocol=protocol, recording=recording, targets=targets,
        weight=c.number(t, "weight", 1.0, w, lo=0.0, strict=True), amplitude=amplitude,
        mask=[(float(a), float(b)) for a, b in mask_raw],
        subtract_baseline=c.boolean(t, "subtract_baseline", True, w), source=c.file)


def _recording_dt(recs: list[Recording]) -> float | None:
    for r in recs:
        t = np.asarray(r.sweep_time(0), dtype=float)
        if t.size > 1:
            return float(np.median(np.diff(t)))
    return None


def _merge_recordings(recs: list[Recording]) -> Recording:
    if len(recs) == 1:
        return recs[0]
    times, currents, labels = [], [], []
    for r in recs:
        for label, t, y, _ in r.sweeps():
            times.append(t)
            currents.append(y)
            labels.append(label)
    return Recording(recs[0].protocol, times, currents, labels,
                     source=", ".join(r.source for r in recs),
                     meta={"files": [r.source for r in recs]})

