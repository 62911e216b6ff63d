"""The experiment layer: what was done to the patch and what was recorded.

==========================  ===============================================================
module                      its one job
==========================  ===============================================================
:mod:`.protocol`            protocols: concentration steps, trains, dose series, transients
:mod:`.recordings`          recordings and summary targets (CSV, NWB, ABF) in internal units
:mod:`.features`            features of currents (peaks, time constants, ratios)
==========================  ===============================================================
"""

from kingen.experiment.protocol import Protocol, load_protocol, standard_protocol

__all__ = ["Protocol", "load_protocol", "standard_protocol"]
