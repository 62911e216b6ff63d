"""Property: a mutated scheme, protocol, fit configuration or recording is either accepted
correctly or refused with a one-line KingenError (the CLI: one line, exit 2), never a
traceback. Bounded to run in seconds (issue #12)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kingen.cli import main
from kingen.errors import KingenError
from kingen.experiment.protocol_file import protocol_from_dict
from kingen.experiment.recordings import read_csv
from kingen.fitting.config import loads_config
from kingen.model import limits
from kingen.model.fields import loads_toml
from kingen.model.scheme import RATE_RANGE, Scheme

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
SCHEME_TEXT = (ROOT / "models" / "jonas_1993.toml").read_text()
PROTOCOL_TEXTS = [(DATA / "recovery.toml").read_text(), (DATA / "dose_response.toml").read_text(),
                  "[train]\nstart = 2\nduration = 1\nconcentration = 10\nn = 5\nfrequency = 50\n"
                  "[protocol]\ndt = 0.1\n[[sweeps]]\nduration = 20\ntransients = "
                  "[{ start = 1, peak = 1, tau_decay = 2, tau_rise = 0.1 }]\n"]
CONFIG_TEXT = """
model = "jonas_1993_reversible.toml"
seed = 1
courant = 2.5
[[protocols]]
protocol = "deactivation"
exchange = 0.2
dt = 0.05
recording = "deactivation.csv"
weight = 1.0
mask = [[0, 1]]
[parameters]
k01 = { bounds = [1, 100], value = 10 }
tied = { k10 = { to = "k21", factor = 2 } }
[ga]
population = 8
offspring = 8
generations = 2
sigma = 0.25
tournament = 3
[stop]
patience = 3
wall_time = 10.0
"""
CSV_TEXT = "\n".join((DATA / "deactivation.csv").read_text().splitlines()[:60]) + "\n"

# What a careless or hostile user types where a value belongs.
HOSTILE = ["0", "-1", "0.5", "1e308", "-1e308", "1e-320", "nan", "inf", "-inf", '"x"', '""',
           "true", "[]", "[1, 2]", "{}", "{ a = 1 }", "1" + "0" * 400, "1e12", "1e-9",
           "[" * 40 + "]" * 40, "9223372036854775808", '"furlongs"', "5"]
CSV_HOSTILE = ["", "nan", "inf", "1e308", "-1e308", "x", "1e-320", '"' + "1" * 140_000 + '"',
               "0", "1,2", "# c", "time_ms", "current_A"]
# KINGEN_FUZZ_EXAMPLES=2000 KINGEN_FUZZ_RANDOM=1 searches longer and afresh each run.
FUZZ = settings(max_examples=int(os.environ.get("KINGEN_FUZZ_EXAMPLES", "120")), deadline=None,
                derandomize=not os.environ.get("KINGEN_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def mutated(draw, texts: list[str], values: list[str], sep: str = " = ") -> str:
    """A valid text with one to three edits: a value replaced, a line dropped, doubled or
    cut, or a character changed."""
    text = draw(st.sampled_from(texts))
    for _ in range(draw(st.integers(1, 3))):
        lines = text.splitlines()
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["value", "value", "value", "drop", "double", "cut",
                                     "char"]))
        line = lines[i]
        if kind == "value" and sep in line:
            key = line.split(sep, 1)[0]
            lines[i] = f"{key}{sep}{draw(st.sampled_from(values))}"
        elif kind == "value" and sep == ",":
            cells = line.split(",")
            cells[draw(st.integers(0, len(cells) - 1))] = draw(st.sampled_from(values))
            lines[i] = ",".join(cells)
        elif kind == "drop":
            del lines[i]
        elif kind == "double":
            lines.insert(i, line)
        elif kind == "cut":
            lines[i] = line[: draw(st.integers(0, len(line)))]
        elif line:
            j = draw(st.integers(0, len(line) - 1))
            lines[i] = line[:j] + draw(st.sampled_from("=[]{}\"',.-e0x#")) + line[j + 1:]
        text = "\n".join(lines) + "\n"
    return text


def _one_line(exc: KingenError) -> None:
    text = str(exc)
    assert text and "\n" not in text


@FUZZ
@given(mutated([SCHEME_TEXT], HOSTILE))
def test_mutated_scheme(text: str) -> None:
    try:
        scheme = Scheme.loads(text, "s.toml")
    except KingenError as exc:
        _one_line(exc)
        return
    lo, hi = RATE_RANGE
    for p in scheme.parameters:
        assert lo <= p.lower <= p.upper <= hi
    assert np.all(np.isfinite(scheme.values)) and np.all(np.isfinite(scheme.conductance))
    assert scheme.n_states <= limits.MAX_STATES


@FUZZ
@given(mutated(PROTOCOL_TEXTS, HOSTILE))
def test_mutated_protocol(text: str) -> None:
    try:
        protocol = protocol_from_dict(loads_toml(text, "p.toml"), source="p.toml")
    except KingenError as exc:
        _one_line(exc)
        return
    for s in protocol.sweeps:
        assert math.isfinite(s.duration) and s.dt > 0
        assert s.duration / s.dt < limits.MAX_SAMPLES_PER_SWEEP
        assert abs(s.holding) <= 1e4 and abs(s.reversal) <= 1e4
        for p in s.pulses:
            assert all(math.isfinite(x) for x in (p.start, p.duration, p.concentration))


@FUZZ
@given(mutated([CONFIG_TEXT], HOSTILE))
def test_mutated_fit_config(text: str) -> None:
    try:
        cfg = loads_config(text, path="fit.toml", base=DATA)
    except KingenError as exc:
        _one_line(exc)
        return
    assert cfg.ga.population >= 2 and 0 < cfg.ga.sigma <= 1
    assert 0 < cfg.courant < 2.785
    assert all(math.isfinite(p.weight) for p in cfg.protocols)


@FUZZ
@given(mutated([CSV_TEXT], CSV_HOSTILE, sep=","))
def test_mutated_recording_csv(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.mktemp("csv") / "r.csv"
    path.write_text(text)
    try:
        rec = read_csv(path)
    except KingenError as exc:
        _one_line(exc)
        return
    for _, t, y, _ in rec.sweeps():
        assert np.all(np.isfinite(t)) and np.all(np.isfinite(y)) and np.all(np.diff(t) > 0)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(text=mutated([SCHEME_TEXT], HOSTILE))
def test_mutated_scheme_through_the_cli(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.mktemp("cli") / "s.toml"
    path.write_text(text)
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(["info", str(path)])
    assert status in (0, 2)
    if status == 2:
        assert err.getvalue().count("\n") == 1 and err.getvalue().startswith("kingen: error: ")
