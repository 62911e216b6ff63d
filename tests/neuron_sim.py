"""Run exported kingen mechanisms in NEURON; used by tests/test_interop_neuron.py.

Run as ``python tests/neuron_sim.py SPEC.json OUT.json`` in its own process: NEURON loads a
compiled mechanism library once per process, so the tests keep it out of pytest's.

SPEC: ``{"lib": libnrnmech.so, "atol": float, "runs": [{"mech", "agonist", "tvec",
"cvec", "times", "celsius" (optional)}]}``; OUT: ``{"g": [[conductance (pS) at each time]
per run]}``. The concentration is played with ``Vector.play(..., 1)`` (linear between the
points; a step is two points at the same time) and NEURON's CVODE integrates the scheme.
"""

from __future__ import annotations

import json
import sys


def main(spec_path: str, out_path: str) -> int:
    from neuron import h

    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    h.nrn_load_dll(spec["lib"])
    h.load_file("stdrun.hoc")
    soma = h.Section(name="soma")
    cvode = h.CVode()
    cvode.active(1)
    cvode.atol(spec["atol"])
    cvode.rtol(spec.get("rtol", spec["atol"]))
    out = []
    for run in spec["runs"]:
        syn = getattr(h, run["mech"])(soma(0.5))
        syn.erev = -65.0  # at rest potential: no current, the conductance is what is compared
        tvec = h.Vector(run["tvec"])
        cvec = h.Vector(run["cvec"])
        cvec.play(syn._ref_glu if run["agonist"] == "glu" else
                  getattr(syn, f"_ref_{run['agonist']}"), tvec, 1)
        times = h.Vector(run["times"])
        g = h.Vector()
        g.record(syn._ref_g, times)
        if "celsius" in run:
            h.celsius = run["celsius"]
        h.finitialize(-65.0)
        h.continuerun(run["times"][-1] + 1.0)  # the recording stops before tstop
        out.append(list(g))
        cvec.play_remove()
        del syn
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump({"g": out}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
