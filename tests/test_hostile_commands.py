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
