"""Every shipped scheme, exported to .mod, compiled with nrnivmodl (NEURON 9) and run in
NEURON with the desensitization and recovery protocols, matches kingen's exact reference
within 1e-4 of the peak.

The concentration is played with ``Vector.play`` (steps as two points at one time) and
NEURON's CVODE integrates at atol = rtol = 1e-8; the conductance g is compared (the
current is g times a driving force). All six files are compiled in one nrnivmodl call, once
per session, and NEURON runs in its own process (tests/neuron_sim.py): a compiled
mechanism library is loaded once per process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kingen.experiment.protocol import standard_protocol
from kingen.model.scheme import Scheme
from kingen.outputs.interop import export_text
from kingen.solve.reference import simulate_exact

pytest.importorskip("neuron")

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "models").glob("*.toml"))
PROTOCOLS = ("desensitization", "recovery")


def _compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("c++") or \
        shutil.which("g++")


@pytest.fixture(scope="session")
def neuron_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Compile every shipped scheme's .mod once; run every protocol sweep in NEURON."""
    if _compiler() is None:
        pytest.skip("no C/C++ compiler on this machine: nrnivmodl cannot compile the .mod "
                    "files (install gcc/g++; .ci/run does)")
    if shutil.which("nrnivmodl") is None:
        pytest.skip("nrnivmodl is not on PATH (NEURON's pip package installs it)")
    work = tmp_path_factory.mktemp("nrn")
    runs, refs = [], []
    schemes = [(path.stem, Scheme.load(path)) for path in SHIPPED]
    # initial occupancies given by the file: written as such, not as the rest equilibrium
    initial = (ROOT / "models/jonas_1993.toml").read_text().replace(
        "C0 = { conductance = 0 }", "C0 = { conductance = 0, initial = 0.6 }").replace(
        "C3 = { conductance = 0,", "C3 = { conductance = 0, initial = 0.4,")
    schemes.append(("jonas_initial", Scheme.loads(initial, "jonas_initial.toml")))
    for stem, scheme in schemes:
        (work / f"{stem}.mod").write_text(export_text(scheme, "neuron"))
        for name in PROTOCOLS:
            protocol = standard_protocol(name, dt=0.1)
            for sweep, ref in zip(protocol.sweeps, simulate_exact(scheme, protocol).sweeps,
                                  strict=True):
                tvec, cvec = [0.0], [0.0]
                for seg in sweep.segments():
                    tvec += [seg.start, seg.end]
                    cvec += [seg.concentration] * 2
                runs.append({"mech": f"kingen_{stem}", "agonist": scheme.agonist,
                             "tvec": tvec, "cvec": cvec, "times": ref.time.tolist()})
                refs.append((stem, name, sweep.label,
                             scheme.channels * (ref.occupancy @ scheme.conductance)))
    start = time.perf_counter()
    # -O0: what is tested is the numbers, not the mechanisms' speed; it takes the compile
    # from ~21 s to ~10 s of CPU (GNU make reads variable overrides from MAKEFLAGS)
    env = {**os.environ, "MAKEFLAGS": "CXXFLAGS=-O0\\ -std=c++17"}
    build = subprocess.run(["nrnivmodl", "."], cwd=work, capture_output=True, text=True,
                           env=env)
    compile_s = time.perf_counter() - start
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    lib = next(work.glob("*/libnrnmech.so"), None) or next(work.glob("*/.libs/libnrnmech.so"))
    spec = work / "spec.json"
    spec.write_text(json.dumps({"lib": str(lib), "atol": 1e-8, "rtol": 1e-8, "runs": runs}))
    out = work / "out.json"
    sim = subprocess.run([sys.executable, str(Path(__file__).parent / "neuron_sim.py"),
                          str(spec), str(out)], capture_output=True, text=True, timeout=300)
    assert sim.returncode == 0, sim.stderr[-3000:]
    got = json.loads(out.read_text())["g"]
    results: dict = {}
    for (stem, name, label, ref), g in zip(refs, got, strict=True):
        results.setdefault((stem, name), []).append((label, ref, np.asarray(g)))
    print(f"nrnivmodl of {len(schemes)} files: {compile_s:.1f} s")
    return results


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("stem", [p.stem for p in SHIPPED] + ["jonas_initial"])
def test_neuron_matches_exact_reference(neuron_runs: dict, stem: str, protocol: str) -> None:
    sweeps = neuron_runs[(stem, protocol)]
    assert sweeps
    for label, ref, got in sweeps:
        assert got.shape == ref.shape
        peak = np.max(np.abs(ref))
        assert np.max(np.abs(got - ref)) <= 1e-4 * peak, label


def test_modlunit_accepts_every_export(tmp_path: Path) -> None:
    if shutil.which("modlunit") is None:
        pytest.skip("modlunit is not on PATH")
    for path in SHIPPED:
        mod = tmp_path / f"{path.stem}.mod"
        mod.write_text(export_text(Scheme.load(path), "neuron"))
        done = subprocess.run(["modlunit", mod.name], cwd=tmp_path, capture_output=True,
                              text=True)
        assert done.returncode == 0 and "error" not in (done.stdout + done.stderr).lower(), \
            done.stdout + done.stderr
