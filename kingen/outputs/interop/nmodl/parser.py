"""A parser for the subset of NMODL that kinetic synapse and channel files use.

The tree it builds is data: declarations (``PARAMETER``, ``ASSIGNED``, ``STATE``), the
``NEURON`` block's names, and the statements of ``KINETIC``, ``INITIAL``, ``BREAKPOINT``,
``PROCEDURE`` and ``FUNCTION`` blocks with their expressions. Nothing is evaluated here.
Statements outside that subset (``if``, ``TABLE``, ``COMPARTMENT``, ...) are kept as
:class:`Other` with their line, so that a reader can name them when they matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kingen.errors import KingenError
from kingen.outputs.interop.nmodl.lexer import Token, tokenize

# ----------------------------------------------------------------------------- tree


@dataclass(frozen=True)
class Num:
    value: float
    line: int


@dataclass(frozen=True)
class Name:
    name: str
    line: int


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple
    line: int


@dataclass(frozen=True)
class Bin:
    op: str
    a: object
    b: object
    line: int


@dataclass(frozen=True)
class Neg:
    a: object
    line: int


@dataclass(frozen=True)
class Assign:
    target: str
    expr: object
    line: int


@dataclass(frozen=True)
class Reaction:
    """``~ lhs <-> rhs (kf, kb)``; each side a list of (stoichiometry, state)."""

    lhs: tuple
    rhs: tuple
    op: str
    kf: object
    kb: object | None
    line: int


@dataclass(frozen=True)
class Conserve:
    names: tuple
    total: object
    line: int


@dataclass(frozen=True)
class CallStmt:
    name: str
    line: int


@dataclass(frozen=True)
class Solve:
    block: str
    method: str
    line: int


@dataclass(frozen=True)
class Other:
    """A statement outside the subset (``if``, ``TABLE``, ...): its first word and line."""

    word: str
    line: int


@dataclass(frozen=True)
class Decl:
    """A declared variable: ``name = value (unit) <lo, hi>``."""

    name: str
    value: float | None
    unit: str | None
    line: int


@dataclass(frozen=True)
class Block:
    kind: str
    name: str
    statements: list
    line: int


@dataclass
class ModFile:
    """What an NMODL file declares and does."""

    path: str
    title: str = ""
    mechanism: str = ""
    kind: str = ""  # POINT_PROCESS, SUFFIX or ARTIFICIAL_CELL
    range: list[str] = field(default_factory=list)
    pointer: list[str] = field(default_factory=list)
    globals: list[str] = field(default_factory=list)
    currents: list[str] = field(default_factory=list)
    parameters: dict[str, Decl] = field(default_factory=dict)
    assigned: dict[str, Decl] = field(default_factory=dict)
    states: dict[str, Decl] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)

    def find(self, kind: str, name: str | None = None) -> list[Block]:
        """The blocks of one kind (and name)."""
        return [b for b in self.blocks if b.kind == kind and (name is None or b.name == name)]


# ----------------------------------------------------------------------------- parser

_DECL_BLOCKS = ("PARAMETER", "ASSIGNED", "STATE", "CONSTANT")
_CODE_BLOCKS = ("INITIAL", "BREAKPOINT", "KINETIC", "DERIVATIVE", "PROCEDURE", "FUNCTION",
                "NET_RECEIVE", "LINEAR", "NONLINEAR", "BEFORE", "AFTER", "CONSTRUCTOR",
                "DESTRUCTOR", "DISCRETE", "PARTIAL", "FUNCTION_TABLE")
_SKIPPED_BLOCKS = ("UNITS", "INDEPENDENT")
_NAME_LISTS = {"RANGE": "range", "POINTER": "pointer", "BBCOREPOINTER": "pointer",
               "GLOBAL": "globals", "NONSPECIFIC_CURRENT": "currents",
               "ELECTRODE_CURRENT": "currents"}


def parse(text: str, path: str = "<nmodl>") -> ModFile:
    """Parse NMODL text into a :class:`ModFile`.

    Raises
    ------
    KingenError
        On a syntax error, naming the file and the line.

    Examples
    --------
    >>> mod = parse('''NEURON { POINT_PROCESS syn RANGE C }
    ... PARAMETER { kb = 0.5 (/ms) }
    ... STATE { A B }
    ... KINETIC kin { ~ A <-> B (kf*C, kb) }''')
    >>> mod.mechanism, list(mod.states), mod.parameters["kb"].unit
    ('syn', ['A', 'B'], '/ms')
    >>> mod.find("KINETIC")[0].statements[0].line
    4
    """
    return _Parser(text, path).file()


class _Parser:
    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path
        self.tokens = tokenize(text, path)
        self.i = 0

    # -- helpers
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def peek(self, k: int = 1) -> Token:
        return self.tokens[min(self.i + k, len(self.tokens) - 1)]

    def next(self) -> Token:
        t = self.tokens[self.i]
        if t.kind != "end":
            self.i += 1
        return t

    def error(self, message: str, line: int | None = None) -> KingenError:
        return KingenError(message, file=self.path,
                           field=f"line {self.tok.line if line is None else line}")

    def at(self, text: str) -> bool:
        return self.tok.kind in ("symbol", "name") and self.tok.text == text

    def expect(self, text: str, what: str = "") -> Token:
        if not self.at(text):
            got = self.tok.text or "end of file"
            raise self.error(f"expected '{text}'{what}, found '{got}'")
        return self.next()

    def name(self, what: str = "a name") -> Token:
        if self.tok.kind != "name":
            raise self.error(f"expected {what}, found '{self.tok.text or 'end of file'}'")
        return self.next()

    def skip_braces(self) -> None:
        line = self.tok.line
        self.expect("{")
        depth = 1
        while depth:
            t = self.next()
            if t.kind == "end":
                raise self.error("'{' never closed", line)
            if t.text == "{" and t.kind == "symbol":
                depth += 1
            elif t.text == "}" and t.kind == "symbol":
                depth -= 1

    def skip_parens(self) -> None:
        line = self.tok.line
        self.expect("(")
        depth = 1
        while depth:
            t = self.next()
            if t.kind == "end":
                raise self.error("'(' never closed", line)
            if t.kind == "symbol" and t.text == "(":
                depth += 1
            elif t.kind == "symbol" and t.text == ")":
                depth -= 1

    def unit(self) -> str:
        """The raw text of a parenthesised unit, e.g. ``/mM /ms``."""
        start = self.expect("(").end
        depth = 1
        while True:
            t = self.next()
            if t.kind == "end":
                raise self.error("unit '(' never closed")
            if t.kind == "symbol" and t.text == "(":
                depth += 1
            elif t.kind == "symbol" and t.text == ")":
                depth -= 1
                if not depth:
                    return " ".join(self.text[start:t.start].split())

    def skip_line(self, line: int) -> None:
        while self.tok.kind != "end" and self.tok.line == line and not self.at("}"):
            if self.at("{"):
                self.skip_braces()
            else:
                self.next()

    # -- file
    def file(self) -> ModFile:
        mod = ModFile(self.path)
        while self.tok.kind != "end":
            t = self.tok
            if t.kind == "title":
                mod.title = self.next().text
            elif t.kind != "name":
                raise self.error(f"expected a block such as NEURON {{ ... }}, found '{t.text}'")
            elif t.text == "NEURON":
                self.next()
                self.neuron(mod)
            elif t.text in _SKIPPED_BLOCKS:
                self.next()
                self.skip_braces()
            elif t.text in _DECL_BLOCKS:
                self.next()
                decls = self.declarations()
                target = {"PARAMETER": mod.parameters, "CONSTANT": mod.parameters,
                          "ASSIGNED": mod.assigned, "STATE": mod.states}[t.text]
                for d in decls:
                    if target is mod.states and d.name in mod.states:
                        # NEURON refuses it too; kept, the scheme would lose a state in silence
                        first = mod.states[d.name].line
                        also = f" (also line {first})" if first != d.line else ""
                        raise self.error(f"state '{d.name}' is declared twice{also}", d.line)
                    target[d.name] = d
            elif t.text in _CODE_BLOCKS:
                mod.blocks.append(self.code_block())
            elif t.text in ("DEFINE", "INCLUDE", "UNITSON", "UNITSOFF", "ENDCOMMENT"):
                self.next()
                self.skip_line(t.line)
            else:
                raise self.error(f"unknown block '{t.text}'")
        return mod

    def neuron(self, mod: ModFile) -> None:
        self.expect("{")
        while not self.at("}"):
            t = self.name("a NEURON statement (SUFFIX, POINT_PROCESS, RANGE, ...)")
            if t.text in ("SUFFIX", "POINT_PROCESS", "ARTIFICIAL_CELL"):
                mod.kind = t.text
                mod.mechanism = self.name("the mechanism's name").text
            elif t.text in _NAME_LISTS:
                names = [self.name().text]
                while self.at(","):
                    self.next()
                    names.append(self.name().text)
                getattr(mod, _NAME_LISTS[t.text]).extend(names)
            elif t.text == "USEION":
                self.name("an ion")
                while self.tok.kind == "name" and self.tok.text in ("READ", "WRITE"):
                    kw = self.next().text
                    names = [self.name().text]
                    while self.at(","):
                        self.next()
                        names.append(self.name().text)
                    if kw == "WRITE":
                        mod.currents.extend(n for n in names if n.startswith("i"))
                if self.at("VALENCE"):
                    self.next()
                    if self.at("-"):
                        self.next()
                    self.next()
            else:
                self.skip_line(t.line)
            if self.tok.kind == "end":
                raise self.error("NEURON block never closed")
        self.next()

    def declarations(self) -> list[Decl]:
        self.expect("{")
        out = []
        while not self.at("}"):
            t = self.name("a declaration such as 'k1 = 1 (/ms)'")
            value, unit = None, None
            if self.at("["):
                self.next()
                self.next()
                self.expect("]")
            if self.at("="):
                self.next()
                sign = 1.0
                if self.at("-") or self.at("+"):
                    sign = -1.0 if self.next().text == "-" else 1.0
                if self.tok.kind != "number":
                    raise self.error(f"expected a number after '{t.text} ='")
                value = sign * float(self.next().text)
            if self.at("("):
                unit = self.unit()
            if self.at("<"):
                while not self.at(">"):
                    if self.tok.kind == "end":
                        raise self.error("'<' of a range never closed", t.line)
                    self.next()
                self.next()
            while self.tok.kind == "name" and self.tok.text in ("FROM", "TO", "START"):
                self.next()
                if self.at("-"):
                    self.next()
                self.next()
            out.append(Decl(t.text, value, unit, t.line))
            if self.tok.kind == "end":
                raise self.error("declaration block never closed")
        self.next()
        return out

    def code_block(self) -> Block:
        t = self.next()
        name = ""
        if t.text in ("KINETIC", "DERIVATIVE", "PROCEDURE", "FUNCTION", "LINEAR",
                      "NONLINEAR", "DISCRETE", "PARTIAL", "FUNCTION_TABLE", "BEFORE",
                      "AFTER"):
            name = self.name(f"the name of the {t.text} block").text
        if self.at("("):
            self.skip_parens()
        if self.at("("):  # the unit of a FUNCTION
            self.unit()
        if t.text == "FUNCTION_TABLE":
            return Block(t.text, name, [], t.line)
        return Block(t.text, name, self.statements(), t.line)

    # -- statements
    def statements(self) -> list:
        self.expect("{")
        out: list = []
        while not self.at("}"):
            if self.tok.kind == "end":
                raise self.error("block never closed")
            out.extend(self.statement())
        self.next()
        return out

    def statement(self) -> list:
        t = self.tok
        if self.at("~"):
            return [self.reaction()]
        if self.at("{"):
            return self.statements()
        if t.kind != "name":
            raise self.error(f"unexpected '{t.text}'")
        word = t.text
        if word == "CONSERVE":
            self.next()
            names = [self.name("a state").text]
            while self.at("+"):
                self.next()
                names.append(self.name("a state").text)
            self.expect("=")
            return [Conserve(tuple(names), self.expr(), t.line)]
        if word == "LOCAL":
            self.next()
            self.name()
            while self.at(","):
                self.next()
                self.name()
            return []
        if word == "SOLVE":
            self.next()
            block = self.name("the block to solve").text
            method = ""
            while self.tok.kind == "name" and self.tok.text in ("METHOD", "STEADYSTATE"):
                self.next()
                method = self.name("a method").text
            return [Solve(block, method, t.line)]
        if word in ("if", "while"):
            self.next()
            self.skip_parens()
            self.statements()
            while self.at("else"):
                self.next()
                if self.at("if"):
                    self.next()
                    self.skip_parens()
                self.statements()
            return [Other(word, t.line)]
        nxt = self.peek()
        if nxt.kind == "symbol" and nxt.text == "=" :
            self.next()
            self.next()
            return [Assign(word, self.expr(), t.line)]
        if nxt.kind == "symbol" and nxt.text == "(" and nxt.line == t.line:
            self.next()
            self.skip_parens()
            return [CallStmt(word, t.line)]
        self.next()
        self.skip_line(t.line)
        return [Other(word, t.line)]

    def reaction(self) -> Reaction:
        line = self.expect("~").line
        lhs = self.side()
        if self.at("<->"):
            op = self.next().text
            rhs = self.side()
            self.expect("(", " and the two rates (kf, kb)")
            kf = self.expr()
            self.expect(",", " between the forward and backward rate")
            kb = self.expr()
            self.expect(")")
            return Reaction(tuple(lhs), tuple(rhs), op, kf, kb, line)
        if self.at("<<") or self.at("->"):
            op = self.next().text
            self.expect("(")
            kf = self.expr()
            self.expect(")")
            return Reaction(tuple(lhs), (), op, kf, None, line)
        raise self.error("expected '<->' in the reaction")

    def side(self) -> list[tuple[int, str]]:
        out = []
        while True:
            coef = 1
            if self.tok.kind == "number":
                coef = int(float(self.next().text))
            out.append((coef, self.name("a state").text))
            if not self.at("+"):
                return out
            self.next()

    # -- expressions
    def expr(self) -> object:
        return self.binary(0)

    _LEVELS = (("||",), ("&&",), ("<", ">", "<=", ">=", "==", "!="), ("+", "-"), ("*", "/"))

    def binary(self, level: int) -> object:
        if level == len(self._LEVELS):
            return self.unary()
        a = self.binary(level + 1)
        while self.tok.kind == "symbol" and self.tok.text in self._LEVELS[level]:
            op = self.next()
            b = self.binary(level + 1)
            a = Bin(op.text, a, b, op.line)
        return a

    def unary(self) -> object:
        if self.at("-"):
            line = self.next().line
            return Neg(self.unary(), line)
        if self.at("+"):
            self.next()
            return self.unary()
        if self.at("!"):
            line = self.next().line
            return Call("!", (self.unary(),), line)
        return self.power()

    def power(self) -> object:
        base = self.primary()
        if self.at("^"):
            line = self.next().line
            return Bin("^", base, self.unary(), line)
        return base

    def primary(self) -> object:
        t = self.tok
        if t.kind == "number":
            self.next()
            if self.at("(") and self.tok.line == t.line:
                # a number with a unit, e.g. 1 (ms) or 0.062 (/mV): the unit is declarative
                # (no expression puts '(' right after a number)
                save = self.i
                try:
                    self.unit()
                except KingenError:
                    self.i = save
            return Num(float(t.text), t.line)
        if t.kind == "name":
            self.next()
            if self.at("("):
                self.next()
                args = []
                if not self.at(")"):
                    args.append(self.expr())
                    while self.at(","):
                        self.next()
                        args.append(self.expr())
                self.expect(")")
                return Call(t.text, tuple(args), t.line)
            if self.at("'"):
                self.next()
                return Name(t.text + "'", t.line)
            return Name(t.text, t.line)
        if self.at("("):
            self.next()
            inner = self.expr()
            self.expect(")")
            return inner
        raise self.error(f"expected a number, a name or '(' in an expression, found "
                         f"'{t.text or 'end of file'}'")
