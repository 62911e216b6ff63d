"""Exports: the fitted scheme simulates back to the fitted currents; CSV and NWB traces."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_store import AMPLITUDES, make_run, one_line, small_protocols

from kingen.cli.outputs import add_parsers
from kingen.errors import KingenError
from kingen.experiment.recordings import load_recording
from kingen.model.scheme import Scheme
from kingen.outputs.export import export_csv, export_model, export_nwb, fitted_scheme_text
from kingen.solve import simulate_exact
from kingen.store import RunStore


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("run") / "run.h5"
    return path, make_run(path)


def assert_same_current(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    for x, y in zip(a, b, strict=True):
        scale = np.max(np.abs(y))
        assert np.max(np.abs(x - y)) <= 1e-10 * scale


@pytest.mark.parametrize("protocol", ["deactivation", "dose_response"])
def test_exported_model_simulates_the_fitted_currents(run: tuple[Path, dict[str, Any]],
                                                      tmp_path: Path, protocol: str) -> None:
    path, made = run
    out = export_model(path, tmp_path / "fitted.toml", protocol=protocol)
    fitted = Scheme.load(out)
    original = made["scheme"]
    assert fitted.states == original.states
    assert [(t.source, t.target, t.expression) for t in fitted.transitions] == \
        [(t.source, t.target, t.expression) for t in original.transitions]
    np.testing.assert_allclose(fitted.lower, original.lower, rtol=1e-14)
    np.testing.assert_allclose(fitted.upper, original.upper, rtol=1e-14)
    np.testing.assert_allclose(fitted.values, made["fitted"], rtol=1e-14)
    assert fitted.channels == AMPLITUDES[protocol]
    proto = next(p for p in made["protocols"] if p.name == protocol)
    assert_same_current(simulate_exact(fitted, proto).currents,
                        made["traces"][protocol]["fit_pA"])
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Fitted by kingen")
    assert f"from run file {path}" in text and "# Jonas, Major & Sakmann (1993)" in text
    assert "check_reversibility = false" in text  # random fitted rates break the cycles
    assert not list(tmp_path.glob(".*"))


def test_derived_rates_stay_derived(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[1] / "models" / "jonas_1993.toml").read_text()
    text = text.replace('"C5 -> C4" = "k54"', '"C5 -> C4" = { rate = "k54", derived = true }')
    text = text.replace('"C3 -> C1" = "k31"', '"C3 -> C1" = { rate = "k31", derived = true }')
    scheme_file = tmp_path / "derived.toml"
    scheme_file.write_text(text, encoding="utf-8")
    scheme = Scheme.load(scheme_file)
    rng = np.random.default_rng(0)
    params = scheme.complete(scheme.values * np.exp(rng.normal(0, 0.05, scheme.n_params)))
    with RunStore.create(tmp_path / "d.h5", config_text="", config={}, scheme=scheme,
                         protocols=small_protocols(("deactivation",)), recordings={},
                         targets={}, free_mask=scheme.free_mask, population_size=2,
                         environment={}) as st:
        st.write_hall_of_fame(params[None, :], np.zeros(1))
    out = export_model(tmp_path / "d.h5", tmp_path / "fitted.toml")
    fitted = Scheme.load(out)
    assert [p.derived for p in fitted.parameters] == [p.derived for p in scheme.parameters]
    assert "check_reversibility" not in out.read_text()
    np.testing.assert_allclose(fitted.values, params, rtol=1e-12)


def test_traces_to_csv_and_nwb(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, made = run
    paths = export_csv(path, tmp_path / "csv")
    assert [p.name for p in paths] == [f"{p.name}.csv" for p in made["protocols"]]
    rec = load_recording(tmp_path / "csv" / "recovery.csv")
    want = made["traces"]["recovery"]
    assert rec.protocol == "recovery" and rec.sweep_labels == want["labels"]
    for a, b in zip(rec.currents_list(), want["fit_pA"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert rec.sweep_concentration(0).max() == 10.0
    nwbs = export_nwb(path, tmp_path / "fit.nwb")
    assert [p.name for p in nwbs] == [f"fit_{p.name}.nwb" for p in made["protocols"]]
    one = export_nwb(path, tmp_path / "deact.nwb", protocol="deactivation")
    assert one == [tmp_path / "deact.nwb"]
    back = load_recording(one[0])
    np.testing.assert_allclose(back.currents_list()[0],
                               made["traces"]["deactivation"]["fit_pA"][0], rtol=1e-12)


def test_export_errors(tmp_path: Path) -> None:
    path = tmp_path / "empty.h5"
    make_run(path, protocols=small_protocols(("deactivation",)), generations=0, best=False,
             finished=None)
    with pytest.raises(KingenError) as exc:
        export_model(path, tmp_path / "m.toml")
    assert "empty.h5: no fitted candidate in the run file yet" in one_line(exc)
    with pytest.raises(KingenError, match="no fitted traces"):
        export_csv(path, tmp_path / "csv")
    assert not (tmp_path / "m.toml").exists()


def test_cli_handlers(run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="kingen")
    add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["export", str(run[0]), "--model", str(tmp_path / "m.toml"),
                              "--csv", str(tmp_path / "csv")])
    assert args.handler(args) == 0
    assert (tmp_path / "m.toml").is_file() and (tmp_path / "csv" / "recovery.csv").is_file()
    args = parser.parse_args(["export", str(run[0])])
    with pytest.raises(KingenError, match="nothing to export"):
        args.handler(args)
    args = parser.parse_args(["plot", str(run[0]), "-o", str(tmp_path / "f"), "--format",
                              "png"])
    assert args.handler(args) == 0 and (tmp_path / "f" / "convergence.png").is_file()
    assert fitted_scheme_text(run[0]).count("[parameters]") == 1


def test_exported_and_reported_bounds_are_the_runs_not_the_scheme_files(tmp_path: Path
                                                                        ) -> None:
    # A fit configuration may narrow a rate's bounds; the run file keeps the scheme file's
    # text, so the box the run searched must come from the run's own parameter table.
    from test_store import JONAS, small_protocols

    from kingen.fitting.params import apply_overrides, to_file_units
    from kingen.outputs.report import write_report

    scheme = Scheme.load(JONAS)
    name = scheme.param_names[0]
    value = to_file_units(scheme, scheme.values)[name]
    narrow = apply_overrides(scheme, {name: {"bounds": [value / 2, value * 2]}})
    assert narrow.lower[0] != scheme.lower[0]
    path = tmp_path / "run.h5"
    store = RunStore.create(path, config_text="", config={}, scheme=narrow,
                            protocols=small_protocols(("deactivation",)), recordings={},
                            targets={}, free_mask=narrow.free_mask, population_size=1,
                            environment={}, overwrite=False)
    with store:
        store.write_hall_of_fame(narrow.values[None, :], np.array([1.0]))
    exported = Scheme.loads(fitted_scheme_text(path), path="<exported>")
    np.testing.assert_allclose(exported.lower, narrow.lower, rtol=1e-14)
    np.testing.assert_allclose(exported.upper, narrow.upper, rtol=1e-14)
    md = write_report(path, tmp_path / "report")[-1].read_text(encoding="utf-8")
    row = next(line for line in md.splitlines() if line.startswith(f"| {name} "))
    assert f"| {value / 2:.4g} | {value * 2:.4g} |" in row


def test_outputs_replace_only_what_kingen_wrote(run: tuple[Path, dict[str, Any]], tmp_path,
                                                capsys) -> None:
    from kingen.cli import main

    path, _ = run
    mine = tmp_path / "mine"
    mine.mkdir()
    recording = mine / "deactivation.csv"  # the user's own, where the export goes
    recording.write_text("time_ms,current_pA\n0,-1\n0.1,-2\n")
    scheme = mine / "model.toml"
    scheme.write_text((Path(__file__).resolve().parents[1] / "models" / "jonas_1993.toml")
                      .read_text())
    before = {p: p.read_bytes() for p in (recording, scheme)}
    out = tmp_path / "out"
    assert main(["export", str(path), "--csv", str(out)]) == 0
    assert main(["export", str(path), "--csv", str(out)]) == 0  # again: its own outputs
    capsys.readouterr()
    for argv, target in ((["export", str(path), "--csv", str(mine)], recording),
                         (["export", str(path), "--model", str(scheme)], scheme),
                         (["simulate", str(scheme), "--protocol", "deactivation", "--csv",
                           str(recording)], recording)):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"kingen: error: {target}: ") and err.endswith(
            "exists and kingen did not write it: refusing to replace it (choose another "
            "name, or remove it yourself)")
    assert {p: p.read_bytes() for p in (recording, scheme)} == before


def test_an_output_that_cannot_be_written_is_one_line(run: tuple[Path, dict[str, Any]],
                                                      tmp_path, capsys) -> None:
    from kingen.cli import main

    path, _ = run
    assert main(["export", str(path), "--model", str(tmp_path)]) == 2  # a folder
    blocker = tmp_path / "figs"
    blocker.write_text("a file where the folder would go")
    assert main(["plot", str(path), "-o", str(blocker)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"kingen: error: {tmp_path}: cannot write: it is a folder"
    assert err[1].startswith(f"kingen: error: {blocker}") and "cannot write" in err[1]
    assert len(err) == 2


def test_a_run_whose_protocol_repeats_a_label_exports_readable_files(tmp_path: Path) -> None:
    """Runs made before kingen labelled repeated doses apart (a dose listed twice) keep
    it in the run file; the export gives the repeat a label of its own instead of writing
    a CSV that the reader refuses or failing inside pynwb."""
    from dataclasses import replace

    dose = small_protocols(("dose_response",))[0]
    sweeps = list(dose.sweeps[:3])
    sweeps[2] = replace(sweeps[2], label=sweeps[0].label)  # '0.001mM' twice
    protocol = replace(dose, sweeps=tuple(sweeps))
    path = tmp_path / "old.h5"
    made = make_run(path, protocols=[protocol])
    want = made["traces"]["dose_response"]
    assert want["labels"] == ["0.001mM", "0.003mM", "0.001mM"]
    labels = ["0.001mM", "0.003mM", "0.001mM_2"]
    rec = load_recording(export_csv(path, tmp_path / "csv")[0])
    assert rec.sweep_labels == labels
    assert any(c.startswith("relabelled: the run's protocol repeats sweep labels")
               and "sweep 2 '0.001mM' as '0.001mM_2'" in c for c in rec.meta["comments"])
    for a, b in zip(rec.currents_list(), want["fit_pA"], strict=True):
        np.testing.assert_array_equal(a, b)
    pytest.importorskip("pynwb")
    back = load_recording(export_nwb(path, tmp_path / "fit.nwb")[0])
    assert back.sweep_labels == labels
    np.testing.assert_allclose(back.currents_list()[2], want["fit_pA"][2], rtol=1e-12)


def test_distinct_labels_keep_the_first_and_take_no_other_sweeps_label() -> None:
    from kingen.experiment.protocol_file import distinct_labels

    assert distinct_labels(["5", "10"]) == ["5", "10"]
    assert distinct_labels(["a", "a", "a"]) == ["a", "a_2", "a_3"]
    assert distinct_labels(["1", "3", "1", "1_2"]) == ["1", "3", "1_3", "1_2"]
