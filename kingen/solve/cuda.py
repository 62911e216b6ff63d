"""The solver kernel on the GPU: launch variants and the tuned choice.

The kernel itself is generated (:mod:`kingen.codegen`) and compiled by
:mod:`kingen.solve.compiled`; one thread owns one (candidate, sweep) pair and keeps its state
in registers. What can vary without changing the answer is how it is built and launched: the
form (stage or propagator), threads per block, a cap on registers per thread, and lanes per
pair. ``kingen tune`` (:mod:`kingen.analysis.optimize`) searches these and records its choice
here, per device, scheme and precision; the solver then launches with it.

This module is kingen's one tuning cache (``$KINGEN_CACHE/solver_tuning.json``, read by
:func:`load_tuning`, written by :func:`record_entry`). Nothing here imports the analysis
package: it sits below the solver in kingen's layers.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from kingen.solve.compiled import cache_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock
    fcntl = None

DEFAULT_BLOCK = 128


FORMS = ("stage", "propagator")


@dataclass(frozen=True)
class LaunchConfig:
    """How the solver kernel is built and launched.

    ``form`` is ``"stage"`` (the four RK4 stages at every step) or ``"propagator"`` (on
    constant-concentration rows, one product with M = R(hQ)ⁿ per sample); ``lanes`` is how
    many GPU threads share one (candidate, sweep) pair in the propagator form (each holds
    a slice of M's columns in registers); ``span`` is how many samples of a propagated row
    one product yields in objective mode (:mod:`kingen.codegen.span`; 1: one product per
    sample; on the GPU with at least two lanes); ``max_registers`` caps the registers of
    the sample kernel (``launch``) alone, not the builds'. The CPU backend uses ``form``
    and ``span``.
    """

    block: int = DEFAULT_BLOCK
    max_registers: int | None = None
    form: str = "stage"
    lanes: int = 1
    span: int = 1

    @classmethod
    def parse(cls, text: str) -> LaunchConfig:
        """The configuration a :attr:`name` stands for (``stage-`` may prefix a stage name).

        >>> LaunchConfig.parse("prop-l4-b64r128")
        LaunchConfig(block=64, max_registers=128, form='propagator', lanes=4, span=1)
        >>> LaunchConfig.parse("prop-l8-s16-b128").span
        16
        >>> LaunchConfig.parse("stage-b128").name
        'b128'
        """
        from kingen.errors import KingenError

        parts = text.strip().split("-")
        form, lanes, span = "stage", 1, 1
        try:
            if parts[0] == "prop":
                form, lanes = "propagator", int(parts[1].removeprefix("l"))
                parts = parts[2:]
                if parts and parts[0].startswith("s"):
                    span = int(parts[0].removeprefix("s"))
                    parts = parts[1:]
            elif parts[0] == "stage":
                parts = parts[1:]
            launch = parts[0] if parts else f"b{DEFAULT_BLOCK}"
            block, _, regs = launch.removeprefix("b").partition("r")
            config = cls(int(block), int(regs) if regs else None, form, lanes, span)
        except (ValueError, IndexError):
            config = None
        if config is None or (span > 1 and (span & (span - 1) or span % lanes)):
            raise KingenError("unknown solver variant (e.g. b128, stage-b128r96, "
                              "prop-l4-b128, prop-l8-s16-b128)", field="variant",
                              value=text) from None
        return config

    @property
    def name(self) -> str:
        """Short label, e.g. ``b128``, ``b128r96``, ``prop-l4-b128`` or
        ``prop-l8-s16-b128``."""
        launch = f"b{self.block}" + (f"r{self.max_registers}" if self.max_registers else "")
        if self.form == "propagator":
            span = f"s{self.span}-" if self.span > 1 else ""
            return f"prop-l{self.lanes}-{span}{launch}"
        return launch


# The CPU backend's launch: spans of 16 samples cut R&H's objective solve 5x on 2 cores
# (benchmarks/results/cpu-2core/propagator/spans.json).
CPU_DEFAULT = LaunchConfig(form="propagator", span=16)

VARIANTS = (
    LaunchConfig(64), LaunchConfig(128), LaunchConfig(256),
    LaunchConfig(128, 128), LaunchConfig(256, 96), LaunchConfig(256, 64),
)


def _tuning_file() -> Path:
    return cache_dir() / "solver_tuning.json"


def tuning_key(device: str, scheme_key: str, precision: str) -> str:
    """Cache key of a tuned choice."""
    return f"{device}|{scheme_key}|{precision}"


def scheme_key(scheme) -> str:
    """Identifies a scheme's generated kernel (states and transitions, not values)."""
    from kingen.codegen import generate

    return generate(scheme, "objective").key


# The batch size at which the defaults chosen on the H200 for float32's ideal steps and for
# float64 with exchange were measured faster (2026-11-29, dc7b496 and 2b63c54). Smaller
# batches, such as a profile's steps of a few hundred candidates, were not measured with
# them, and a batch too small to fill the GPU waits on each pair's own path, which 4 lanes
# make longer: they keep the launch measured at those sizes (spans of 16 over 8 lanes).
FULL_BATCH = 16_384


def small_batch(n_candidates: int | None) -> bool:
    """Whether a batch of ``n_candidates`` (None: a fit's generation) is below
    :data:`FULL_BATCH`.

    >>> small_batch(352), small_batch(16_384), small_batch(None)
    (True, False, False)
    """
    return n_candidates is not None and n_candidates < FULL_BATCH


def default_config(scheme, precision: str = "float64", stage_rows: str = "none",
                   filtered: bool = False, small: bool = False) -> LaunchConfig:
    """The launch used where ``kingen tune`` recorded none: the propagator form.

    As measured fastest on an H100 at 16,384 candidates
    (``benchmarks/results/h100/propagator/2026-11-23_8ecf346_*``), in both precisions:

    - protocols with ideal steps (``stage_rows`` ``"none"``: every row propagated): spans
      of 16 samples over 8 lanes for more than 8 states (Robert & Howe: 118,066 candidates/s
      against 53,855 with one product per sample on 4 lanes), spans of 8 over 4 lanes from
      4 to 8 states (Jonas: 225,740 against 193,296 on one lane);
    - rows left in stage form (finite exchange; every lane of a pair repeats their RK4
      steps), as measured on an H200 at 16,384 candidates with 0.2 ms exchange
      (``benchmarks/results/h200/propagator/2026-11-29_5f95e60_*_lanes.json``):

      - up to 8 states, one lane (Raman & Trussell: 248,365 candidates/s, against 236,590
        with spans of 8 over 2 lanes and 164,123 over 4; Jonas: 216,818, 247,900 and
        190,378);
      - beyond, spans of 16 over 8 lanes, as for ideal steps (Robert & Howe float64:
        60,913 against 56,759 with spans of 8 over 2 lanes; with an 8-pole filter 49,099
        against 17,080, and 64,424 against 54,040 in float32; Coombs float64: 52,177
        against 39,672), except without a filter: in float32 spans of 8 over 2 lanes
        (Robert & Howe: 98,726 against 76,276; 133,971 against 97,346 at dc7b496, and
        120,718 over 4 lanes), and in float64 up to 16 states spans of 8 over 4 lanes, which
        repeat the stage steps on half as many lanes (Robert & Howe: 86,464 against
        75,420; with the filter 4 lanes lose, 48,244 against 59,148; files
        ``2026-11-29_{dc7b496,2b63c54}_rh03_*``). Beyond 16 states 4 lanes would hold
        more columns than were measured.

    - float32 with ideal steps and no filter, beyond 8 states: spans of 32 over 8 lanes,
      as measured on an H200 at 16,384 candidates once the span arrays were built by
      squaring (``benchmarks/results/h200/propagator/2026-11-29_dc7b496_*``; Robert &
      Howe: kernels 43.0 ms against 51.5 with spans of 16, 285,223–313,955 candidates/s
      against 267,931–268,119). In float64 spans of 32 spill registers and gain 4 % with
      ideal steps (204,852 against 197,292), and lose with exchange (74,070 against
      75,420) and a filter (51,499 against 59,148): spans of 16 stay.

    ``filtered``: the protocols pass the current through a recording filter in the kernel.
    ``small``: a batch below :data:`FULL_BATCH` candidates, which keeps spans of 16 over 8
    lanes where these two rules would change them.

    >>> from kingen.model.scheme import Scheme
    >>> rh = Scheme.load("models/robert_howe_2003.toml")
    >>> default_config(rh).name
    'prop-l8-s16-b128'
    >>> default_config(rh, "float32").name
    'prop-l8-s32-b128'
    >>> default_config(rh, "float32", small=True).name
    'prop-l8-s16-b128'
    >>> default_config(rh, "float32", filtered=True).name
    'prop-l8-s16-b128'
    >>> default_config(rh, stage_rows="smooth").name
    'prop-l4-s8-b128'
    >>> default_config(rh, stage_rows="smooth", small=True).name
    'prop-l8-s16-b128'
    >>> default_config(rh, stage_rows="smooth", filtered=True).name
    'prop-l8-s16-b128'
    >>> default_config(rh, "float32", stage_rows="smooth").name
    'prop-l2-s8-b128'
    >>> default_config(rh, "float32", stage_rows="smooth", filtered=True).name
    'prop-l8-s16-b128'
    >>> default_config(Scheme.load("models/jonas_1993.toml"), stage_rows="smooth").name
    'prop-l1-b128'
    """
    n = scheme.n_states
    if stage_rows != "none" and n <= 8:
        return LaunchConfig(form="propagator", lanes=1)
    if stage_rows != "none" and precision == "float32" and not filtered:
        return LaunchConfig(form="propagator", lanes=2, span=8)
    if stage_rows != "none" and not filtered and n <= 16 and not small:
        return LaunchConfig(form="propagator", lanes=4, span=8)
    if n < 4:
        return LaunchConfig(form="propagator", lanes=1)
    if n <= 8:
        return LaunchConfig(form="propagator", lanes=4, span=8)
    if precision == "float32" and stage_rows == "none" and not filtered and not small:
        return LaunchConfig(form="propagator", lanes=8, span=32)
    return LaunchConfig(form="propagator", lanes=8, span=16)


def load_tuning() -> dict:
    """The whole tuning table (empty when there is none or it is unreadable)."""
    try:
        table = json.loads(_tuning_file().read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def tuned_config(device: str, scheme, precision: str, stage_rows: str = "none",
                 filtered: bool = False, small: bool = False) -> LaunchConfig:
    """The launch configuration ``kingen tune`` chose for this device, scheme and precision,
    or the default (for a batch with ``stage_rows``, a filter or none, and ``small`` or not,
    see :func:`default_config`) when none was recorded."""
    entry = load_tuning().get(tuning_key(device, scheme_key(scheme), precision))
    if not entry:
        return default_config(scheme, precision, stage_rows, filtered, small)
    return LaunchConfig(int(entry["block"]), entry.get("max_registers"),
                        str(entry.get("form", "stage")), int(entry.get("lanes", 1)),
                        int(entry.get("span", 1)))


def record_entry(key: str, entry: dict) -> Path:
    """Store one entry of the tuning table under ``key`` (atomically, under a lock)."""
    path = _tuning_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    # read-modify-write under a lock: concurrent `kingen tune` runs (one per GPU) must not
    # drop each other's entries
    with open(path.with_suffix(".lock"), "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        table = load_tuning()
        table[key] = entry
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=1, default=str))
        os.replace(tmp, path)
    return path


def record_tuning(device: str, scheme, precision: str, config: LaunchConfig,
                  evidence: dict) -> Path:
    """Store a tuned choice (atomically) and the timings that justify it."""
    return record_entry(tuning_key(device, scheme_key(scheme), precision),
                        {**asdict(config), "evidence": evidence})
