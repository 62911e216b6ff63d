"""The README is the front door: short, its quickstart exactly what CI runs, its example
configuration one that loads, and its links lead to pages that exist. The formats' examples
live on the docs' reference pages, and load and run from there: documentation that cannot
drift from the code."""

import re
import shutil
from pathlib import Path

import pytest

from kingen.experiment.protocol import load_protocol
from kingen.model.scheme import Scheme
from kingen.solve import simulate_exact

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference"
QUICKSTART = (
    "pip install '.[cuda]' && kingen fit --demo       # demo fit on bundled synthetic data "
    "(GPU if present)",
    "pip install '.[test]' && python -m pytest        # the test suite (what CI runs)",
)


def _toml_blocks(path: Path) -> list[str]:
    return re.findall(r"```toml\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def test_the_readme_is_a_front_door_of_at_most_250_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_the_quickstart_is_the_two_commands_and_ci_runs_the_test_command():
    text = README.read_text(encoding="utf-8")
    fence = text.split("## Quickstart", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    assert tuple(fence.splitlines()) == QUICKSTART
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^pip install '\.\[test[,\w]*\]' && python -m pytest$", ci, re.M), ci


def test_the_readme_links_lead_to_pages_and_files_that_exist():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert len(targets) >= 8
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing


def test_the_readme_fit_configuration_loads(tmp_path):
    from kingen.fitting.config import load_config

    block = next(b for b in _toml_blocks(README) if "[[protocols]]" in b)
    (tmp_path / "fit.toml").write_text(block, encoding="utf-8")
    recordings = re.findall(r'recording = "([^"]+)"', block)
    for name in recordings:  # the bundled desensitization recording stands in for the cell's
        shutil.copy(ROOT / "data" / "desensitization.csv", tmp_path / name)
    config = load_config(tmp_path / "fit.toml")
    assert recordings and [p.protocol.name for p in config.protocols] == ["desensitization"]
    assert config.scheme.name.startswith("Jonas")


def test_the_scheme_page_example_loads_and_simulates():
    text = next(b for b in _toml_blocks(REFERENCE / "scheme.md") if "[transitions]" in b)
    scheme = Scheme.loads(text, "docs example")
    assert scheme.n_states == 5 and len(scheme.cycles) == 1
    assert scheme.cycles[0].derived is not None
    assert scheme.values[scheme.param_names.index("kon")] == pytest.approx(10.0)  # mM-1 ms-1
    from kingen.experiment.protocol import standard_protocol

    current = simulate_exact(scheme, standard_protocol("deactivation")).sweeps[0].current
    assert current.min() < -1.0  # an inward current at -60 mV


def test_the_protocol_page_examples_load(tmp_path):
    blocks = [b for b in _toml_blocks(REFERENCE / "protocol.md")
              if "[paired]" in b or "[[sweeps]]" in b]
    assert len(blocks) == 2
    paired = tmp_path / "paired.toml"
    paired.write_text(blocks[0])
    p = load_protocol(paired)
    assert p.kind == "recovery" and p.n_sweeps == 5
    sweeps = tmp_path / "sweeps.toml"
    sweeps.write_text(blocks[1])
    s = load_protocol(sweeps)
    assert s.sweeps[0].pulses[0].rise == 0.1 and len(s.sweeps[0].transients) == 1
