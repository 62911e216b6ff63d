"""What a run gives a user: figures, reports, exports, and schemes for NEURON and Myokit.

==========================  ===============================================================
module                      its one job
==========================  ===============================================================
:mod:`.plot`                the figures of a run
:mod:`.report`              the HTML and markdown summary of a run
:mod:`.export`              fitted currents as CSV or NWB, the fitted scheme as TOML
:mod:`.interop`             schemes to and from NEURON ``.mod`` and Myokit ``.mmt``
==========================  ===============================================================

Import the entry points from :mod:`kingen` (``plot_run``, ``write_report``,
``import_scheme``, ``export_scheme``); importing this package loads nothing heavy.
"""
