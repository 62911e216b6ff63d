"""Every shipped scheme, exported to .mmt, loaded by Myokit and simulated with
myokit.lib.markov.AnalyticalSimulation, matches kingen's exact reference within 1e-6 of
the peak under the desensitization and recovery protocols (real Myokit, no mock)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kingen.experiment.protocol import standard_protocol
from kingen.model.scheme import Scheme
from kingen.outputs.interop import export_text
from kingen.solve.reference import simulate_exact

myokit = pytest.importorskip("myokit")
markov = pytest.importorskip("myokit.lib.markov")

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "models").glob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_myokit_matches_exact_reference(path: Path) -> None:
    scheme = Scheme.load(path)
    model = myokit.parse_model(export_text(scheme, "myokit"))
    model.check_units(myokit.UNIT_STRICT)  # the units declared are consistent
    comp = f"kingen_{path.stem}"
    linear = markov.LinearModel.from_component(model.get(comp), vm=f"{comp}.glu",
                                               current=f"{comp}.i")
    for name in ("desensitization", "recovery"):
        protocol = standard_protocol(name, dt=0.1)
        exact = simulate_exact(scheme, protocol)
        for sweep, ref in zip(protocol.sweeps, exact.sweeps, strict=True):
            pacing = myokit.Protocol()
            for seg in sweep.segments():
                if seg.concentration:
                    pacing.schedule(seg.concentration, seg.start, seg.end - seg.start)
            sim = markov.AnalyticalSimulation(linear, pacing)
            log = sim.run(sweep.duration + sweep.dt, log_times=ref.time)
            got = np.asarray(log[f"{comp}.i"])
            peak = np.max(np.abs(ref.current))
            assert np.max(np.abs(got - ref.current)) <= 1e-6 * peak, (name, sweep.label)
