"""Packaging: the solver does not import the analysis; shipped schemes resolve by name; a
non-editable install into a fresh virtual environment runs ``kingen tune --help`` and
``kingen analyze rk4 --help`` from outside the checkout."""

from __future__ import annotations

import ast
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from kingen.errors import KingenError
from kingen.model.shipped import DEFAULT_MODEL, models_dir, resolve_model, shipped_models

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_solver_never_imports_the_analysis():
    files = sorted((ROOT / "kingen" / "solve").rglob("*.py"))
    assert files
    bad = {f.name: sorted(m for m in _imports(f) if m.startswith("kingen.analysis"))
           for f in files}
    assert not {k: v for k, v in bad.items() if v}, bad


def test_importing_the_solver_loads_no_analysis_module():
    code = ("import sys, kingen.solve, kingen.solve.cuda, kingen.solve.batch, "
            "kingen.solve.backends; "
            "print([m for m in sys.modules if m.startswith('kingen.analysis')])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_one_gpu_probe_and_one_tuning_cache():
    from kingen.analysis import gpu, tune
    from kingen.solve import cuda

    # the analysis' probe asks the solver's; the solver's file is the only tuning cache
    # (the reference-kernel tuner measures and caches nothing: no one read its entries)
    assert "cuda_status" in _imports(Path(gpu.__file__)) or "cuda_status" in Path(
        gpu.__file__).read_text()
    assert "kingen.solve.cuda" not in _imports(Path(tune.__file__))
    assert not hasattr(tune, "_cache_file")
    assert cuda._tuning_file().name == "solver_tuning.json"


def test_tuning_entries_share_one_file(tmp_path, monkeypatch):
    from kingen.model.scheme import Scheme
    from kingen.solve.cuda import LaunchConfig, load_tuning, record_entry, record_tuning

    monkeypatch.setenv("KINGEN_CACHE", str(tmp_path))
    record_entry("kernel|dev|stencil-small", {"best": "stencil_zreg"})
    record_tuning("dev", Scheme.load(resolve_model("jonas_1993")), "float64",
                  LaunchConfig(64), {})
    assert len(load_tuning()) == 2
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["solver_tuning.json"]


def test_resolve_model_by_name_and_path(tmp_path, monkeypatch):
    assert models_dir() is not None
    names = shipped_models()
    assert DEFAULT_MODEL in names and "jonas_1993" in names
    assert resolve_model(None).name == "robert_howe_2003.toml"
    assert resolve_model("jonas_1993") == resolve_model("jonas_1993.toml")
    own = tmp_path / "mine.toml"
    own.write_text("x")
    assert resolve_model(str(own)) == own
    # a checkout-relative path run from elsewhere falls back to the shipped file
    monkeypatch.chdir(tmp_path)
    assert resolve_model("models/geiger_1999.toml").parent == models_dir()
    with pytest.raises(KingenError, match="shipped schemes: coombs_2017"):
        resolve_model("no_such_scheme")


def _site_dirs() -> list[str]:
    """Where this interpreter finds kingen's dependencies (not kingen itself)."""
    dirs = list(site.getsitepackages()) + [site.getusersitepackages()]
    return [d for d in dirs if os.path.isdir(d)]


_CAN_BUILD = (
    "import sys, importlib.util as u, setuptools\n"
    "v = tuple(int(x) for x in setuptools.__version__.split('.')[:2])\n"
    "sys.exit(0 if v >= (68, 0) and (v >= (70, 1) or u.find_spec('wheel')) else 1)\n")


@pytest.mark.slow
def test_non_editable_install_in_a_fresh_venv(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("kingen", "models"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies (numpy, numba, ...) come from this interpreter's site folders, after
    # the venv's own: kingen itself must come from the venv
    Path(purelib, "_kingen_test_deps.pth").write_text("\n".join(_site_dirs()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(NUMBA_ENABLE_CUDASIM="0", CUDA_VISIBLE_DEVICES="", PIP_NO_INPUT="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    # pip and setuptools of this interpreter, without build isolation (nothing downloaded)
    # when they can build the wheel (setuptools >= 68, and wheel before 70.1); else pip's
    # usual isolated build, which fetches them (--ignore-installed: a kingen installed
    # beside the dependencies is neither used nor touched)
    can_build = subprocess.run([str(py), "-c", _CAN_BUILD], env=env, timeout=120).returncode
    cmd = [str(py), "-m", "pip", "install", "--no-deps", "--ignore-installed"]
    if can_build == 0:
        cmd += ["--no-build-isolation", "--no-index"]
    r = subprocess.run(cmd + [str(src)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    shutil.rmtree(src)  # nothing may be read from the source tree any more
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    kingen = venv / "bin" / "kingen"
    where = subprocess.run([str(py), "-c", "import kingen, kingen.model.shipped as s; "
                            "print(kingen.__file__); print(s.models_dir())"],
                           capture_output=True, text=True, env=env, cwd=outside, timeout=120)
    assert where.returncode == 0, where.stderr
    pkg, models = where.stdout.split()
    assert pkg.startswith(str(venv)) and models.startswith(str(venv)), where.stdout
    assert Path(models, "robert_howe_2003.toml").is_file()
    for args in (["tune", "--help"], ["analyze", "rk4", "--help"]):
        r = subprocess.run([str(kingen), *args], capture_output=True, text=True, env=env,
                           cwd=outside, timeout=300)
        assert r.returncode == 0, (args, r.stderr[-2000:])
        assert "--model" in r.stdout and "Traceback" not in r.stderr
    # no GPU: one line and exit 0, with a shipped scheme named
    r = subprocess.run([str(kingen), "tune", "--model", "jonas_1993"], capture_output=True,
                       text=True, env=env, cwd=outside, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().startswith("kingen tune: no usable CUDA GPU")
    assert len(r.stdout.strip().splitlines()) == 1
    # a name that is not shipped: one line naming the shipped ones, exit 1
    r = subprocess.run([str(kingen), "tune", "--model", "nope"], capture_output=True,
                       text=True, env=env, cwd=outside, timeout=300)
    assert r.returncode == 1 and "robert_howe_2003" in r.stdout and "Traceback" not in r.stderr
