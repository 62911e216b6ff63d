"""kingen: fit kinetic (Markov) models of ion channels to electrophysiology recordings.

The entry points of every layer, for scripts and notebooks; the ``kingen`` command is a
thin shell over the same functions. Names are imported on first use (as in scikit-image),
so ``import kingen`` stays fast and loads neither Numba, h5py, SciPy nor Matplotlib.

======================  ==========================  ===========================================
layer                   name                        what it does
======================  ==========================  ===========================================
model                   :class:`Scheme`             ``Scheme.load(path)``: read a scheme file
model                   :func:`import_scheme`       a scheme from a NEURON .mod or Myokit .mmt
model                   :func:`export_scheme`       a scheme as a NEURON .mod or Myokit .mmt
experiment              :func:`standard_protocol`   a standard AMPA protocol by name
experiment              :func:`load_protocol`       a protocol by name or from a TOML file
experiment              :func:`load_recording`      a recording from CSV, NWB or ABF
experiment              :func:`load_targets`        summary targets (features, tables)
simulation              :func:`simulate`            currents of one scheme under a protocol
simulation              :func:`simulate_batch`      the batched RK4 solver (CPU or GPU)
simulation              :class:`SolverOptions`      backend, precision, step of the solver
objective               :class:`Objective`          a population's fitness, batched
search                  :func:`load_config`         read a fit configuration
search                  :func:`demo_config`         the bundled demo configuration
search                  :func:`fit`                 run a fit to its end
search                  :func:`resume`              continue a fit from its run file
search                  :func:`profile`             profile likelihoods of a finished fit
persistence             :class:`RunStore`           ``RunStore.open(path)``: read a run file
output                  :func:`plot_run`            the figures of a run
output                  :func:`write_report`        HTML and markdown summary of a run
scale-out               :func:`run_batch`           a batch manifest's fits on a Dask cluster
scale-out               :func:`fit_on_cluster`      one fit, each generation sharded (Dask)
scale-out               :class:`ClusterSettings`    where scale-out runs (``[cluster]``)
======================  ==========================  ===========================================

Examples
--------
>>> import kingen
>>> scheme = kingen.Scheme.load("models/jonas_1993.toml")
>>> scheme.n_states
7
>>> sim = kingen.simulate(scheme, kingen.standard_protocol("desensitization", dt=0.1))
>>> round(sim.features()["tau_des_ms"], 1)
19.9
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kingen._version import __version__
from kingen.errors import KingenError

# public name -> (module, attribute)
_LAZY: dict[str, tuple[str, str]] = {
    "Scheme": ("kingen.model.scheme", "Scheme"),
    "import_scheme": ("kingen.outputs.interop", "import_scheme"),
    "export_scheme": ("kingen.outputs.interop", "export_scheme"),
    "standard_protocol": ("kingen.experiment.protocol", "standard_protocol"),
    "load_protocol": ("kingen.experiment.protocol", "load_protocol"),
    "Protocol": ("kingen.experiment.protocol", "Protocol"),
    "load_recording": ("kingen.experiment.recordings", "load_recording"),
    "load_targets": ("kingen.experiment.recordings", "load_targets"),
    "Recording": ("kingen.experiment.recordings", "Recording"),
    "Targets": ("kingen.experiment.recordings", "Targets"),
    "simulate": ("kingen.runs.simulate", "simulate"),
    "Simulation": ("kingen.runs.simulate", "Simulation"),
    "simulate_batch": ("kingen.solve.batch", "simulate_batch"),
    "SolverOptions": ("kingen.solve.options", "SolverOptions"),
    "Objective": ("kingen.fitting.objective", "Objective"),
    "load_config": ("kingen.fitting.config", "load_config"),
    "demo_config": ("kingen.fitting.config", "demo_config"),
    "FitConfig": ("kingen.fitting.config", "FitConfig"),
    "fit": ("kingen.runs.fit", "fit"),
    "resume": ("kingen.runs.fit", "resume"),
    "FitResult": ("kingen.runs.result", "FitResult"),
    "RunStore": ("kingen.store", "RunStore"),
    "plot_run": ("kingen.outputs.plot", "plot_run"),
    "write_report": ("kingen.outputs.report", "write_report"),
    "run_batch": ("kingen.scaleout.batch", "run_batch"),
    "fit_on_cluster": ("kingen.scaleout.fitting", "fit_on_cluster"),
    "ClusterSettings": ("kingen.scaleout.cluster", "ClusterSettings"),
    "profile": ("kingen.runs.profile", "profile_run"),
    "ProfileResult": ("kingen.runs.profile", "ProfileResult"),
}

__all__ = [
    "KingenError", "__version__", "Scheme", "import_scheme", "export_scheme",
    "standard_protocol", "load_protocol", "Protocol",
    "load_recording", "load_targets", "Recording", "Targets", "simulate", "Simulation",
    "simulate_batch", "SolverOptions", "Objective", "load_config", "demo_config", "FitConfig",
    "fit", "resume",
    "FitResult", "RunStore", "plot_run", "write_report", "profile", "ProfileResult",
    "run_batch", "fit_on_cluster", "ClusterSettings",
]
# (a test checks that __all__ is _LAZY plus the two eager names)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from kingen.experiment.protocol import Protocol, load_protocol, standard_protocol
    from kingen.experiment.recordings import Recording, Targets, load_recording, load_targets
    from kingen.fitting.config import FitConfig, demo_config, load_config
    from kingen.fitting.objective import Objective
    from kingen.model.scheme import Scheme
    from kingen.outputs.interop import export_scheme, import_scheme
    from kingen.outputs.plot import plot_run
    from kingen.outputs.report import write_report
    from kingen.runs.fit import fit, resume
    from kingen.runs.profile import ProfileResult
    from kingen.runs.profile import profile_run as profile
    from kingen.runs.result import FitResult
    from kingen.runs.simulate import Simulation, simulate
    from kingen.scaleout.batch import run_batch
    from kingen.scaleout.cluster import ClusterSettings
    from kingen.scaleout.fitting import fit_on_cluster
    from kingen.solve.batch import simulate_batch
    from kingen.solve.options import SolverOptions
    from kingen.store import RunStore


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'kingen' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = getattr(module, attribute)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
