"""Reading TOML files and their fields: one type-checked reader for every kind of file.

Scheme, protocol and fit-configuration files are all read through :func:`loads_toml` and
:class:`Fields`, so that the same mistake gives the same one-line message in each, with the
field spelled the same way (``protocols[0].dt``, ``parameters.kon.bounds[1]``):

- wrong type: ``must be a number``, ``must be an integer``, ``must be true or false``,
  ``must be a table``, ``must be an array``, ``must be a non-empty string``;
- not finite: ``must be finite (not inf or nan)``;
- out of range: ``must be > 0``, ``must be <= 1``, ...;
- finite in the file but not once converted to internal units: ``overflows once converted
  to ms (x 60000)``;
- nested too deeply (``nested too deeply (more than 32 levels ...)``) and integers of more
  than 64 bits (``integer too large ...``), which would otherwise surface as
  ``RecursionError``, ``OverflowError`` or an object array deep inside numpy or h5py.

This module sits at the top of the layers, beside :mod:`kingen.errors`: it knows nothing of
schemes or protocols.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import Any

from kingen.errors import KingenError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["MAX_DEPTH", "MAX_INTEGER", "MISSING", "Fields", "join", "loads_toml", "tomllib"]

# Deeper than any real file needs (a fit config reaches 4), shallow enough that repr(),
# json and h5py never recurse out of stack on what was read.
MAX_DEPTH = 32
# Integers must fit the int64 that numpy and HDF5 store them in.
MAX_INTEGER = 2**63 - 1


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""Default meaning "the field is required"."""


def join(where: str, key: str | int) -> str:
    """The path of a field: ``join("protocols[0]", "dt")`` is ``protocols[0].dt``,
    ``join("parameters.kon.bounds", 1)`` is ``parameters.kon.bounds[1]``."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def loads_toml(text: str, file: str) -> dict[str, Any]:
    """Parse TOML text and check how deep it nests and how large its integers are.

    Raises
    ------
    KingenError
        Malformed TOML, nesting deeper than :data:`MAX_DEPTH`, or an integer that does not
        fit in 64 bits; naming the file and, where known, the field.
    """
    try:
        doc = tomllib.loads(text.removeprefix("\ufeff"))  # a BOM, as Windows editors write
    except tomllib.TOMLDecodeError as exc:
        raise KingenError(f"malformed TOML: {exc}", file=file) from None
    except RecursionError:
        raise KingenError(f"nested too deeply (more than {MAX_DEPTH} levels of arrays or "
                          "tables)", file=file) from None
    # Iteratively, so that the check itself cannot run out of stack.
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, dict):
            items: Iterable[tuple[str | int, Any]] = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            if isinstance(value, int) and not isinstance(value, bool) and abs(
                    value) > MAX_INTEGER:
                raise KingenError(f"integer too large (at most {MAX_INTEGER} in size)",
                                  file=file, field=where or None, value=_digits(value))
            continue
        if depth >= MAX_DEPTH:
            raise KingenError(f"nested too deeply (more than {MAX_DEPTH} levels of arrays or "
                              "tables)", file=file, field=where or None)
        for key, item in items:
            stack.append((item, join(where, key), depth + 1))
    return doc


class _Huge:
    """A huge integer as it is named in a message: ``str`` of the integer itself is slow
    and refused past 4300 digits."""

    def __init__(self, value: int) -> None:
        self.text = f"{'-' if value < 0 else ''}<integer of {value.bit_length()} bits>"

    def __str__(self) -> str:
        return self.text


def _digits(value: int) -> _Huge:
    return _Huge(value)


class Fields:
    """Type-checked reads of the fields of one parsed file.

    Every reader takes the table, the key and ``where`` (the path of the table, ``""`` at the
    top) and raises :class:`KingenError` naming ``file``, the field's full path and its value.

    Parameters
    ----------
    file
        The file being read (a path, or a name such as ``<config>``).
    """

    def __init__(self, file: str) -> None:
        self.file = file

    def error(self, message: str, field: str | None = None, value: Any = None) -> KingenError:
        """A :class:`KingenError` in this file."""
        return KingenError(message, file=self.file, field=field, value=value)

    # -- structure
    def keys(self, table: dict, allowed: Iterable[str], where: str) -> None:
        """Refuse keys outside ``allowed``."""
        allowed = list(allowed)
        for key in table:
            if key not in allowed:
                raise self.error(f"unknown field (known: {', '.join(sorted(allowed))})",
                                 join(where, key))

    def table(self, t: dict, key: str, where: str = "", *, required: bool = False) -> dict:
        """A sub-table; ``{}`` when absent and not required."""
        value = t.get(key)
        name = join(where, key)
        if value is None:
            if required:
                raise self.error("missing table", name)
            return {}
        if not isinstance(value, dict):
            raise self.error("must be a table", name, value)
        return value

    def array(self, t: dict, key: str, where: str = "", *, required: bool = False,
              nonempty: bool = False, tables: bool = False) -> list:
        """An array (``[...]`` or ``[[key]]`` entries); ``[]`` when absent and not required."""
        value = t.get(key)
        name = join(where, key)
        if value is None:
            if required:
                raise self.error("missing", name)
            return []
        what = "an array of tables" if tables else "an array"
        if not isinstance(value, list):
            raise self.error(f"must be {what}", name, value)
        if nonempty and not value:
            raise self.error(f"must be a non-empty {what[3:]}", name, value)
        if tables:
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise self.error("must be a table", join(name, i), item)
        return value

    # -- scalars
    def number(self, t: dict, key: str | int, where: str = "", default: Any = MISSING, *,
               gt: float | None = None, ge: float | None = None, le: float | None = None,
               lt: float | None = None, factor: float = 1.0, unit: str = "") -> float:
        """A finite number in range, multiplied by ``factor`` (a unit conversion).

        ``t`` may be a list and ``key`` an index. The range applies to the value as written;
        the converted value must still be finite (and non-zero where ``gt`` is 0), else the
        error says that the conversion overflowed.
        """
        value = t[key] if isinstance(key, int) else t.get(key, default)
        name = join(where, key)
        if value is MISSING:
            raise self.error("missing", name)
        return self.check_number(value, name, gt=gt, ge=ge, le=le, lt=lt, factor=factor,
                                 unit=unit)

    def check_number(self, value: Any, name: str, *, gt: float | None = None,
                     ge: float | None = None, le: float | None = None, lt: float | None = None,
                     factor: float = 1.0, unit: str = "") -> float:
        """:meth:`number` for a value already taken out of its table."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error("must be a number", name, value)
        if isinstance(value, int) and abs(value) > MAX_INTEGER:
            raise self.error(f"integer too large (at most {MAX_INTEGER} in size)", name,
                             _digits(value))
        x = float(value)
        if not math.isfinite(x):
            raise self.error("must be finite (not inf or nan)", name, value)
        for bound, bad, sign in ((gt, x <= (gt or 0.0), ">"), (ge, x < (ge or 0.0), ">="),
                                 (le, x > (le or 0.0), "<="), (lt, x >= (lt or 0.0), "<")):
            if bound is not None and bad:
                raise self.error(f"must be {sign} {bound:g}", name, value)
        y = x * factor
        if not math.isfinite(y) or (x != 0.0 and y == 0.0 and gt is not None):
            what = "overflows" if not math.isfinite(y) else "underflows to 0"
            raise self.error(f"{what} once converted to {unit or 'internal units'} "
                             f"(x {factor:g})", name, value)
        return y

    def integer(self, t: dict, key: str, where: str = "", default: Any = MISSING, *,
                ge: int | None = None, le: int | None = None) -> int:
        """An integer (``5``, not ``5.0``) in range."""
        value = t.get(key, default)
        name = join(where, key)
        if value is MISSING:
            raise self.error("missing", name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error("must be an integer", name, value)
        if abs(value) > MAX_INTEGER:
            raise self.error(f"integer too large (at most {MAX_INTEGER} in size)", name,
                             _digits(value))
        if ge is not None and value < ge:
            raise self.error(f"must be >= {ge}", name, value)
        if le is not None and value > le:
            raise self.error(f"must be <= {le}", name, value)
        return int(value)

    def boolean(self, t: dict, key: str, where: str = "", default: Any = MISSING) -> bool:
        """``true`` or ``false`` (not a string or a number)."""
        value = t.get(key, default)
        name = join(where, key)
        if value is MISSING:
            raise self.error("missing", name)
        if not isinstance(value, bool):
            raise self.error("must be true or false", name, value)
        return value

    def string(self, t: dict, key: str, where: str = "", default: Any = MISSING) -> Any:
        """A non-empty string (``default`` when absent, which may be None)."""
        value = t.get(key, default)
        name = join(where, key)
        if value is MISSING:
            raise self.error("missing", name)
        if value is not default and (not isinstance(value, str) or not value.strip()):
            raise self.error("must be a non-empty string", name, value)
        if isinstance(value, str) and any(ord(ch) < 32 and ch not in "\t\n\r"
                                          for ch in value):
            raise self.error("must not hold control characters", name, value)
        return value

    def choice(self, t: dict, key: str, options: Iterable[str], where: str = "",
               default: Any = MISSING) -> str:
        """One of ``options``."""
        options = tuple(options)
        value = t.get(key, default)
        name = join(where, key)
        if value is MISSING:
            raise self.error("missing", name)
        if not isinstance(value, str) or value not in options:
            raise self.error(f"must be one of {', '.join(options)}", name, value)
        return value

    def numbers(self, t: dict, key: str, where: str = "", *, length: int | None = None,
                required: bool = True, **limits: Any) -> list[float]:
        """A non-empty array of numbers (of ``length`` when given), each as :meth:`number`;
        an element's error names it (``parameters.kon.bounds[1]``)."""
        name = join(where, key)
        value = t.get(key)
        if value is None and not required:
            return []
        want = f"an array of {length} numbers" if length else "a non-empty array of numbers"
        if not isinstance(value, list) or not value or (length and len(value) != length):
            raise self.error(f"must be {want}", name, value)
        return [self.number(value, i, name, **limits) for i in range(len(value))]
