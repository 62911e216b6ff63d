"""The examples in the README load and run: documentation that cannot drift from the code."""

import re
from pathlib import Path

import pytest

from kingen.experiment.protocol import load_protocol
from kingen.model.scheme import Scheme
from kingen.solve import simulate_exact

README = Path(__file__).resolve().parents[1] / "README.md"


def _toml_blocks() -> list[str]:
    return re.findall(r"```toml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_scheme_example_loads_and_simulates():
    text = next(b for b in _toml_blocks() if "[transitions]" in b)
    scheme = Scheme.loads(text, "README example")
    assert scheme.n_states == 5 and len(scheme.cycles) == 1
    assert scheme.cycles[0].derived is not None
    assert scheme.values[scheme.param_names.index("kon")] == pytest.approx(10.0)  # mM-1 ms-1
    from kingen.experiment.protocol import standard_protocol

    current = simulate_exact(scheme, standard_protocol("deactivation")).sweeps[0].current
    assert current.min() < -1.0  # an inward current at -60 mV


def test_readme_protocol_examples_load(tmp_path):
    blocks = [b for b in _toml_blocks() if "[paired]" in b or "[[sweeps]]" in b]
    assert len(blocks) == 2
    paired = tmp_path / "paired.toml"
    paired.write_text(blocks[0])
    p = load_protocol(paired)
    assert p.kind == "recovery" and p.n_sweeps == 5
    sweeps = tmp_path / "sweeps.toml"
    sweeps.write_text(blocks[1])
    s = load_protocol(sweeps)
    assert s.sweeps[0].pulses[0].rise == 0.1 and len(s.sweeps[0].transients) == 1
