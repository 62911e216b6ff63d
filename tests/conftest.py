import os

# GPU kernels are tested under Numba's CUDA simulator on machines without a GPU; this must be
# set before numba.cuda is first imported. The solver's "auto" backend never picks the
# simulator, so only tests that ask for backend="cuda" use it.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
