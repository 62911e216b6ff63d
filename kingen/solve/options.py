"""How the batched solver runs: one frozen set of options, validated once and passed down.

:class:`SolverOptions` holds the backend, the precision, the RK4 step (fixed, or chosen per
segment by a Courant number) and the GPU launch configuration. It is checked when it is made
(an error names the option, for example ``SolverOptions.precision``) and then handed,
unchanged, to :class:`~kingen.fitting.objective.Objective`,
:class:`~kingen.solve.batch.Simulator`, the scale-out evaluator and its worker plugin.

Examples
--------
>>> options = SolverOptions(backend="cpu", precision="float32")
>>> options.precision, options.step, options.courant
('float32', None, 2.5)
>>> options.replace(step=0.01).step
0.01
>>> SolverOptions(precision="double")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
kingen.errors.KingenError: SolverOptions.precision = 'double': unknown precision ...
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kingen.errors import KingenError
from kingen.solve.cuda import LaunchConfig
from kingen.solve.schedule import DEFAULT_COURANT, RK4_STABILITY_LIMIT

PRECISIONS = ("float64", "float32")
BACKENDS = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class SolverOptions:
    """The solver's options (frozen: checked once, when made).

    Attributes
    ----------
    backend
        ``auto`` (GPU if one works, else CPU), ``cpu`` or ``cuda``.
    precision
        ``float64`` or ``float32``.
    step
        Fixed RK4 step, ms; None: chosen per segment for stability (see
        :mod:`kingen.solve.schedule`).
    courant
        h·ρ of the automatic step choice, in (0, RK4's stability limit 2.785).
    launch
        The GPU kernel's launch configuration; None: the tuned or default one for the
        scheme and device (see :mod:`kingen.solve.cuda`).

    Raises
    ------
    KingenError
        Naming the option (``SolverOptions.<name>``) and its value.
    """

    backend: str = "auto"
    precision: str = "float64"
    step: float | None = None
    courant: float = DEFAULT_COURANT
    launch: LaunchConfig | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise _error("backend", self.backend, f"unknown backend (use {' or '.join(BACKENDS)})")
        if self.precision not in PRECISIONS:
            raise _error("precision", self.precision, "unknown precision (use float64 or float32)")
        if self.step is not None and not (_real(self.step) and self.step > 0):
            raise _error("step", self.step, "must be a number > 0 (ms), or None")
        if not (_real(self.courant) and 0 < self.courant < RK4_STABILITY_LIMIT):
            raise _error("courant", self.courant,
                         f"must be in (0, {RK4_STABILITY_LIMIT}), RK4's stability limit")
        if self.launch is not None and not isinstance(self.launch, LaunchConfig):
            raise _error("launch", self.launch, "must be a kingen.solve.cuda.LaunchConfig")

    def replace(self, **changes: Any) -> SolverOptions:
        """A copy with ``changes`` (checked as a new one is)."""
        return dataclasses.replace(self, **changes)


def _real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _error(name: str, value: object, message: str) -> KingenError:
    return KingenError(message, field=f"SolverOptions.{name}", value=value)


def options_from_keywords(options: SolverOptions | None, where: str, **given: Any
                          ) -> SolverOptions:
    """``options``, or options made from the loose keywords an older call gave (each one
    given with a DeprecationWarning naming the option to use instead).

    Examples
    --------
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     options = options_from_keywords(None, "Objective", backend="cpu", step=None)
    >>> options.backend, str(caught[0].message)
    ('cpu', 'Objective(backend=...) is deprecated: pass options=SolverOptions(backend=...)')
    """
    import warnings

    loose = {k: v for k, v in given.items() if v is not None}
    if not loose:
        return options if options is not None else SolverOptions()
    if options is not None:
        raise TypeError(f"{where}: give options=SolverOptions(...) or the keywords "
                        f"{', '.join(loose)}, not both")
    names = ", ".join(f"{k}=..." for k in loose)
    warnings.warn(f"{where}({names}) is deprecated: pass options=SolverOptions({names})",
                  DeprecationWarning, stacklevel=3)
    return SolverOptions(**loose)
