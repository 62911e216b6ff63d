"""The scheme files kingen ships, found the same way in a checkout and in an installed package.

The repository keeps one copy of them, in ``models/`` at its root (the folder the documentation and
the tests name). Building a wheel copies that folder into the package as
``kingen/bundled/models/`` (``setup.py``), so an installed kingen finds them there; a source
checkout or an editable install finds ``models/`` beside the package.
"""

from __future__ import annotations

from pathlib import Path

from kingen.errors import KingenError

DEFAULT_MODEL = "robert_howe_2003"  # the largest shipped scheme (16 states, 42 transitions)


def models_dir() -> Path | None:
    """The folder holding the shipped scheme files, or None when this install has none."""
    here = Path(__file__).resolve().parents[1]  # the package: kingen/model/ is one down
    for folder in (here / "bundled" / "models", here.parent / "models"):
        if folder.is_dir() and any(folder.glob("*.toml")):
            return folder
    return None


def shipped_models() -> list[str]:
    """Names (file stems) of the shipped schemes, sorted."""
    folder = models_dir()
    return sorted(p.stem for p in folder.glob("*.toml")) if folder else []


def shipped_scheme(spec: str | Path) -> Path | None:
    """The shipped scheme file that ``spec`` names, or None.

    ``spec`` names one when it is a shipped scheme's name, with or without ``.toml``
    (``jonas_1993``), or the repository's path to it, ``models/<name>.toml``, read from a folder
    outside the checkout. Any other path names none: a user's own file in a folder that does
    not exist must not become a shipped scheme in silence.

    Examples
    --------
    >>> from kingen.model.shipped import shipped_scheme
    >>> [shipped_scheme(s).name for s in ("jonas_1993", "models/jonas_1993.toml")]
    ['jonas_1993.toml', 'jonas_1993.toml']
    >>> shipped_scheme("my_lab/jonas_1993.toml") is None
    True
    """
    path = Path(str(spec))
    if path.is_absolute() or path.parent.as_posix() not in (".", "models"):
        return None
    name = path.name[:-5] if path.name.endswith(".toml") else path.name
    folder = models_dir()
    found = folder / f"{name}.toml" if folder is not None and name else None
    return found if found is not None and found.is_file() else None


def resolve_model(spec: str | Path | None = None) -> Path:
    """A scheme file from a path or a shipped scheme's name.

    ``spec`` is a path to a TOML file, or the name of a shipped scheme with or without
    ``.toml`` (``robert_howe_2003``); ``None`` means :data:`DEFAULT_MODEL`. A path that does
    not exist but names a shipped file (``models/jonas_1993.toml`` run from outside the
    checkout) resolves to the shipped copy.

    Raises
    ------
    KingenError
        When it is neither an existing file nor a shipped scheme.
    """
    text = str(spec) if spec is not None else DEFAULT_MODEL
    path = Path(text).expanduser()
    if path.is_file():
        return path
    folder = models_dir()
    name = path.name[:-5] if path.name.endswith(".toml") else path.name
    if folder is not None and (folder / f"{name}.toml").is_file():
        return folder / f"{name}.toml"
    names = shipped_models()
    known = f"shipped schemes: {', '.join(names)}" if names else "no shipped schemes found"
    raise KingenError(f"no such scheme file, nor a shipped scheme of that name ({known})",
                      field="model", value=text)
