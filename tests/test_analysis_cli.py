"""``kingen analyze`` without a GPU: one line, clean exit; no file written."""

from __future__ import annotations

import argparse
import subprocess
import sys

from kingen.cli.analysis import add_analyze_parser, cmd_analyze


def parse(argv):
    p = argparse.ArgumentParser(prog="kingen")
    add_analyze_parser(p.add_subparsers(dest="command"))
    return p.parse_args(argv)


def test_no_gpu_one_line(tmp_path, capsys):
    # the suite runs under the CUDA simulator, which analyze treats as "no GPU"
    args = parse(["analyze", "all", "--out", str(tmp_path / "out")])
    assert args.handler is cmd_analyze and args.target == "all" and not args.no_ncu
    assert cmd_analyze(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "no CUDA GPU found" in out[0]
    assert not (tmp_path / "out").exists()


def test_no_gpu_without_simulator_in_fresh_process(tmp_path):
    code = ("import argparse, sys; from kingen.cli.analysis import add_analyze_parser, "
            "cmd_analyze; p = argparse.ArgumentParser(); "
            "add_analyze_parser(p.add_subparsers()); "
            f"sys.exit(cmd_analyze(p.parse_args(['analyze', 'stencil', '--out', "
            f"{str(tmp_path)!r}])))")
    env = {"PATH": "/usr/bin:/bin", "NUMBA_ENABLE_CUDASIM": "0", "CUDA_VISIBLE_DEVICES": ""}
    import os

    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kingen analyze: no CUDA GPU found")
    assert "Traceback" not in r.stderr


def test_bad_target_rejected():
    import pytest

    with pytest.raises(SystemExit):
        parse(["analyze", "gemm"])


def parse_tune(argv):
    from kingen.cli.analysis import add_tune_parser

    p = argparse.ArgumentParser(prog="kingen")
    sub = p.add_subparsers(dest="command")
    add_analyze_parser(sub)
    add_tune_parser(sub)
    return p.parse_args(argv)


def test_analyze_takes_the_solver_options():
    a = parse(["analyze", "rk4", "--model", "jonas_1993", "--full", "--precision", "float32",
               "--candidates", "64", "--protocols", "standard"])
    assert (a.model, a.full, a.precision, a.candidates, a.protocols) == (
        "jonas_1993", True, "float32", 64, "standard")
    d = parse(["analyze", "rk4"])
    assert (d.model, d.full, d.precision, d.candidates, d.protocols) == (
        None, False, None, 16384, "desensitization")


def test_tune_without_gpu_is_one_line(tmp_path, capsys):
    from kingen.cli.analysis import cmd_tune

    args = parse_tune(["tune", "--model", "jonas_1993", "--out", str(tmp_path / "t")])
    assert args.handler is cmd_tune and args.out == tmp_path / "t" and args.gain == 1.05
    assert cmd_tune(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("kingen tune: no usable CUDA GPU")
    assert not (tmp_path / "t").exists()


def test_tune_model_errors_are_one_line(capsys):
    from kingen.cli.analysis import cmd_tune

    assert cmd_tune(parse_tune(["tune", "no_such_scheme"])) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "shipped schemes:" in out[0] and "jonas_1993" in out[0]
    assert cmd_tune(parse_tune(["tune", "jonas_1993", "--model", "geiger_1999"])) == 1
    assert "give the scheme once" in capsys.readouterr().out
    # the positional MODEL still works (the old form of the command)
    assert parse_tune(["tune", "jonas_1993"]).model_pos == "jonas_1993"


def test_tune_measures_the_standard_set_by_default():
    import inspect

    from benchmarks.propagator import STANDARD
    from kingen.analysis.optimize import run_tune
    from kingen.analysis.solver_cases import protocol_set

    assert parse_tune(["tune"]).protocols == "standard"
    assert parse_tune(["tune", "--protocols", "desensitization"]).protocols == "desensitization"
    assert inspect.signature(run_tune).parameters["protocols"].default == "standard"
    assert [p.name for p in protocol_set("standard")] == list(STANDARD)
