"""One read-only view of a run, for everything that shows it: plots, report, export, FitResult.

A :class:`RunView` reads each part of a run file once, when first asked, and answers the
questions the outputs ask: the scheme and protocols, the best candidate and its features,
the fitted parameters and where they came from, each parameter's role, values in the
scheme file's units. It never writes.

Examples
--------
>>> from kingen.store import RunView
>>> with RunView.open("demo.h5") as run:  # doctest: +SKIP
...     params, origin = run.fitted_params()
>>> origin  # doctest: +SKIP
'best candidate'
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import cached_property
from typing import Any

import numpy as np

from kingen.errors import KingenError
from kingen.experiment.protocol import Protocol
from kingen.fitting.params import file_factors
from kingen.model.scheme import Scheme
from kingen.store.runstore import RunStore


class RunView:
    """A run as its outputs read it; each part is read from ``store`` once.

    Parameters
    ----------
    store
        An open run store (read or append mode). The view does not close it.
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> RunView:
        """Open a run file for reading; use as a context manager to close it."""
        return cls(RunStore.open(path, "r"))

    def __enter__(self) -> RunView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.close()

    # ------------------------------------------------------------------ parts, read once
    @property
    def path(self) -> str:
        """The run file."""
        return str(self.store.path)

    @cached_property
    def names(self) -> list[str]:
        """Protocol names, in the run's order."""
        return self.store.protocol_names

    @cached_property
    def scheme(self) -> Scheme:
        """The scheme the run fitted (as stored in the run file)."""
        return self.store.scheme()

    @property
    def title(self) -> str:
        """The scheme's name."""
        return self.scheme.name

    @cached_property
    def protocols(self) -> list[Protocol]:
        """The protocols, in the run's order."""
        return self.store.protocols()

    @cached_property
    def targets(self) -> dict[str, Any]:
        """Summary targets per protocol (None where a protocol has a recording)."""
        return self.store.targets()

    @cached_property
    def best(self) -> dict[str, Any] | None:
        """The best candidate as :meth:`RunStore.best` returns it, or None."""
        return self.store.best()

    @property
    def convergence(self) -> tuple[bool | None, str]:
        """Whether the search converged and the fit's summary line that says so, from
        ``/run/finished`` (see :func:`kingen.fitting.engine.convergence_of`); ``(None, "")``
        while the run goes on or if it was killed."""
        from kingen.fitting.engine import convergence_of

        return convergence_of(self.store.finished)

    @cached_property
    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The box the run searched (see :attr:`RunStore.bounds`), internal units."""
        return self.store.bounds

    @cached_property
    def free_mask(self) -> np.ndarray:
        """Per parameter: whether the fit varied it."""
        return self.store.free_mask

    @cached_property
    def profiles(self) -> dict[str, Any] | None:
        """The state of ``kingen profile`` (``table`` and ``results`` once finished), or
        None."""
        return self.store.profiles()

    @cached_property
    def local_uncertainty(self) -> dict[str, Any] | None:
        """Standard errors and correlations at the optimum (``/profiles/local``), or None."""
        return self.store.local_uncertainty()

    def uncertainty(self) -> tuple[list[dict[str, Any]], str, float] | None:
        """The uncertainty table's rows (file units), what they are, and their level: the
        profile-likelihood intervals once ``kingen profile`` has finished, else the local
        (quadratic) ones computed at the end of the fit; None without either."""
        prof = self.profiles or {}
        if prof.get("table"):
            return prof["table"], "profile-likelihood", float(prof["settings"]["level"])
        local = self.local_uncertainty or {}
        if local.get("table"):
            return local["table"], "local (Fisher)", float(local.get("level", 0.95))
        return None

    def history(self, *, population: bool = False) -> dict[str, Any]:
        """Every committed generation (see :meth:`RunStore.history`)."""
        return self.store.history(population=population)

    # ------------------------------------------------------------------ derived answers
    def features(self, name: str, which: str) -> dict[str, Any]:
        """The best candidate's features of protocol ``name``: ``which`` is ``"fit"`` or
        ``"data"``; empty when there are none."""
        if self.best is None:
            return {}
        return ((self.best.get("features") or {}).get(name) or {}).get(which) or {}

    def amplitudes(self) -> dict[str, float]:
        """The best candidate's amplitude (channels) for every protocol, NaN where none
        applies (or no best candidate was written)."""
        amps = {} if self.best is None else self.best["amplitudes"]
        return {n: amps.get(n, float("nan")) for n in self.names}

    def fitted_params(self) -> tuple[np.ndarray, str]:
        """The fitted parameters (internal units, derived ones recomputed) and where they
        came from: the best candidate, else the hall of fame's first, else the last
        generation's best.

        Raises
        ------
        KingenError
            If the run holds no candidate yet.
        """
        scheme, best = self.scheme, self.best
        if best is not None and np.all(np.isfinite(best["params"])):
            return scheme.complete(best["params"]), "best candidate"
        hof = self.store.hall_of_fame()
        if hof is not None:
            return scheme.complete(hof[0][0]), "hall of fame (no best candidate written)"
        _, params, fit = self.store.best_per_generation()
        if fit.size and np.isfinite(fit[-1]):
            return scheme.complete(params[-1]), f"best of generation {fit.size - 1}"
        raise KingenError("no fitted candidate in the run file yet (no generation completed)",
                          file=self.path)

    def in_file_units(self, values: np.ndarray) -> np.ndarray:
        """Parameter values (internal units, scheme order) in the units the scheme file
        writes them in."""
        return np.asarray(values, dtype=float) / file_factors(self.scheme)

    def roles(self, ties: Iterable[str] = ()) -> dict[str, str]:
        """Each parameter's role: ``derived``, ``tied`` (names in ``ties``), ``free`` (the
        fit varied it) or ``fixed``."""
        tied = set(ties)
        return {p.name: ("derived" if p.derived else "tied" if p.name in tied else
                         "free" if self.free_mask[k] else "fixed")
                for k, p in enumerate(self.scheme.parameters)}


__all__ = ["RunView"]
