"""Fit a scheme's rate constants: DEAP's (μ + λ) or CMA-ES, one batched solve per generation.

One module per job, as PINTS splits a controller from its methods and DEAP groups its
operators by kind:

==========================  =================================================================
module                      its one job
==========================  =================================================================
:mod:`.objective`           a population's fitness, batched: one solve, every protocol
:mod:`.params`              genes <-> rate constants, bounds and scales
:mod:`.config`              the fit configuration file (``fit.toml``) and the demo's
:mod:`.operators`           crossover, mutation, selection and varOr as array code (DEAP's
                            formulas, compiled per-gene loops)
:mod:`.state`               the typed search state; its resume arrays, encoding, checks
:mod:`.algorithms`          the search algorithms as ask/tell classes, one file each, and
                            their registry (``[ga] algorithm`` names one)
:mod:`.evaluator`           the Evaluator protocol; the objective's solve in this process
:mod:`.engine`              the controller: the generation loop, stopping rules, the hall of
                            fame; every generation's candidates scored by ONE call of a
                            replaceable evaluator; no algorithm known by name
:mod:`.polish`              least-squares polish of the best candidate
:mod:`.progress`            the live progress line of a fit
==========================  =================================================================

``kingen.fit`` and ``kingen.resume`` (:mod:`kingen.runs.fit`, which opens the run file) are
the public entry points (:mod:`kingen`). The package is not called ``fit`` so that
``kingen.fit`` stays the function.

Search. Genes are log10 rate constants (linear for ``scale = "linear"``) inside the bounds
(:mod:`kingen.fitting.params`). ``mu_plus_lambda`` is DEAP's (μ + λ): ``algorithms.varOr`` with
``tools.cxSimulatedBinaryBounded`` and ``tools.mutPolynomialBounded``, survival by
``tools.selTournament`` over parents and offspring, and a hall of fame of the best distinct
candidates. An algorithm only asks for genes and is told their scores: every individual a
generation must evaluate goes to the solver in ONE call. From ``NUMPY_OPERATORS_FROM``
offspring on (or with ``operators = "numpy"``), varOr, the two operators and the tournament
run as array code
(:mod:`.operators`) with the same formulas and probabilities; given the same random
numbers, the children are DEAP's exactly. ``cmaes`` is ``deap.cma.Strategy`` in genes
scaled to [0, 1] per gene (samples outside are clipped for evaluation and penalised by
their squared distance).

Elitism and convergence. (μ + λ) keeps its best: a tournament that passes over the best of
parents and offspring gives it the place of the worst survivor
(:func:`~kingen.fitting.operators.keep_best`), so the population's best never gets worse.
The search stops on stagnation (``[stop] patience`` generations without a relative
improvement of the best above ``min_improvement``), which counts as converged, or at a
maximum (generations, wall time), which does not (:func:`~kingen.fitting.engine.verdict`).

Reproducibility. ``random``, numpy's global generator (used by DEAP's CMA-ES) and the
fit's own numpy generator are seeded from ``seed``; their states are stored with every
generation, so the same seed, backend and precision give the same result, and a resumed run
ends as an uninterrupted one would.
"""
