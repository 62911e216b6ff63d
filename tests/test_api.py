"""The public API (``import kingen``): a notebook's session, the lazy namespace,
``python -m kingen``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

import kingen

ROOT = Path(__file__).resolve().parents[1]
JONAS = ROOT / "models" / "jonas_1993.toml"


def test_notebook_session(tmp_path: Path) -> None:
    """Load a scheme, simulate, fit the demo for two generations, open, plot, report."""
    scheme = kingen.Scheme.load(JONAS)
    assert scheme.n_states == 7

    protocol = kingen.standard_protocol("deactivation", dt=0.05)
    sim = kingen.simulate(scheme, protocol)
    assert sim.engine == "exact reference"
    assert np.all(np.isfinite(sim.currents[0])) and sim.currents[0].min() < 0
    rk4 = kingen.simulate(scheme, protocol, solver="rk4", backend="cpu")
    assert rk4.engine.startswith("rk4 on cpu")
    np.testing.assert_allclose(rk4.currents[0], sim.currents[0], rtol=0,
                               atol=1e-3 * abs(sim.currents[0]).max())
    by_name = kingen.simulate(JONAS, "deactivation")  # a file and a protocol name
    assert by_name.protocol.name == "deactivation" and by_name.currents[0].min() < 0
    assert sim.features()["peak_pA"] < 0
    csv = sim.to_csv(tmp_path / "deactivation.csv")
    back = kingen.load_recording(csv)
    np.testing.assert_allclose(back.current_pA[0], sim.currents[0], rtol=1e-8, atol=1e-9)

    run = tmp_path / "demo.h5"
    result = kingen.fit(kingen.demo_config(), progress=False,
                        overrides={"output": str(run), "generations": 2, "population": 8,
                                   "backend": "cpu"})
    assert isinstance(result, kingen.FitResult)
    assert result.generations == 2 and np.isfinite(result.fitness)
    assert Path(result.path) == run and run.is_file()

    with kingen.RunStore.open(run) as store:
        assert store.protocol_names == ["deactivation", "desensitization", "recovery",
                                        "dose_response"]
        assert store.n_generations == 3  # the initial population and two generations

    figures = kingen.plot_run(run, tmp_path / "figures", formats=("png",))
    assert {p.name for p in figures} >= {"convergence.png", "parameters.png",
                                         "fit_deactivation.png"}
    assert all(p.suffix == ".png" and p.stat().st_size > 0 for p in figures)

    html, md = kingen.write_report(run, tmp_path / "report")
    assert html.stat().st_size > 0 and md.stat().st_size > 0

    more = kingen.resume(run, generations=3, progress=False)
    assert more.generations == 3


def test_public_names_resolve() -> None:
    eager = {"KingenError", "__version__"}
    assert set(kingen.__all__) == set(kingen._LAZY) | eager
    assert len(kingen.__all__) == len(set(kingen.__all__))
    assert set(kingen.__all__) <= set(dir(kingen))
    for name in kingen.__all__:
        assert getattr(kingen, name) is not None, name
    # kingen.fit is the function (no module of that name shadows it)
    from kingen.runs.fit import fit

    assert kingen.fit is fit


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        kingen.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_import_is_light() -> None:
    code = ("import sys, kingen; heavy = [m for m in ('numba', 'h5py', 'matplotlib', "
            "'scipy', 'deap', 'pynwb') if m in sys.modules]; assert not heavy, heavy; "
            "kingen.Scheme; assert 'numba' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_python_dash_m_is_the_command() -> None:
    for args in (["--help"], ["info", "models/jonas_1993.toml"]):
        out = subprocess.run([sys.executable, "-m", "kingen", *args], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    assert "Jonas" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "kingen", "info", "no_such.toml"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("kingen: error: no_such.toml")


def test_the_api_page_example_uses_public_names() -> None:
    import re

    text = (ROOT / "docs" / "api" / "index.md").read_text(encoding="utf-8")
    section = text.split("# API", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    compile(block, "docs/api/index.md", "exec")
    used = set(re.findall(r"\bkingen\.(\w+)", block))
    named = set(re.findall(r"`(\w+)`", section.split("```", 2)[2]))
    assert used and used <= set(kingen.__all__), used - set(kingen.__all__)
    assert {"simulate_batch", "Objective", "load_recording"} <= named <= set(kingen.__all__) | {
        "help"}
