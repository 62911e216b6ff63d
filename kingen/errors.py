"""The one exception type a user can cause, and how it prints."""

from __future__ import annotations

from typing import Any


class KingenError(Exception):
    """A problem the user can fix: a bad file, field or value.

    Prints as one line naming the file, the field and the value, then what is wrong,
    for example ``models/x.toml: transitions[3].to = 'C9': unknown state (states are C0, C1)``.

    Parameters
    ----------
    message
        What is wrong and, where possible, what to do about it.
    file
        The file the problem is in (a path or a name such as ``<config>``).
    field
        The field inside the file (dotted path, e.g. ``parameters.k1.bounds``).
    value
        The offending value; printed with ``repr`` for strings, ``str`` otherwise.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        field: str | None = None,
        value: Any = None,
    ) -> None:
        self.message = message
        self.file = None if file is None else str(file)
        self.field = field
        self.value = value
        super().__init__(self.format())

    def format(self) -> str:
        """The one-line message."""
        where = []
        if self.file is not None:
            where.append(self.file)
        if self.field is not None:
            field = self.field
            if self.value is not None:
                field = f"{field} = {_show(self.value)}"
            where.append(field)
        elif self.value is not None:
            where.append(_show(self.value))
        text = ": ".join(where + [self.message])
        return " ".join(text.split())  # always one line

    def __str__(self) -> str:
        return self.format()


def _show(value: Any, limit: int = 80) -> str:
    """A value as it is named in a message, cut to ``limit`` characters."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
