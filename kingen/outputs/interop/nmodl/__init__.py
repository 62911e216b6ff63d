"""NEURON NMODL ``.mod`` files: :func:`read_nmodl` (a ``KINETIC`` block) and
:func:`write_nmodl` (a ``POINT_PROCESS``)."""

from kingen.outputs.interop.nmodl.reader import read_nmodl
from kingen.outputs.interop.nmodl.writer import write_nmodl

__all__ = ["read_nmodl", "write_nmodl"]
