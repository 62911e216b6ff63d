"""Schemes from and to other simulators: NEURON NMODL (``.mod``) and Myokit (``.mmt``).

One subpackage per format, each with a reader (a file to an
:class:`~kingen.outputs.interop.imported.ImportedScheme`) and a writer (an
:class:`~kingen.outputs.interop.exported.ExportModel` to text), found through two registries:
:data:`IMPORTERS` by file suffix and :data:`EXPORTERS` by format name. :func:`import_scheme`
and :func:`export_scheme` are the entry points (``kingen import``, ``kingen export --to``).

Examples
--------
>>> import kingen
>>> from kingen.outputs.interop import export_text
>>> text = export_text(kingen.Scheme.load("models/jonas_1993.toml"), "neuron")
>>> "POINT_PROCESS kingen_jonas_1993" in text
True
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kingen.base.files import atomic_write, check_replaceable
from kingen.errors import KingenError
from kingen.model.scheme import Scheme
from kingen.model.temperature import check_celsius
from kingen.outputs.interop.exported import ExportModel, export_model
from kingen.outputs.interop.imported import ImportedScheme, ImportProblems, scheme_text


@dataclass(frozen=True)
class Format:
    """One file format: its name, suffix, and the dotted names of its reader and writer."""

    name: str
    suffix: str
    description: str
    reader: str  # "module:function", (path, agonist=...) -> ImportedScheme
    writer: str  # "module:function", ExportModel -> str

    def load(self, which: str) -> Callable:
        module, func = (self.reader if which == "reader" else self.writer).split(":")
        return getattr(importlib.import_module(module), func)


FORMATS: dict[str, Format] = {
    "neuron": Format("neuron", ".mod", "NEURON NMODL POINT_PROCESS with a KINETIC block",
                     "kingen.outputs.interop.nmodl.reader:read_nmodl",
                     "kingen.outputs.interop.nmodl.writer:write_nmodl"),
    "myokit": Format("myokit", ".mmt", "Myokit model in myokit.lib.markov form",
                     "kingen.outputs.interop.myokit.reader:read_myokit",
                     "kingen.outputs.interop.myokit.writer:write_myokit"),
}
IMPORTERS: dict[str, Format] = {f.suffix: f for f in FORMATS.values()}
EXPORTERS: dict[str, Format] = dict(FORMATS)


def read_foreign(path: str | os.PathLike[str], *, agonist: str | None = None,
                 celsius: float | None = None) -> ImportedScheme:
    """What the reader of ``path``'s format finds in it (chosen by suffix); ``celsius`` is
    the temperature at which a ``.mod`` file's dependence on it other than a Q10 or an
    Arrhenius factor is evaluated."""
    suffix = Path(path).suffix.lower()
    fmt = IMPORTERS.get(suffix)
    if fmt is None:
        raise KingenError(f"unknown format (kingen imports {', '.join(IMPORTERS)})",
                          file=str(path), field="suffix", value=suffix or "(none)")
    if not Path(path).is_file():
        raise KingenError("file not found", file=str(path))
    options = {} if celsius is None else {"celsius": check_celsius(celsius, file=None,
                                                                   field="--celsius")}
    if options and fmt.name != "neuron":
        raise KingenError("applies to NEURON .mod files", field="--celsius", value=celsius)
    try:
        return fmt.load("reader")(path, agonist=agonist, **options)
    except RecursionError:  # the parsers recurse once per level of parentheses
        raise KingenError("expressions nest too deeply to read (hundreds of parentheses)",
                          file=str(path)) from None


def import_text(path: str | os.PathLike[str], *, agonist: str | None = None,
                celsius: float | None = None, left_out: list[str] | None = None) -> str:
    """Scheme-file text (TOML) of the scheme in a ``.mod`` or ``.mmt`` file.

    Raises
    ------
    KingenError
        On bad input, naming the file and line; :class:`ImportProblems` lists every
        construct the scheme format cannot hold, one line each.

    ``left_out``, when given, receives one line per piece of the file that does not feed
    the scheme and was left out (a ``NET_RECEIVE`` block, a magnesium block, ...).
    """
    imported = read_foreign(path, agonist=agonist, celsius=celsius)
    text = scheme_text(imported)
    if left_out is not None:
        left_out += imported.left_out
    return text


def import_scheme(path: str | os.PathLike[str], out: str | os.PathLike[str], *,
                  agonist: str | None = None, celsius: float | None = None,
                  left_out: list[str] | None = None) -> Path:
    """Write the scheme of a ``.mod`` or ``.mmt`` file as a kingen scheme file ``out``;
    ``celsius`` and ``left_out`` as :func:`import_text`.

    Examples
    --------
    >>> import tempfile
    >>> from kingen.model.scheme import Scheme
    >>> folder = Path(tempfile.mkdtemp())
    >>> mod = export_scheme(Scheme.load("models/jonas_1993.toml"), "neuron",
    ...                     folder / "jonas.mod")
    >>> Scheme.load(import_scheme(mod, folder / "jonas.toml")).n_states
    7
    """
    out = Path(out)
    check_replaceable(out, "-o", kind="imported scheme",
                      inputs={path: "the file being imported"})  # before any work
    text = import_text(path, agonist=agonist, celsius=celsius, left_out=left_out)
    _write(out, text)
    return out


def export_text(scheme: Scheme, to: str, params: np.ndarray | None = None, *,
                channels: float | None = None, provenance: list[str] | None = None,
                intervals: dict[str, tuple[float, float]] | None = None) -> str:
    """Text of ``scheme`` (at ``params``, internal units; None: its own values) in format
    ``to`` (``neuron`` or ``myokit``)."""
    fmt = EXPORTERS.get(to)
    if fmt is None:
        raise KingenError(f"unknown format (kingen exports to {', '.join(EXPORTERS)})",
                          field="--to", value=to)
    model = export_model(scheme, params, channels=channels, provenance=provenance,
                         intervals=intervals)
    return fmt.load("writer")(model)


def export_scheme(scheme: Scheme, to: str, out: str | os.PathLike[str], *,
                  inputs: Mapping[str | os.PathLike[str], str] | None = None,
                  **kwargs) -> Path:
    """Write ``scheme`` in format ``to`` to ``out``; keywords as :func:`export_text`.

    ``out`` is never the scheme's own file, nor one of ``inputs`` (path -> what it is),
    nor any file but an earlier export to the same format (see
    :func:`kingen.base.files.check_replaceable`).

    Examples
    --------
    >>> import tempfile
    >>> from kingen.model.scheme import Scheme
    >>> out = Path(tempfile.mkdtemp()) / "jonas.mmt"
    >>> export_scheme(Scheme.load("models/jonas_1993.toml"), "myokit", out).suffix
    '.mmt'
    >>> out.read_text().startswith("[[model]]")
    True
    """
    out = Path(out)
    if to in EXPORTERS:  # an unknown format is export_text's to say
        own = {} if scheme.path[:1] == "<" else {scheme.path: "the scheme being exported"}
        check_replaceable(out, "-o", kind=to, inputs={**own, **(inputs or {})})
    text = export_text(scheme, to, **kwargs)
    _write(out, text)
    return out


def _write(path: Path, text: str) -> None:
    """Write ``text`` (its callers have checked ``path``: check_replaceable)."""
    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    atomic_write(path, write)


__all__ = ["EXPORTERS", "FORMATS", "IMPORTERS", "ExportModel", "Format", "ImportProblems",
           "ImportedScheme", "export_scheme", "export_text", "import_scheme", "import_text",
           "read_foreign"]
