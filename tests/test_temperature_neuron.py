"""A scheme with Q10s and an activation energy, exported to .mod, compiled with nrnivmodl
(NEURON 9) and run with CVODE at 22 and 35 °C, equals ``kingen simulate --temperature``
within 1e-4 of the peak; the temperature goes through NEURON's ``celsius``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kingen.experiment.protocol import standard_protocol
from kingen.model.scheme import Scheme
from kingen.outputs.interop import export_text
from kingen.runs.simulate import simulate

pytest.importorskip("neuron")

FOUR_STATE = """
[model]
name = "four-state with temperature"
channels = 50
[states]
C0 = { conductance = 0 }
C1 = { conductance = 0 }
O = { conductance = 10 }
D = { conductance = 0 }
[parameters]
kon = { value = 5.0, unit = "mM^-1 ms^-1" }
koff = 2.0
beta = 4.0
alpha = 1.0
d = 0.2
r = 0.01
[transitions]
"C0 -> C1" = "kon * glu"
"C1 -> C0" = "koff"
"C1 -> O" = "beta"
"O -> C1" = "alpha"
"O -> D" = "d"
"D -> O" = "r"
[temperature]
reference_c = 22
[temperature.binding]
rates = ["kon", "koff"]
q10 = 2.4
[temperature.gating]
rates = ["beta", "alpha"]
q10 = 3.0
[temperature.d]
ea_kj_mol = 60
"""


def test_neuron_at_22_and_35_degrees_equals_kingen_simulate(tmp_path: Path) -> None:
    if shutil.which("nrnivmodl") is None or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("nrnivmodl or a C compiler is missing")
    scheme = Scheme.loads(FOUR_STATE, path="warm.toml")
    (tmp_path / "warm.mod").write_text(export_text(scheme, "neuron"))
    protocol = standard_protocol("desensitization", dt=0.1)
    runs, refs = [], []
    for celsius in (22.0, 35.0):
        sim = simulate(scheme, protocol, temperature=celsius)
        for sweep, current in zip(protocol.sweeps, sim.currents, strict=True):
            tvec, cvec = [0.0], [0.0]
            for seg in sweep.segments():
                tvec += [seg.start, seg.end]
                cvec += [seg.concentration] * 2
            runs.append({"mech": "kingen_warm", "agonist": "glu", "tvec": tvec, "cvec": cvec,
                         "times": sweep.times().tolist(), "celsius": celsius})
            # the conductance (pS) behind the simulated current
            refs.append(current / ((sweep.holding - sweep.reversal) * 1e-3))
    env = {**os.environ, "MAKEFLAGS": "CXXFLAGS=-O0\\ -std=c++17"}
    build = subprocess.run(["nrnivmodl", "."], cwd=tmp_path, capture_output=True, text=True,
                           env=env)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    lib = next(tmp_path.glob("*/libnrnmech.so"), None) or next(
        tmp_path.glob("*/.libs/libnrnmech.so"))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"lib": str(lib), "atol": 1e-8, "rtol": 1e-8, "runs": runs}))
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "neuron_sim.py"),
                           str(spec), str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(out.read_text())["g"]
    peaks = []
    for ref, g in zip(refs, got, strict=True):
        g = np.asarray(g)
        peak = np.max(np.abs(ref))
        assert np.max(np.abs(g - ref)) <= 1e-4 * peak
        peaks.append(peak)
    # the warm sweeps differ from the cold ones: the temperature reached NEURON
    half = len(peaks) // 2
    assert not np.allclose(peaks[:half], peaks[half:], rtol=1e-2)
