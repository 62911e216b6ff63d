"""A fit killed with SIGKILL mid-run keeps every completed generation, and ``kingen resume``
finishes it exactly as an uninterrupted run with the same seed (CPU backend)."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
from test_fit_helpers import write_problem

from kingen.cli import main
from kingen.runs.fit import fit
from kingen.store import RunStore

GENERATIONS = 30


def _committed(path) -> int:
    try:
        with RunStore.open(path) as store:
            return store.n_generations
    except Exception:  # not created yet, or caught between its first writes
        return 0


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path):
    whole_dir = tmp_path / "whole"
    whole_dir.mkdir()
    whole = fit(write_problem(whole_dir, ga=f"generations = {GENERATIONS}"), progress=False)

    run_dir = tmp_path / "killed"
    run_dir.mkdir()
    cfg = write_problem(run_dir, ga=f"generations = {GENERATIONS}")
    run = run_dir / "run.h5"
    proc = subprocess.Popen([sys.executable, "-m", "kingen.cli", "fit", str(cfg), "-q"],
                            cwd=run_dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while _committed(run) < 3:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the fit did not start"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL

    with RunStore.open(run) as store:
        done = store.n_generations
        history = store.history()
        assert store.finished in (None, "")
    assert 3 <= done < GENERATIONS + 1, done
    # every completed generation is there and equals the uninterrupted run's
    np.testing.assert_array_equal(history["best"], whole.history["best"][:done])

    assert main(["resume", str(run), "-q"]) == 0
    with RunStore.open(run) as store:
        final = store.history()
        best = store.best()
    np.testing.assert_array_equal(final["best"], whole.history["best"])
    np.testing.assert_array_equal(best["params"], whole.params)
