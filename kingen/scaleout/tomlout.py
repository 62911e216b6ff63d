"""TOML text from what :func:`kingen.model.fields.loads_toml` read: the batch writes each fit's
configuration as a file of its own (its run file stores that text, and ``kingen resume``
reads it back).

Only the value types TOML reading gives are written: tables, arrays, strings, integers,
floats, booleans and dates. Tables at the top become ``[table]`` sections, arrays of tables
``[[array]]`` sections; deeper tables are written inline.

>>> text = dumps_toml({"model": "m.toml", "seed": 3, "ga": {"population": 8},
...                    "protocols": [{"protocol": "deactivation", "mask": [[0, 1.5]]}]})
>>> print(text, end="")
model = "m.toml"
seed = 3
<BLANKLINE>
[ga]
population = 8
<BLANKLINE>
[[protocols]]
protocol = "deactivation"
mask = [[0, 1.5]]
>>> from kingen.model.fields import loads_toml
>>> loads_toml(text, "<x>")["protocols"][0]["mask"]
[[0, 1.5]]
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from typing import Any

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE.match(key) else json.dumps(key, ensure_ascii=False)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        # JSON's escapes are a subset of TOML's basic-string escapes
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(str(k))} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def dumps_toml(doc: dict[str, Any]) -> str:
    """``doc`` as TOML text that reads back to an equal dict."""
    lines: list[str] = []
    for k, v in doc.items():
        if not isinstance(v, dict) and not _is_table_array(v):
            lines.append(f"{_key(k)} = {_value(v)}")
    for k, v in doc.items():
        if isinstance(v, dict):
            lines += ["", f"[{_key(k)}]"]
            lines += [f"{_key(str(kk))} = {_value(vv)}" for kk, vv in v.items()]
        elif _is_table_array(v):
            for item in v:
                lines += ["", f"[[{_key(k)}]]"]
                lines += [f"{_key(str(kk))} = {_value(vv)}" for kk, vv in item.items()]
    return "\n".join(lines).lstrip("\n") + "\n"
