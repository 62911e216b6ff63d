"""``kingen analyze`` without a GPU: one line, clean exit; no file written."""

from __future__ import annotations

import argparse
import subprocess
import sys

from kingen.analysis.cli import add_analyze_parser, cmd_analyze


def parse(argv):
    p = argparse.ArgumentParser(prog="kingen")
    add_analyze_parser(p.add_subparsers(dest="command"))
    return p.parse_args(argv)


def test_no_gpu_one_line(tmp_path, capsys):
    # the suite runs under the CUDA simulator, which analyze treats as "no GPU"
    args = parse(["analyze", "all", "--out", str(tmp_path / "out")])
    assert args.func is cmd_analyze and args.target == "all" and not args.no_ncu
    assert cmd_analyze(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "no CUDA GPU found" in out[0]
    assert not (tmp_path / "out").exists()


def test_no_gpu_without_simulator_in_fresh_process(tmp_path):
    code = ("import argparse, sys; from kingen.analysis.cli import add_analyze_parser, "
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
