"""The benchmark suites: one driver, one results tree, a provenance block in every new result.

Speed itself is never asserted here; these tests keep the suites runnable and their results
findable and attributable.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is not installed: it runs from the repository
    sys.path.insert(0, str(ROOT))

from benchmarks.__main__ import SUITES, main  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PROVENANCE = {"suite", "command", "git_commit", "git_dirty", "device", "host", "versions"}


def test_the_driver_lists_every_suite_and_refuses_an_unknown_one(capsys) -> None:
    assert main([]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed for name in SUITES)
    assert main(["no_such_suite"]) == 2
    assert "unknown suite 'no_such_suite'" in capsys.readouterr().err


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_suite_is_a_module_with_main_and_an_out_option(suite: str, capsys) -> None:
    module = importlib.import_module(f"benchmarks.{suite}")
    with pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0
    usage = capsys.readouterr().out
    assert "--out" in usage and "--name" in usage


def _results() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file())


@pytest.mark.parametrize("path", _results(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_result_sits_in_the_tree_and_says_where_it_came_from(path: Path) -> None:
    parts = path.relative_to(RESULTS).parts
    if parts[1] == "logs":  # console logs of whole runs on a GPU machine
        assert len(parts) == 3 and path.suffix == ".log"
        return
    assert path.suffix == ".json", "only JSON results (analysis reports go to analysis/)"
    suite = parts[1][: -len(".json")] if len(parts) == 2 else parts[1]
    assert suite in SUITES and len(parts) in (2, 3), "benchmarks/results/<device>/<suite>..."
    result = json.loads(path.read_text(encoding="utf-8"))
    if "provenance" in result:
        assert PROVENANCE <= set(result["provenance"])
        assert result["provenance"]["suite"] == suite
    else:  # recorded before the driver: its own command, and a note on what it lacks
        assert result.get("command") and result.get("note")


def test_a_suite_run_records_its_provenance_in_the_tree_layout(tmp_path: Path) -> None:
    from benchmarks import provenance, rest_state

    out = tmp_path / "rest.json"
    assert rest_state.main(["--population", "64", "--repeats", "1", "--out", str(out)]) == 0
    block = json.loads(out.read_text(encoding="utf-8"))["provenance"]
    assert block["command"] == ("python -m benchmarks rest_state --population 64 --repeats 1 "
                                f"--out {out}")
    assert len(block["git_commit"]) == 40 and block["versions"]["numpy"]
    default = provenance.results_path("rest_state")
    assert default == RESULTS / block["device_folder"] / "rest_state.json"
    assert provenance.results_path("solver", "rh03", "h100") == RESULTS / "h100/solver/rh03.json"
    assert provenance.device_folder("NVIDIA H100 80GB HBM3") == "h100"
    assert provenance.device_folder("NVIDIA H200", count=2) == "h200x2"


def test_the_fit_gpu_suite_names_the_problem_it_was_given(tmp_path: Path) -> None:
    from benchmarks.fit_gpu import problem_label
    from kingen.fitting.config import demo_config, load_config

    demo = load_config(demo_config())
    assert problem_label(demo, None).startswith("bundled demo: scheme Jonas")
    other = tmp_path / "rh.toml"
    bundled = demo_config().parent
    other.write_text(demo_config().read_text(encoding="utf-8").replace(
        '"demo/', f'"{bundled.as_posix()}/demo/'), encoding="utf-8")
    label = problem_label(load_config(other), other)
    assert label.startswith("configuration rh.toml: scheme Jonas")
    assert "bundled demo" not in label


def test_the_solver_suites_make_the_windows_each_kind_of_fit_reads() -> None:
    # one peak window over each sweep (the files' batches), none (a fit to recordings) or
    # the four a fit with summary targets reads
    from benchmarks.solver import objective_inputs
    from kingen.experiment.protocol import Protocol, Pulse, Sweep
    from kingen.fitting.targets import sweep_windows
    from kingen.model.scheme import Scheme

    scheme = Scheme.load(Path(__file__).resolve().parents[1] / "models" / "jonas_1993.toml")
    sweep = Sweep("1", 20.0, pulses=(Pulse(2.0, 1.0, 1.0),), dt=0.1)
    protocols = [Protocol("deactivation", "deactivation", (sweep,))]
    whole = objective_inputs(scheme, protocols).windows
    assert whole[0, 0].tolist() == [0, sweep.n_samples - 1, 0] and (whole[0, 1:, 2] < 0).all()
    assert (objective_inputs(scheme, protocols, "none").windows[..., 2] < 0).all()
    targets = objective_inputs(scheme, protocols, "targets").windows
    np.testing.assert_array_equal(targets[0], sweep_windows(sweep, "deactivation"))
    assert (targets[0, :, 2] >= 0).sum() == 4
    with pytest.raises(ValueError, match="windows must be one of"):
        objective_inputs(scheme, protocols, "peaks")


def test_the_propagator_suite_runs_a_named_part_of_the_standard_set(capsys) -> None:
    from benchmarks import propagator

    assert propagator.protocol_names("dose_response, deactivation") == [
        "deactivation", "dose_response"]
    for bad in ("dose-response", "", "deactivation,pulse"):
        with pytest.raises(ValueError, match="--protocols takes some of deactivation"):
            propagator.protocol_names(bad)
    with pytest.raises(SystemExit) as stop:  # refused before anything is compiled
        propagator.main(["--protocols", "recovery,paired_pulse", "--backend", "cpu"])
    assert stop.value.code == 2
    assert "got 'recovery,paired_pulse'" in capsys.readouterr().err
