"""Identifiability and uncertainty of a fit: noise model, likelihood, Fisher information,
profile likelihoods (``kingen profile``).

Modules by job: :mod:`~kingen.identify.noise` (σ and the effective number of samples per
protocol), :mod:`~kingen.identify.likelihood` (χ² = −2 log L + const from the fit's
residuals), :mod:`~kingen.identify.fisher` (standard errors and correlations in log space),
:mod:`~kingen.identify.local` (both at the end of a fit), :mod:`~kingen.identify.profile`
(the batched profile engine), :mod:`~kingen.identify.problem` (the problem rebuilt from a
run file); ``kingen profile`` itself is :mod:`~kingen.runs.profile` (the engine written to
the run file) and :mod:`~kingen.cli.profile` (the command).
"""
