"""Parameter recovery from SYNTHETIC Jonas et al. (1993) recordings with 2 % noise.

Reduced size for CI (six free rates, a small population, polish on): binding (k12),
unbinding (k21), opening (k2o), closing (ko2) and entry into desensitization (k13, k24).
The full-size run (ten free rates) is recorded in benchmarks/results/fit_recovery.json.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_fit_helpers import recovery_problem

from kingen.fit import fit
from kingen.scheme import Scheme
from kingen.solve import simulate_exact

FREE = ["k12", "k21", "k2o", "ko2", "k13", "k24"]


@pytest.mark.slow
def test_fit_recovers_rates_and_reproduces_the_noise_free_currents(tmp_path):
    cfg, truth = recovery_problem(tmp_path, dt=0.02, free=FREE, population=16,
                                  generations=8)
    result = fit(cfg, progress=False)
    scheme = Scheme.load(tmp_path / "model.toml")
    for p in truth["protocols"]:
        amp = result.amplitudes[p.name]
        fitted = simulate_exact(scheme, p, params=result.params, channels=amp).currents
        err = np.concatenate([f - c for f, c in zip(fitted, truth["clean"][p.name],
                                                     strict=True)])
        rmse = float(np.sqrt(np.mean(err ** 2)))
        assert rmse <= 0.02 * truth["peak"], (p.name, rmse / truth["peak"])
    for name in FREE:
        i = scheme.param_names.index(name)
        ratio = result.params[i] / truth["truth"][name]
        assert 0.8 <= ratio <= 1.2, (name, ratio)
