"""The fit configuration file (TOML): read, validate every field, resolve paths.

Everything is checked here, before any simulation: each problem ends in one
:class:`~kingen.errors.KingenError` line naming the file, the field and the value. Paths are
relative to the configuration file. See :data:`EXAMPLE` for every field with its default.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kingen.base.files import read_text
from kingen.errors import KingenError
from kingen.experiment.protocol import (
    Sweep,
)
from kingen.experiment.recordings import Recording, Targets
from kingen.fitting.algorithms import algorithm_names
from kingen.fitting.config_parameters import read_parameters
from kingen.fitting.config_protocols import ConfigFields, read_protocol
from kingen.fitting.objective import ProtocolData
from kingen.fitting.params import ParameterMap
from kingen.fitting.temperature import check_temperatures
from kingen.model import limits
from kingen.model.fields import loads_toml
from kingen.model.scheme import Scheme
from kingen.model.shipped import shipped_models, shipped_scheme
from kingen.solve.options import SolverOptions
from kingen.solve.schedule import (
    DEFAULT_COURANT,
    RK4_STABILITY_LIMIT,
    max_rates,
    step_limit,
)

OPERATORS = ("auto", "deap", "numpy")
# At and above this many offspring the numpy operators replace DEAP's per-individual ones.
NUMPY_OPERATORS_FROM = 2048
# Generations without a relative improvement of the best above [stop] min_improvement after
# which a fit stops as converged: enough for the (μ + λ) search's slow late gains to show.
DEFAULT_PATIENCE = 20

EXAMPLE = '''\
model = "model.toml"        # required: the kinetic scheme to fit
output = "fit.h5"           # run file (default: <config name>.h5 beside the config)
seed = 0                    # random seed (same seed, backend, precision: same result)
backend = "auto"            # auto | cpu | cuda
precision = "float64"       # float64 | float32
# step = 0.001              # fixed RK4 step, ms (default: automatic, per segment)
courant = 2.5               # h·ρ of the automatic step choice, in (0, 2.785)
polish = true               # refine the best by Levenberg-Marquardt on the likelihood at the end
polish_evaluations = 40     # at most this many Levenberg-Marquardt iterations per start
polish_starts = 4           # from the best this many members of the hall of fame, together
force = false               # lift the size limits of kingen.model.limits (as --force does)

[[protocols]]
protocol = "deactivation"   # standard name, or a protocol TOML file
name = "deactivation"       # default: the protocol's own name; must be unique
exchange = 0.2              # standard protocols: 10-90 % exchange time, ms (default 0);
                            #   any protocol: a measured waveform, { file = "tip.csv",
                            #   mode = "template" | "sweep" } (time_ms, junction current)
dt = 0.05                   # standard protocols: sampling interval, ms
                            #   (default: the recording's, else 0.02)
recording = "deact.csv"     # CSV, NWB or ABF; or a list of files (sweeps in order)
targets = "features.csv"    # summary targets (feature CSV, dose or recovery table), or a list
weight = 1.0                # weight of this protocol's error in the fitness
amplitude = "per-protocol"  # per-protocol | per-sweep | rundown (A·(1 + ρ·sweep)), solved by
                            #   least squares; or a number: the channels, fixed
mask = []                   # [[t0, t1], ...] ms ranges of every sweep to ignore
baseline = "none"           # none | pre-pulse | per-sweep: what to subtract from the recording
                            #   (pre-pulse: the mean before the first pulse, all sweeps)
# filter = { kind = "bessel", poles = 8, cutoff_khz = 5 }  # the recording's low-pass filter
                            #   (bessel | butterworth, 2-8 poles), or { response = "step.csv" }
offset = "none"             # none | per-sweep | per-protocol: a DC offset fitted with the
                            #   amplitude
# temperature = 22          # °C of the recording (default: the recording's own, else the
                            #   scheme's reference temperature)

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
patience = 20               # stop, converged, after this many generations without an
                            #   improvement of the best above min_improvement (0: off)
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

    patience: int = DEFAULT_PATIENCE
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
    polish_starts: int = 4
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def solver(self) -> SolverOptions:
        """The solver's options (``backend``, ``precision``, ``step``, ``courant``)."""
        return SolverOptions(backend=self.backend, precision=self.precision, step=self.step,
                             courant=self.courant)

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
            "polish_evaluations": self.polish_evaluations, "polish_starts": self.polish_starts,
            "ga": asdict(self.ga), "stop": asdict(self.stop),
            "ties": {k: list(v) for k, v in self.ties.items()},
            "free": self.pmap.gene_names,
            "protocols": [{"name": p.protocol.name, "kind": p.protocol.kind,
                           "source": p.protocol.source, "weight": p.weight,
                           "amplitude": p.amplitude, "mask": [list(m) for m in p.mask],
                           "baseline": p.baseline,
                           "recording": None if p.recording is None else p.recording.source,
                           "targets": None if p.targets is None else list(p.targets.sources)}
                          for p in self.protocols],
        }


# ---------------------------------------------------------------------- reading

_TOP = {"model", "output", "seed", "backend", "precision", "step", "courant", "polish",
        "polish_evaluations", "polish_starts", "protocols", "parameters", "ga", "stop", "force",
        "cluster"}  # [cluster]: where `kingen fit --cluster CONFIG` runs (kingen.scaleout)


def demo_config() -> Path:
    """The bundled demo configuration (``kingen/bundled/demo.toml``), which ``kingen fit
    --demo`` runs: the Jonas et al. (1993) scheme fitted to SYNTHETIC example recordings.

    Examples
    --------
    >>> import kingen
    >>> path = kingen.demo_config()
    >>> path.name
    'demo.toml'
    >>> cfg = kingen.load_config(path, overrides={"generations": 2, "population": 8})
    >>> [p.protocol.kind for p in cfg.protocols]
    ['deactivation', 'desensitization', 'recovery', 'dose_response']
    >>> cfg.ga.generations, cfg.ga.population
    (2, 8)
    """
    from importlib import resources

    path = Path(str(resources.files("kingen") / "bundled" / "demo.toml"))
    if not path.is_file():
        raise KingenError("the bundled demo is missing from this installation (reinstall "
                          "kingen)", file=str(path))
    return path


def load_config(path: str | Path, *, overrides: dict[str, Any] | None = None) -> FitConfig:
    """Read and validate a fit configuration, loading the model, protocols and data.

    Parameters
    ----------
    path
        The TOML file.
    overrides
        Command-line values that replace the file's: ``backend``, ``precision``, ``seed``,
        ``output``, ``generations``, ``population``, ``force`` (lift the size limits of
        :mod:`kingen.model.limits`); None leaves the file's. Any other key is refused, as an
        unknown field of the file is.

    Raises
    ------
    KingenError
        On the first problem found, naming the file, the field and the value.

    Examples
    --------
    >>> cfg = load_config(demo_config(), overrides={"population": 16, "output": "x.h5"})
    >>> cfg.ga.population, cfg.output, cfg.pmap.n_genes
    (16, 'x.h5', 10)
    >>> load_config(demo_config(), overrides={"generatons": 1})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kingen.errors.KingenError: overrides = 'generatons': unknown override (did you mean ...
    """
    text = read_text(path, what="configuration file")
    return loads_config(text, path=str(path), base=Path(path).parent, overrides=overrides)


def loads_config(text: str, *, path: str = "<config>", base: str | Path = ".",
                 overrides: dict[str, Any] | None = None, scheme: Scheme | None = None
                 ) -> FitConfig:
    """Validate configuration text; relative paths are taken from ``base``.

    ``scheme``, if given, is used instead of reading the configuration's model file (a
    resumed run uses the scheme stored in its run file); the model file need not exist.
    """
    doc = loads_toml(text, path)
    base = Path(base)
    c = ConfigFields(path)
    c.keys(doc, _TOP, "")
    ov = dict(overrides or {})
    _check_overrides(ov)
    for key in ("backend", "precision", "seed", "output"):
        if ov.get(key) is not None:
            doc[key] = ov[key]
    force = bool(ov.get("force")) or c.boolean(doc, "force", "", False)

    # ---- model
    model = c.string(doc, "model", "", None)
    if model is None:
        raise c.error("missing: the scheme file to fit", "model")
    model_path = base / model if not Path(model).is_absolute() else Path(model)
    if scheme is None:
        if not model_path.is_file():
            model_path = shipped_scheme(model) or model_path
        if not model_path.is_file():
            raise c.error("scheme file not found, nor a shipped scheme of that name "
                          f"({', '.join(shipped_models())})", "model", model)
        scheme = Scheme.load(model_path, force=force)

    # ---- top-level settings
    seed = c.integer(doc, "seed", "", 0, ge=0)
    backend = c.choice(doc, "backend", ("auto", "cpu", "cuda"), "", "auto")
    precision = c.choice(doc, "precision", ("float64", "float32"), "", "float64")
    step = None
    if "step" in doc:
        step = c.number(doc, "step", "", gt=0.0)
    courant = c.number(doc, "courant", "", DEFAULT_COURANT, gt=0.0)
    if courant >= RK4_STABILITY_LIMIT:
        raise c.error(f"must be below RK4's stability limit {RK4_STABILITY_LIMIT}", "courant",
                      courant)
    polish = c.boolean(doc, "polish", "", True)
    polish_evaluations = c.integer(doc, "polish_evaluations", "", 40, ge=1)
    polish_starts = c.integer(doc, "polish_starts", "", 4, ge=1)
    output = c.string(doc, "output", "", None)
    if output is None:
        stem = Path(path).stem if path[:1] != "<" else "fit"
        out_path = base / f"{stem}.h5"
    else:
        # -o on the command line is the user's path as typed (from the working folder);
        # the file's own is relative to the file, as its other paths are
        out_path = Path(output) if Path(output).is_absolute() or ov.get(
            "output") is not None else base / output

    # ---- parameters
    scheme, ties = read_parameters(c, c.table(doc, "parameters"), scheme)
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
    items = [read_protocol(c, t, i, base, force) for i, t in enumerate(raw)]
    seen: set[str] = set()
    for i, item in enumerate(items):
        if item.protocol.name in seen:
            raise c.error("two protocols with the same name (give one a distinct name = ...)",
                          f"protocols[{i}].name", item.protocol.name)
        seen.add(item.protocol.name)

    check_temperatures(scheme, [item.protocol for item in items], path)

    # ---- the work and memory a generation needs, before anything is allocated
    sweeps = [s for item in items for s in item.protocol.sweeps]
    steps = estimate_rk4_steps(scheme, sweeps, step=step, courant=courant)
    limits.check(steps, limits.MAX_STEPS_PER_CANDIDATE, "RK4 steps to simulate one candidate",
                 force=force, file=path, field="step" if step is not None else "courant",
                 value=step if step is not None else courant,
                 hint="a larger step, a courant nearer 2.5, a larger dt or shorter sweeps "
                      "(kingen.model.limits.MAX_STEPS_PER_CANDIDATE)")
    candidates = ga.population + ga.lambda_
    limits.check_memory(
        generation_bytes(candidates, scheme.n_params, scheme.n_states, len(sweeps)),
        f"a generation of {candidates:,} candidates", force=force, file=path,
        field="ga.population", value=ga.population, hint="lower ga.population")

    cfg = FitConfig(path=path, text=text, model_path=str(model_path), scheme=scheme,
                    pmap=pmap, ties=ties, protocols=items, ga=ga, stop=stop, seed=seed,
                    backend=backend, precision=precision, step=step, courant=courant,
                    output=str(out_path), polish=polish, polish_evaluations=polish_evaluations,
                    polish_starts=polish_starts)
    cfg.settings = cfg.to_dict()
    return cfg


# What load_config's overrides may replace (the command line's options).
OVERRIDES = ("backend", "precision", "seed", "output", "generations", "population", "force")


def _check_overrides(overrides: dict[str, Any]) -> None:
    """Refuse an override that is not one of :data:`OVERRIDES`, as a file's unknown field
    is refused: a misspelt one would otherwise be ignored in silence."""
    for key in overrides:
        if key not in OVERRIDES:
            close = difflib.get_close_matches(str(key), OVERRIDES, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise KingenError(f"unknown override ({hint}known: {', '.join(OVERRIDES)})",
                              field="overrides", value=key)


def estimate_rk4_steps(scheme: Scheme, sweeps: list[Sweep], *, step: float | None = None,
                       courant: float = DEFAULT_COURANT) -> float:
    """RK4 steps one candidate takes over ``sweeps``, estimated without building the
    schedule: each segment at the step :func:`kingen.solve.schedule.build_schedule` would
    choose there, plus one per sample. A float: a hostile step makes it astronomically big."""
    pmax = max_rates(scheme)
    total = 0.0
    for sweep in sweeps:
        total += sweep.duration / sweep.dt + 1.0
        for seg in sweep.segments():
            if seg.smooth:
                probe = np.linspace(seg.start, seg.end, 257)
                cmax = float(sweep.concentration(probe).max())
            else:
                cmax = seg.concentration
            h = step if step is not None else step_limit(scheme, cmax, pmax, courant)
            h = min(h, sweep.dt)
            with np.errstate(over="ignore"):
                total += (seg.end - seg.start) / h if h > 0 else math.inf
    return total


def generation_bytes(candidates: int, n_params: int, n_states: int, n_sweeps: int) -> float:
    """Memory one generation's arrays take, estimated: per candidate its genes, parameters,
    errors and features (16 numbers a parameter), and per candidate and sweep the solver's
    state and results (4 numbers a state, and 32 more)."""
    per_candidate = 16 * n_params + n_sweeps * (4 * n_states + 32)
    return 8.0 * float(candidates) * per_candidate


def _ga(c: ConfigFields, t: dict, ov: dict) -> GASettings:
    w = "ga"
    c.keys(t, set(GASettings.__dataclass_fields__), w)
    if ov.get("generations") is not None:
        t = {**t, "generations": ov["generations"]}
    if ov.get("population") is not None:
        t = {**t, "population": ov["population"]}
        t.pop("offspring", None)
    ga = GASettings(
        algorithm=c.choice(t, "algorithm", algorithm_names(), w, "mu_plus_lambda"),
        population=c.integer(t, "population", w, 64, ge=2),
        offspring=c.integer(t, "offspring", w, 0, ge=0),
        generations=c.integer(t, "generations", w, 100, ge=1),
        cxpb=c.number(t, "cxpb", w, 0.6, ge=0.0, le=1.0),
        mutpb=c.number(t, "mutpb", w, 0.3, ge=0.0, le=1.0),
        eta_cx=c.number(t, "eta_cx", w, 15.0, gt=0.0),
        eta_mut=c.number(t, "eta_mut", w, 20.0, gt=0.0),
        indpb=c.number(t, "indpb", w, 0.0, ge=0.0, le=1.0),
        tournament=c.integer(t, "tournament", w, 3, ge=1),
        hall_of_fame=c.integer(t, "hall_of_fame", w, 10, ge=1),
        # a fraction of each gene's range: past 1 it only throws samples out of bounds,
        # and a huge one overflows CMA-ES's covariance
        sigma=c.number(t, "sigma", w, 0.25, gt=0.0, le=1.0),
        operators=c.choice(t, "operators", OPERATORS, w, "auto"),
        start_from_model=c.boolean(t, "start_from_model", w, False),
    )
    if ga.cxpb + ga.mutpb > 1.0 + 1e-12:
        raise c.error("cxpb + mutpb must be <= 1", "ga.mutpb", ga.mutpb)
    if ga.tournament > ga.population + ga.lambda_:
        # each selection draws this many: past the pool it only costs time
        raise c.error(f"must be <= population + offspring ({ga.population + ga.lambda_})",
                      "ga.tournament", ga.tournament)
    return ga


class _StoredSettings(ConfigFields):
    """Reads of a run file's stored settings (``/config/settings``), which a fit wrote
    valid: a problem there is damage, said so."""

    def error(self, message: str, field: str | None = None, value: Any = None) -> KingenError:
        where = "/config/settings" + (f".{field}" if field else "")
        return KingenError(f"{message}: the run file is damaged or was edited; restore it "
                           "from a copy", file=self.file, field=where, value=value)


def stored_settings(settings: dict[str, Any], file: str
                    ) -> tuple[GASettings, StopSettings, int, str, str]:
    """The search settings a run file stored (``ga``, ``stop``, ``seed``, ``backend``,
    ``precision``), checked as a configuration's are: a damaged or edited file is one
    line naming the field, never a KeyError half-way through ``kingen resume``.

    Examples
    --------
    >>> ga, stop, seed, backend, precision = stored_settings(
    ...     {"ga": {"population": 8}, "stop": {}, "seed": 3, "backend": "cpu",
    ...      "precision": "float64"}, "run.h5")
    >>> ga.population, seed
    (8, 3)
    >>> try:
    ...     stored_settings({"stop": {}}, "run.h5")
    ... except KingenError as exc:
    ...     print(exc)  # doctest: +NORMALIZE_WHITESPACE
    run.h5: /config/settings.ga: missing table: the run file is damaged or was edited;
    restore it from a copy
    """
    c = _StoredSettings(file)
    ga = _ga(c, c.table(settings, "ga", required=True), {})
    stop = _stop(c, c.table(settings, "stop", required=True))
    return (ga, stop, c.integer(settings, "seed", "", ge=0),
            c.choice(settings, "backend", ("auto", "cpu", "cuda")),
            c.choice(settings, "precision", ("float64", "float32")))


def _stop(c: ConfigFields, t: dict) -> StopSettings:
    w = "stop"
    c.keys(t, set(StopSettings.__dataclass_fields__), w)
    return StopSettings(
        patience=c.integer(t, "patience", w, DEFAULT_PATIENCE, ge=0),
        min_improvement=c.number(t, "min_improvement", w, 1e-6, ge=0.0),
        target_error=c.number(t, "target_error", w, 0.0, ge=0.0),
        wall_time=c.number(t, "wall_time", w, 0.0, ge=0.0),
    )
