"""What a ``.mod`` file declares, read as kingen needs it: the units of rates,
concentrations and conductances (NMODL's ``/mM /ms``, ``1/s``, ``(/uM-ms)``, ``umho``), the
names of a channel count, and the reversal potential.
"""

from __future__ import annotations

from kingen.errors import KingenError
from kingen.model import units
from kingen.outputs.interop.nmodl.parser import ModFile

CHANNEL_NAMES = {"nchan", "n_chan", "nchannels", "n_channels", "channels", "nch", "N",
                  "Nchan", "numchan"}
CONDUCTANCE = {**units.CONDUCTANCE_PS, "mho": 1e12, "mmho": 1e9, "umho": 1e6,
                "micromho": 1e6, "nanomho": 1e3, "nS": 1e3, "picosiemens": 1.0,
                "nanosiemens": 1e3, "microsiemens": 1e6}
REVERSAL_NAMES = ("erev", "Erev", "e", "E", "e_rev", "Erev_ampa", "Ev", "E_rev", "erev_ampa")


def nmodl_unit(text: str | None) -> tuple[dict[str, int], bool]:
    """Exponents of the unit names in an NMODL unit (``/mM /ms`` -> {mM: -1, ms: -1}).

    Returns the exponents and whether the text could be read. NMODL writes a product with
    spaces or ``-`` and a power as trailing digits (``cm2``); every ``/`` divides the unit
    after it.

    Examples
    --------
    >>> nmodl_unit("/mM /ms")[0]
    {'mM': -1, 'ms': -1}
    >>> nmodl_unit("1/s")[0], nmodl_unit("/uM-ms")[0]
    ({'s': -1}, {'uM': -1, 'ms': -1})
    """
    if text is None:
        return {}, True
    out: dict[str, int] = {}
    tokens = text.replace("/", " / ").replace("-", " ").split()
    sign = 1
    for tok in tokens:
        if tok == "/":
            sign = -1
            continue
        if tok == "1":
            continue
        name = tok.rstrip("0123456789")
        power = int(tok[len(name):] or 1)
        if not name.replace("µ", "u").isalpha():
            return {}, False
        out[name] = out.get(name, 0) + sign * power
    return out, True


def rate_unit(text: str | None) -> tuple[float, int] | None:
    """(factor to ms⁻¹ or mM⁻¹ ms⁻¹, order) of an NMODL rate unit; None if not a rate."""
    exps, ok = nmodl_unit(text)
    if not ok:
        return None
    parts = [f"{u}^{p}" for u, p in exps.items()]
    try:
        return units.parse_rate_unit(" ".join(parts))
    except KingenError:
        return None


def concentration_unit(text: str | None) -> float | None:
    """Factor to mM of a concentration unit (``mM``, ``uM``, ...), None if not one."""
    exps, ok = nmodl_unit(text)
    if ok and len(exps) == 1:
        (u, p), = exps.items()
        if p == 1 and u in units.CONCENTRATION_MM:
            return units.CONCENTRATION_MM[u]
    return None


def reversal_note(mod: ModFile) -> str | None:
    """The header note on the file's reversal potential, if it declares one in mV."""
    for n in REVERSAL_NAMES:
        d = mod.parameters.get(n)
        if d is not None and d.value is not None and d.unit == "mV":
            return (f"Reversal potential {n} = {d.value:g} mV in the .mod file: kingen's "
                    f"protocols hold the reversal (reversal = {d.value:g} in a protocol).")
    return None
