"""The drivers that tie the layers above to a run file: fit, resume, profile, simulate.

==========================  ===============================================================
module                      its one job
==========================  ===============================================================
:mod:`.fit`                 :func:`~kingen.runs.fit.fit` and :func:`~kingen.runs.fit.resume`:
                            open the run file, run the search engine, read the result back
:mod:`.profile`             ``kingen profile``: the profile engine written to the run file
:mod:`.result`              :class:`~kingen.runs.result.FitResult`: what a fit gives back
:mod:`.simulate`            :func:`~kingen.runs.simulate.simulate`: one scheme's currents under
                            one protocol, with features, CSV and figures
==========================  ===============================================================

They sit below the store (they open run files) and the outputs (simulate draws), and
above scale-out, whose workers run them. Import them from :mod:`kingen`.
"""
