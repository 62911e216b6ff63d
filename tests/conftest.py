import os

# GPU kernels are tested under Numba's CUDA simulator on machines without a GPU; this must be
# set before numba.cuda is first imported. The solver's "auto" backend never picks the
# simulator, so only tests that ask for backend="cuda" use it.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    # Under --dist loadgroup each test file is one group, as under loadfile (its module
    # fixtures are set up once), unless a test names its own group: a test that compiles
    # the kernel another file's tests compile names that file, and runs after them in the
    # same process, where the compiled kernel and the exact reference are already loaded.
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
