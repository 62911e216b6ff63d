"""Myokit ``.mmt`` models: :func:`read_myokit` (a Markov model in the form
``myokit.lib.markov.LinearModel`` finds) and :func:`write_myokit`."""

from kingen.outputs.interop.myokit.reader import read_myokit
from kingen.outputs.interop.myokit.writer import write_myokit

__all__ = ["read_myokit", "write_myokit"]
