"""Small synthetic fit problems shared by the fit tests (CPU, seconds); no tests here."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kingen.experiment.protocol import Protocol, standard_protocol
from kingen.experiment.recordings import Recording, write_csv
from kingen.model.scheme import Scheme
from kingen.solve import simulate_exact

ROOT = Path(__file__).resolve().parents[1]
TRUTH_MODEL = ROOT / "data" / "jonas_1993_reversible.toml"
NOISE_SEED = 4242

# A small scheme with one open state and one desensitized state, for tests that need one
FOUR_STATE = """
[model]
name = "four-state test scheme"
channels = 100
[states]
C0 = { conductance = 0 }
C1 = { conductance = 0 }
O = { conductance = 10 }
D = { conductance = 0 }
[parameters]
kon = { value = 5.0, unit = "mM^-1 ms^-1", bounds = [0.5, 50] }
koff = { value = 2.0, unit = "ms^-1", bounds = [0.2, 20] }
beta = { value = 4.0, unit = "ms^-1", bounds = [0.4, 40] }
alpha = { value = 1.0, unit = "ms^-1", bounds = [0.1, 10] }
d = { value = 0.2, unit = "ms^-1", bounds = [0.02, 2] }
r = { value = 0.01, unit = "ms^-1", bounds = [0.001, 0.1] }
[transitions]
"C0 -> C1" = "kon * glu"
"C1 -> C0" = "koff"
"C1 -> O" = "beta"
"O -> C1" = "alpha"
"O -> D" = "d"
"D -> O" = "r"
"""


def synthetic_recording(scheme: Scheme, protocol: Protocol, noise_fraction: float,
                        rng: np.random.Generator, peak: float | None = None
                        ) -> tuple[Recording, list[np.ndarray]]:
    """A noisy recording of the scheme under a protocol, and its noise-free currents."""
    trace = simulate_exact(scheme, protocol)
    clean = [s.current for s in trace.sweeps]
    peak = peak if peak is not None else max(float(np.max(np.abs(c))) for c in clean)
    noisy = [c + rng.normal(0.0, noise_fraction * peak, c.size) for c in clean]
    rec = Recording(protocol.name, [s.times() for s in protocol.sweeps], noisy,
                    [s.label for s in protocol.sweeps], holding_mV=-60.0,
                    meta={"synthetic": True})
    return rec, clean


def standard_errors(objective, pmap, genes: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Standard errors of the genes (log10 rates) at ``genes``, from the Jacobian of the
    objective's residuals there: cov = s² (JᵀJ)⁻¹, s² = SSE / (n - p)."""
    r0 = objective.residuals(pmap.to_params(genes[None, :]))[0]
    jac = ((objective.residuals(pmap.to_params(genes[None, :] + h * np.eye(genes.size)))
            - r0[None, :]) / h).T
    s2 = float(r0 @ r0) / (r0.size - genes.size)
    return np.sqrt(np.diag(s2 * np.linalg.inv(jac.T @ jac)))


def write_problem(tmp: Path, *, protocols: tuple[str, ...] = ("deactivation",),
                  free: list[str] | None = None, ga: str = "", extra: str = "",
                  noise: float = 0.02, dt: float = 0.05, exchange: float = 0.2) -> Path:
    """A configuration fitting standard protocols of the Jonas scheme to synthetic data."""
    scheme = Scheme.load(TRUTH_MODEL)
    rng = np.random.default_rng(NOISE_SEED)
    (tmp / "model.toml").write_text(TRUTH_MODEL.read_text(encoding="utf-8"), encoding="utf-8")
    blocks = []
    for name in protocols:
        p = standard_protocol(name, exchange=exchange, dt=dt)
        rec, _ = synthetic_recording(scheme, p, noise, rng)
        write_csv(rec, tmp / f"{name}.csv")
        blocks.append(f'[[protocols]]\nprotocol = "{name}"\nexchange = {exchange}\n'
                      f'recording = "{name}.csv"\n')
    free = free if free is not None else ["k2o", "ko2"]
    text = ('model = "model.toml"\noutput = "run.h5"\nseed = 3\nbackend = "cpu"\n'
            + ("" if "polish =" in extra else "polish = false\n") + f"{extra}\n"
            + "\n".join(blocks)
            + f"\n[parameters]\nfree = {free!r}\n".replace("'", '"')
            + "k2o = { bounds = [1, 20] }\nko2 = { bounds = [0.2, 4] }\n"
            + "\n[ga]\npopulation = 8\n"
            + ("" if "generations" in ga else "generations = 3\n") + f"{ga}\n")
    cfg = tmp / "fit.toml"
    cfg.write_text(text, encoding="utf-8")
    return cfg


def recovery_problem(tmp: Path, *, dt: float, free: list[str], population: int,
                     generations: int, bounds_factor: float = 4.0, seed: int = 1,
                     polish_evaluations: int = 30) -> tuple[Path, dict[str, list]]:
    """Synthetic recordings of the four kinds of protocol (2 % noise) and a configuration
    fitting ``free`` inside ``truth / bounds_factor .. truth * bounds_factor``.

    Returns the configuration and the noise-free currents per protocol.
    """
    from dataclasses import replace

    from kingen.experiment.protocol import load_protocol

    scheme = Scheme.load(TRUTH_MODEL)
    rng = np.random.default_rng(NOISE_SEED)
    (tmp / "model.toml").write_text(TRUTH_MODEL.read_text(encoding="utf-8"), encoding="utf-8")
    protocols = [standard_protocol("deactivation", exchange=0.2, dt=dt),
                 standard_protocol("desensitization", exchange=0.2, dt=dt)]
    for name in ("recovery", "dose_response"):
        p = load_protocol(ROOT / "data" / f"{name}.toml")
        protocols.append(replace(p, sweeps=tuple(replace(s, dt=dt) for s in p.sweeps)))
        (tmp / f"{name}.toml").write_text(
            (ROOT / "data" / f"{name}.toml").read_text().replace("dt = 0.05", f"dt = {dt}"))
    peak = float(np.max(np.abs(simulate_exact(scheme, protocols[1]).sweeps[0].current)))
    blocks, clean = [], {}
    for p in protocols:
        rec, clean[p.name] = synthetic_recording(scheme, p, 0.02, rng, peak=peak)
        write_csv(rec, tmp / f"{p.name}.csv")
        spec = (f'protocol = "{p.name}"\nexchange = 0.2\ndt = {dt}' if p.kind in (
            "deactivation", "desensitization") else f'protocol = "{p.name}.toml"')
        blocks.append(f'[[protocols]]\n{spec}\nrecording = "{p.name}.csv"\n')
    values = dict(zip(scheme.param_names, scheme.values, strict=True))
    lines = [f"{n} = {{ bounds = [{values[n] / bounds_factor:.6g}, "
             f"{values[n] * bounds_factor:.6g}] }}" for n in free]
    text = ('model = "model.toml"\noutput = "run.h5"\nbackend = "cpu"\n'
            f"seed = {seed}\npolish = true\npolish_evaluations = {polish_evaluations}\n\n"
            + "\n".join(blocks) + "\n[parameters]\nfree = ["
            + ", ".join(f'"{n}"' for n in free) + "]\n" + "\n".join(lines)
            + f"\n\n[ga]\npopulation = {population}\ngenerations = {generations}\n")
    cfg = tmp / "fit.toml"
    cfg.write_text(text, encoding="utf-8")
    return cfg, {"clean": clean, "peak": peak, "protocols": protocols, "truth": values}


def whole_and_half_run(tmp: Path, ga: str, half: int) -> tuple[object, Path]:
    """A fit run to its end in ``tmp/whole``, and the same fit stopped after ``half``
    generations in ``tmp/part``: the uninterrupted result and the stopped run's folder."""
    from kingen.runs.fit import fit

    whole, part = tmp / "whole", tmp / "part"
    whole.mkdir()
    part.mkdir()
    full = fit(write_problem(whole, ga=ga), progress=False)
    fit(write_problem(part, ga=ga), progress=False, overrides={"generations": half})
    return full, part
