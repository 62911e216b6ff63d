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

FOUR_STATE = (Path(__file__).parent / "data" / "warm_four_state.toml").read_text()
# a cycle closed by a derived rate whose temperature factor is
# tadj_binding * tadj_fast^2 / tadj_slow^2
CYCLE = """
[model]
name = "cycle with temperature"
channels = 20
[states]
R = { conductance = 0 }
AR = { conductance = 10 }
D = { conductance = 0 }
AD = { conductance = 0 }
[parameters]
kon = { value = 5.0, unit = "mM^-1 ms^-1" }
koff = 1.0
kon2 = { value = 2.0, unit = "mM^-1 ms^-1" }
koff2 = { value = 1.0, bounds = [1e-4, 1e4] }
kd1 = 0.5
kr1 = 0.02
kd0 = 0.01
kr0 = 0.05
[transitions]
"R -> AR" = "kon * glu"
"AR -> R" = "koff"
"AR -> AD" = "kd1"
"AD -> AR" = "kr1"
"R -> D" = "kd0"
"D -> R" = "kr0"
"D -> AD" = "kon2 * glu"
"AD -> D" = { rate = "koff2", derived = true }
[temperature]
reference_c = 22
[temperature.binding]
rates = ["kon", "kon2", "koff"]
q10 = 2.0
[temperature.fast]
rates = ["kd0", "kr1"]
q10 = 3.0
[temperature.slow]
rates = ["kd1", "kr0"]
q10 = 1.5
"""


def test_neuron_at_22_and_35_degrees_equals_kingen_simulate(tmp_path: Path) -> None:
    if shutil.which("nrnivmodl") is None or not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("nrnivmodl or a C compiler is missing")
    schemes = {"warm": Scheme.loads(FOUR_STATE, path="warm.toml"),
               "cycle": Scheme.loads(CYCLE, path="cycle.toml")}
    assert "koff2 * tadj_binding * tadj_slow^(-2) * tadj_fast^(2)" in export_text(
        schemes["cycle"], "neuron")
    protocol = standard_protocol("desensitization", dt=0.1)
    runs, refs = [], []
    for stem, scheme in schemes.items():
        (tmp_path / f"{stem}.mod").write_text(export_text(scheme, "neuron"))
        for celsius in (22.0, 35.0):
            sim = simulate(scheme, protocol, temperature=celsius)
            for sweep, current in zip(protocol.sweeps, sim.currents, strict=True):
                tvec, cvec = [0.0], [0.0]
                for seg in sweep.segments():
                    tvec += [seg.start, seg.end]
                    cvec += [seg.concentration] * 2
                runs.append({"mech": f"kingen_{stem}", "agonist": "glu", "tvec": tvec,
                             "cvec": cvec, "times": sweep.times().tolist(),
                             "celsius": celsius})
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
    n = protocol.n_sweeps
    for k in range(0, len(peaks), 2 * n):
        assert not np.allclose(peaks[k:k + n], peaks[k + n:k + 2 * n], rtol=1e-2)
