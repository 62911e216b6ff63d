"""Kept device buffers for a GPU call's small inputs (kingen.solve.staging), under Numba's
CUDA simulator in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import numpy as np
from kingen.solve import staging

ints, floats = np.arange(6).reshape(2, 3), np.array([0.5, 1.5])
a, b, c = staging.upload("t", ints, floats, np.array([7, 8]))
assert a.shape == (2, 3) and a.dtype == np.int64 and b.dtype == np.float64
np.testing.assert_array_equal(a.copy_to_host(), ints)
np.testing.assert_array_equal(b.copy_to_host(), floats)
np.testing.assert_array_equal(c.copy_to_host(), [7, 8])  # packed after ints, one upload
kept = staging._buffers[("upload", "t", np.dtype(np.int64).str)]
# a smaller call reuses the buffer with its own values; a larger one grows it
(d,) = staging.upload("t", np.array([[9], [10]]))
np.testing.assert_array_equal(d.copy_to_host(), [[9], [10]])
assert staging._buffers[("upload", "t", np.dtype(np.int64).str)] is kept
(e,) = staging.upload("t", np.arange(20))
np.testing.assert_array_equal(e.copy_to_host(), np.arange(20))
assert staging._buffers[("upload", "t", np.dtype(np.int64).str)] is not kept
(empty,) = staging.upload("t", np.zeros((0, 3)))
assert empty.shape == (0, 3)
s = staging.scratch("s", (3, 4))
assert staging.scratch("s", (3, 4)) is s and staging.scratch("s", (4, 3)) is not s
print("same")
"""


def test_uploads_share_a_kept_buffer_and_return_each_array_as_given():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "same" in out.stdout
