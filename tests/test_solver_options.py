"""One frozen SolverOptions, checked once and passed down to every solver a fit builds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import kingen
from kingen.errors import KingenError
from kingen.experiment.protocol import standard_protocol
from kingen.scaleout import fitting as scaleout_fitting
from kingen.scaleout.worker import SolverPlugin
from kingen.solve import simulate_batch
from kingen.solve.options import SolverOptions


@pytest.mark.parametrize("field, value", [
    ("precision", "fp64"), ("backend", "gpu"), ("step", 0.0), ("step", float("nan")),
    ("courant", 3.0), ("courant", "2.5"), ("launch", "propagator")])
def test_a_bad_option_is_one_error_naming_the_option(field, value):
    with pytest.raises(KingenError) as caught:
        SolverOptions(**{field: value})
    line = str(caught.value)
    assert line.startswith(f"SolverOptions.{field} = ") and "\n" not in line
    assert "--" not in line  # the library names its option, not a command-line flag


def test_the_options_are_frozen_and_a_changed_copy_is_checked_again():
    options = SolverOptions(backend="cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.precision = "float32"  # type: ignore[misc]
    assert options.replace(precision="float32").precision == "float32"
    with pytest.raises(KingenError, match="SolverOptions.precision"):
        options.replace(precision="float16")


def test_a_fit_configuration_gives_its_options_to_the_objective_and_the_simulator():
    cfg = kingen.load_config(kingen.demo_config(), overrides={"backend": "cpu"})
    cfg.courant, cfg.step = 1.5, None
    objective = kingen.Objective(cfg.scheme, cfg.protocols, cfg.solver)
    assert objective.simulator.options == SolverOptions(backend="cpu", courant=1.5)
    default = kingen.Objective(cfg.scheme, cfg.protocols, SolverOptions(backend="cpu"))
    # the Courant number reached the step choice
    assert objective.simulator.schedule.total_steps > default.simulator.schedule.total_steps


def test_the_old_keywords_still_work_with_a_warning_naming_the_option_to_use():
    cfg = kingen.load_config(kingen.demo_config())
    params = np.stack([cfg.scheme.values] * 2)
    with pytest.warns(DeprecationWarning,
                      match=r"Objective\(backend=\.\.\.\) is deprecated: pass "
                            r"options=SolverOptions\(backend=\.\.\.\)"):
        old = kingen.Objective(cfg.scheme, cfg.protocols, backend="cpu")
    new = kingen.Objective(cfg.scheme, cfg.protocols, SolverOptions(backend="cpu"))
    np.testing.assert_array_equal(old.evaluate(params)[0].fitness,
                                  new.evaluate(params)[0].fitness)
    protocol = standard_protocol("deactivation")
    with pytest.warns(DeprecationWarning, match="simulate_batch"):
        old_traces = simulate_batch(cfg.scheme, protocol, params, backend="cpu", step=0.01)
    np.testing.assert_array_equal(old_traces.traces, simulate_batch(
        cfg.scheme, protocol, params, options=SolverOptions(backend="cpu", step=0.01)).traces)
    with pytest.raises(TypeError, match="not both"):
        kingen.Objective(cfg.scheme, cfg.protocols, SolverOptions(), backend="cpu")


def test_the_workers_solve_with_the_fits_own_options(monkeypatch):
    cfg = kingen.load_config(kingen.demo_config(), overrides={"backend": "cpu"})
    cfg.courant = 1.5
    objective = kingen.Objective(cfg.scheme, cfg.protocols, cfg.solver)
    given = {}

    class Recorder:
        def __init__(self, client, scheme, items, options, **kwargs):
            given["options"] = options

    monkeypatch.setattr(scaleout_fitting, "ShardedEvaluator", Recorder)
    scaleout_fitting._Evaluators(None, {})(objective)
    assert given["options"] == SolverOptions(backend="cpu", courant=1.5)
    plugin = SolverPlugin(cfg.scheme, cfg.protocols, given["options"])
    plugin.setup()
    assert plugin.objective is not None
    assert plugin.objective.simulator.options.courant == 1.5
