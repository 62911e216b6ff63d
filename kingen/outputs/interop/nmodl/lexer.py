"""Tokens of an NMODL file, each with its line number.

Comments (``:`` and ``?`` to the end of the line, ``COMMENT ... ENDCOMMENT``) and
``VERBATIM ... ENDVERBATIM`` C code are dropped; ``TITLE`` keeps the rest of its line as one
token. Nothing read is ever evaluated: the parser
(:mod:`kingen.outputs.interop.nmodl.parser`) builds a tree of these tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kingen.errors import KingenError

_SYMBOLS = ("<->", "<<", "->", "<=", ">=", "==", "!=", "&&", "||",
            "~", "{", "}", "(", ")", "[", "]", ",", "=", "+", "-", "*", "/", "^", "<", ">",
            "!", "'", "@")
_NUMBER = re.compile(r"(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPACE = re.compile(r"[ \t\r\f\v]+")


@dataclass(frozen=True)
class Token:
    """One token: ``kind`` is ``name``, ``number``, ``symbol``, ``title`` or ``end``."""

    kind: str
    text: str
    line: int
    start: int  # offset of the token in the file's text
    end: int


def tokenize(text: str, path: str = "<nmodl>") -> list[Token]:
    """The tokens of NMODL ``text``, ending with one ``end`` token.

    Raises
    ------
    KingenError
        On a character NMODL does not use, or an unclosed comment block, naming the line.

    Examples
    --------
    >>> [t.text for t in tokenize("~ C0 <-> C1 (Rb*C, Ru1) : binding")]
    ['~', 'C0', '<->', 'C1', '(', 'Rb', '*', 'C', ',', 'Ru1', ')', '']
    """
    tokens: list[Token] = []
    pos, line, n = 0, 1, len(text)
    while pos < n:
        ch = text[pos]
        if ch == "\n":
            line += 1
            pos += 1
            continue
        m = _SPACE.match(text, pos)
        if m:
            pos = m.end()
            continue
        if ch in ":?":
            nl = text.find("\n", pos)
            pos = n if nl < 0 else nl
            continue
        if ch == '"':
            close = text.find('"', pos + 1)
            if close < 0 or "\n" in text[pos:close]:
                raise KingenError("unclosed string", file=path, field=f"line {line}")
            tokens.append(Token("string", text[pos + 1:close], line, pos, close + 1))
            pos = close + 1
            continue
        m = _NAME.match(text, pos)
        if m:
            word = m.group()
            if word in ("COMMENT", "VERBATIM"):
                closing = "END" + word
                close = re.compile(rf"\b{closing}\b").search(text, m.end())
                if close is None:
                    raise KingenError(f"{word} without {closing}", file=path,
                                      field=f"line {line}")
                line += text.count("\n", pos, close.end())
                pos = close.end()
                continue
            if word == "TITLE":
                nl = text.find("\n", m.end())
                end = n if nl < 0 else nl
                tokens.append(Token("title", text[m.end():end].strip(), line, pos, end))
                pos = end
                continue
            tokens.append(Token("name", word, line, pos, m.end()))
            pos = m.end()
            continue
        m = _NUMBER.match(text, pos)
        if m:
            tokens.append(Token("number", m.group(), line, pos, m.end()))
            pos = m.end()
            continue
        for sym in _SYMBOLS:
            if text.startswith(sym, pos):
                tokens.append(Token("symbol", sym, line, pos, pos + len(sym)))
                pos += len(sym)
                break
        else:
            raise KingenError(f"unexpected character {ch!r}", file=path, field=f"line {line}")
    tokens.append(Token("end", "", line, n, n))
    return tokens
