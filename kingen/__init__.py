"""kingen: fit kinetic (Markov) models of ion channels to electrophysiology recordings."""

from kingen.errors import KingenError

__version__ = "0.1.0"

__all__ = ["KingenError", "__version__"]
