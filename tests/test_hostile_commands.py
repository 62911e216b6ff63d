"""Hostile command lines and protocols: each ends in one exact line with exit status 2,
nothing written and every input byte-identical, or runs in seconds; never a traceback, a
hang or an allocation of gigabytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kingen.cli import main

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "kingen" / "bundled"


def digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip().removeprefix("kingen: error: ")


# ------------------------------------------------------------------ --cluster

BIG = "9" * 5000  # past Python's limit of 4,300 digits for int() of text


@pytest.mark.parametrize("value, message", [
    (f"tcp://127.0.0.1:{BIG}", "the port must be a number from 1 to 65535"),
    ("tcp://127.0.0.1:\u00b2", "the port must be a number from 1 to 65535"),
    (f"local:{BIG}", "local:N needs 1 <= N <= 4096 worker processes"),
], ids=["port", "superscript", "local"])
def test_cluster_numbers_of_thousands_of_digits(tmp_path: Path, capsys, value: str,
                                                message: str) -> None:
    # int() of 5,000 digits raised Python's "Exceeds the limit (4300 digits)" ValueError
    before = digests(BUNDLED)
    out = tmp_path / "run.h5"
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    assert cli_error(["fit", "--demo", "-q", "--cluster", value, "-o", str(out)], capsys) == (
        f"--cluster = {shown}: {message}")
    assert not out.exists() and digests(BUNDLED) == before


@pytest.mark.parametrize("line, field", [
    (f'address = "tcp://h:{BIG}"', "cluster.address"),
    (f'kind = "slurm"\nwalltime = "{BIG}-01:00:00"', "cluster.walltime"),
], ids=["address", "walltime"])
def test_cluster_table_numbers_of_thousands_of_digits(tmp_path: Path, capsys, line: str,
                                                      field: str) -> None:
    table = tmp_path / "cluster.toml"
    table.write_text(f"[cluster]\n{line}\n")
    before = digests(tmp_path)
    message = cli_error(["fit", "--demo", "-q", "--cluster", str(table), "-o",
                         str(tmp_path / "run.h5")], capsys)
    assert message.startswith(f"{table}: {field} = '")
    assert message.endswith("the port must be a number from 1 to 65535" if "address" in field
                            else 'must be a time above zero such as "02:00:00" (hours:minutes:'
                                 'seconds, minutes and seconds below 60; a days- prefix as in '
                                 '"1-12:00:00")')
    assert digests(tmp_path) == before


# ------------------------------------------------------------------ synaptic transients

@pytest.mark.parametrize("gap", [1e-3, 1e-9, 1e-15])
def test_a_transient_with_rise_and_decay_nearly_equal_is_the_alpha_function(gap: float
                                                                            ) -> None:
    """As τr → τd = τ, peak·(e^{−s/τd} − e^{−s/τr}) normalised tends to the alpha function
    peak·(s/τ)·e^{1 − s/τ}: the difference of exponentials lost all its digits on the way
    (a noise that stalled the simulation), the form kingen uses keeps them."""
    import numpy as np

    from kingen.experiment.protocol import Transient

    tau = 2.0
    transient = Transient(start=1.0, peak=3.0, tau_decay=tau, tau_rise=tau * (1 - gap))
    s = np.linspace(0.0, 40.0, 4001)
    alpha = (s / tau) * np.exp(1.0 - s / tau)
    # the exact shape differs from the limit by O(gap); the rounding must stay at 1e-15
    assert np.max(np.abs(transient.shape(s) - alpha)) <= 2 * gap + 1e-14
    assert transient.shape(np.array([transient._rise()[1]]))[0] == pytest.approx(1.0,
                                                                                rel=1e-14)


def test_simulating_a_transient_with_rise_and_decay_nearly_equal_takes_seconds(
        tmp_path: Path) -> None:
    # it ran past 60 s without a word: the stiff reference solver stalled on the noise
    import subprocess
    import sys

    protocol = tmp_path / "p.toml"
    protocol.write_text("[protocol]\ndt = 0.05\n[[sweeps]]\nduration = 20\ntransients = "
                        "[{ start = 2, peak = 1, tau_decay = 1.0000000001, tau_rise = 1.0 }]\n")
    out = tmp_path / "o.csv"
    done = subprocess.run([sys.executable, "-m", "kingen", "simulate",
                           str(ROOT / "data" / "jonas_1993_reversible.toml"), "--protocol",
                           str(protocol), "--csv", str(out)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert out.exists()


# ------------------------------------------------------------------ memory of a simulation

def test_simulate_is_guarded_by_the_memory_limit_and_force_lifts_it(
        tmp_path: Path, capsys, monkeypatch) -> None:
    # a dose protocol of 100,000 sweeps asked NumPy for 12 GiB and died with
    # _ArrayMemoryError; the limits that guard fit guard simulate too
    from kingen.model import limits

    model = ROOT / "data" / "jonas_1993_reversible.toml"  # 7 states
    protocol = tmp_path / "dose.toml"
    protocol.write_text("[protocol]\nkind = 'dose_response'\ndt = 0.05\n[dose]\nstart = 2\n"
                        "duration = 5\ntail = 3\nconcentrations = [0.1, 1]\n")
    out = tmp_path / "o.csv"
    before = digests(tmp_path) | {"model": hashlib.sha256(model.read_bytes()).hexdigest()}
    monkeypatch.setattr(limits, "free_memory", lambda: 40_000)
    argv = ["simulate", str(model), "--protocol", str(protocol), "--csv", str(out)]
    # 2 sweeps of 10 ms at 0.05 ms: 402 samples of 7 occupancies, time, current and
    # concentration, 8 bytes each
    assert cli_error(argv, capsys) == (
        f"{protocol}: sweeps: needs 31.4 KiB for the traces of 2 sweeps (402 samples); 39.1 "
        "KiB free (the limit is 50% of that): fewer or shorter sweeps, or a larger dt, or "
        "pass --force (force = true in a fit configuration) to try anyway")
    assert digests(tmp_path) | {"model": hashlib.sha256(model.read_bytes()).hexdigest()
                                } == before
    assert main(argv + ["--force"]) == 0 and out.exists()
