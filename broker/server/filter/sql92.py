"""SQL92 message selectors: tokenizer and recursive-descent parser (Apache RocketMQ 4.9's grammar).

The language is the one Apache's ``SelectorParser.jj`` accepts, nothing more, so an expression that
works here works on an Apache broker and the other way round::

    selector   := or
    or         := and ( OR and )*
    and        := equality ( AND equality )*
    equality   := comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
    comparison := unary ( ('>'|'>='|'<'|'<=') unary | [NOT] BETWEEN unary AND unary
                          | [NOT] IN '(' string (',' string)* ')' )*
    unary      := '+' unary | '-' unary | NOT unary | primary
    primary    := literal | identifier | '(' or ')'
    literal    := 'string' | integer | decimal | TRUE | FALSE | NULL

Keywords are case-insensitive; identifiers are ``[a-zA-Z_$][a-zA-Z0-9_$]*`` (no dots); strings are
single-quoted with ``''`` for a quote; integers may end in ``L``; ``--`` line comments and ``/* */``
block comments are skipped. Note that NOT binds tighter than comparisons, as in Apache:
``NOT a = 1`` is ``(NOT a) = 1``; write ``NOT (a = 1)``.

Besides the grammar, Apache rejects some well-formed expressions while building them (``a > 'x'``,
``a = NULL``, ``a BETWEEN 5 AND 1``, a bare number as the whole selector, ``0.0`` as a literal…);
those are rejected here too. Every error is a :class:`SelectorError` naming what is wrong and the
line and column where it is. :func:`compile_selector` caches results (and errors) per text.

One limit Apache does not have (its bound is the JVM stack): more than :data:`MAX_NESTING`
parentheses or prefix operators inside one another are refused, so parsing and evaluating never
exhaust Python's recursion limit; so is a compiled tree deeper than :data:`MAX_DEPTH` (reachable only
with chains such as ``a = b = c = …``). Chains of AND/OR are one level, whatever their length.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from broker.server.filter.expressions import (
    And,
    BooleanCast,
    Compare,
    Constant,
    Equal,
    Expression,
    In,
    Negate,
    Not,
    Or,
    Property,
    Selector,
)
from broker.server.filter.java_values import (
    LONG_MAX,
    LONG_MIN,
    INT_MAX,
    INT_MIN,
    EvaluationError,
    JInt,
    JLong,
    java_compare,
    to_java_string,
)

KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})
CACHE_SIZE = 256  # Apache keeps 100 parsed selectors; a few more cost nothing
# Parsing and evaluating recurse: bounds keep a pathological selector a clear error, not a RecursionError
MAX_NESTING = 100  # parentheses and prefix operators (+, -, NOT) inside one another
MAX_DEPTH = 400  # levels of the compiled tree (a chain of ANDs or ORs is one level)


class SelectorError(ValueError):
    """An expression Apache's parser would refuse. ``line``/``column`` are 1-based; ``detail`` says
    what is wrong; ``str()`` is the full message with Apache's prefix."""

    def __init__(self, detail: str, line: int, column: int) -> None:
        self.detail = detail
        self.line = line
        self.column = column
        super().__init__(f"Invalid MessageSelector. {detail}")


@dataclass(frozen=True)
class Token:
    kind: str  # KEYWORD, ID, DECIMAL, FLOAT, STRING, OP, EOF
    text: str  # as written (a keyword upper-cased)
    line: int
    column: int

    def shown(self) -> str:
        return "<EOF>" if self.kind == "EOF" else f'"{self.text}"'


_BLANKS = " \t\n\r\f"
_ID = re.compile(r"[a-zA-Z_$][a-zA-Z0-9_$]*")
_DECIMAL = re.compile(r"(?:0|[1-9][0-9]*)[lL]?")
_FLOAT = re.compile(r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+")
_STRING = re.compile(r"'(?:''|[^'])*'")
_OPERATORS = ("<>", ">=", "<=", "=", ">", "<", "(", ")", ",", "+", "-")


class _Position:
    """Line/column of character offsets (1-based, as JavaCC reports them)."""

    def __init__(self, text: str) -> None:
        self.starts = [0]
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\r" and text[i + 1:i + 2] == "\n":
                i += 1
            if ch in "\r\n":
                self.starts.append(i + 1)
            i += 1

    def at(self, offset: int) -> tuple[int, int]:
        line = 0
        while line + 1 < len(self.starts) and self.starts[line + 1] <= offset:
            line += 1
        return line + 1, offset - self.starts[line] + 1


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text`` ending with EOF; a character no token starts with is an error."""
    pos = _Position(text)
    tokens: list[Token] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _BLANKS:
            i += 1
        if text.startswith("--", i):
            end = min((j for j in (text.find("\n", i), text.find("\r", i)) if j >= 0), default=-1)
            if end >= 0:  # a line comment needs its line end; without one the "-" is a minus sign
                i = end + 1
                continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                line, col = pos.at(i)
                raise SelectorError(f"Lexical error at line {line}, column {col}: the comment is not closed", line, col)
            i = end + 2
            continue
        line, col = pos.at(i)
        if i >= n:
            tokens.append(Token("EOF", "", line, col))
            return tokens
        ch = text[i]
        if ch == "'":
            m = _STRING.match(text, i)
            if m is None:
                raise SelectorError(f"Lexical error at line {line}, column {col}: the string literal is not "
                                    "closed with a single quote", line, col)
            tokens.append(Token("STRING", m.group(), line, col))
            i = m.end()
            continue
        number = max((m for m in (_DECIMAL.match(text, i), _FLOAT.match(text, i)) if m is not None),
                     key=lambda m: (m.end(), m.re is _DECIMAL), default=None)
        if number is not None:
            tokens.append(Token("DECIMAL" if number.re is _DECIMAL else "FLOAT", number.group(), line, col))
            i = number.end()
            continue
        m = _ID.match(text, i)
        if m is not None:
            word = m.group()
            upper = word.upper()
            tokens.append(Token("KEYWORD", upper, line, col) if upper in KEYWORDS else Token("ID", word, line, col))
            i = m.end()
            continue
        op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
        if op is None:
            raise SelectorError(f'Lexical error at line {line}, column {col}: unexpected character "{ch}" '
                                f"(U+{ord(ch):04X})", line, col)
        tokens.append(Token("OP", op, line, col))
        i += len(op)


# ---- building nodes: Apache's checks while creating expressions -----------------------------------------
class _BuildError(Exception):
    """A check failed while building a node; the parser adds the position."""


def _as_boolean(e: Expression) -> Expression:
    if e.boolean:
        return e
    if isinstance(e, Property):
        return BooleanCast(e)
    raise _BuildError(f"Expression will not result in a boolean value: {e}")


def _check_comparable(e: Expression) -> None:
    """Only numbers (and non-boolean expressions) may stand beside >, >=, <, <=."""
    if isinstance(e, Constant):
        if isinstance(e.value, (JInt, JLong, float)):
            return
        raise _BuildError(f"Value '{e}' cannot be compared.")
    if e.boolean:
        raise _BuildError(f"Value '{e}' cannot be compared.")


def _compare(left: Expression, op: str, right: Expression) -> Expression:
    _check_comparable(left)
    _check_comparable(right)
    return Compare(left, op, right)


def _equal(left: Expression, right: Expression) -> Expression:
    for side in (left, right):
        if isinstance(side, Constant) and side.value is None:
            raise _BuildError(f"'{side}' cannot be compared.")
    if isinstance(left, Constant) and isinstance(right, Constant) and left.boolean and not right.boolean:
        raise _BuildError(f"'{left}' cannot be compared with '{right}'")
    return Equal(left, right)


def _is_null(left: Expression) -> Expression:
    return Equal(left, Constant(None, boolean=True))


def _between(value: Expression, low: Expression, high: Expression) -> Expression:
    if isinstance(low, Constant) and isinstance(high, Constant):
        if low.value is None or high.value is None:
            raise _BuildError("Illegal values of between, values can not be null!")
        try:
            order = java_compare(high.value, low.value)
        except EvaluationError as exc:
            raise _BuildError(str(exc)) from None
        if order < 0:
            raise _BuildError(f"Illegal values of between, left value({to_java_string(low.value)}) must less than "
                              f"or equal to right value({to_java_string(high.value)})")
    return And(_compare(value, ">=", low), _compare(value, "<=", high))


def _not_between(value: Expression, low: Expression, high: Expression) -> Expression:
    return Or(_compare(value, "<", low), _compare(value, ">", high))


def _in(left: Expression, values: list[str], negated: bool) -> Expression:
    if not isinstance(left, Property):
        raise _BuildError(f"Expected a property for In expression, got: {left}")
    return In(left, values, negated)


def _decimal(text: str) -> Constant:
    digits = text[:-1] if text[-1] in "lL" else text
    value = int(digits)
    if not LONG_MIN <= value <= LONG_MAX:
        raise _BuildError(f'For input string: "{digits}" (beyond a 64-bit long)')
    return Constant(JInt(value) if INT_MIN <= value <= INT_MAX else JLong(value))


def _float(text: str) -> Constant:
    value = float(text)
    if value == float("inf"):
        raise _BuildError(f"{text} is greater than 1.7976931348623157E308")
    if value < 5e-324:  # Apache compares with Double.MIN_VALUE, the smallest positive double
        raise _BuildError(f"{text} is less than 4.9E-324")
    return Constant(value)


# ---- parser ----------------------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.i = 0
        self.nesting = 0

    def enter(self) -> None:
        """One more parenthesis or prefix operator around what follows."""
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            tok = self.tok
            raise SelectorError(f"the expression nests more than {MAX_NESTING} parentheses or prefix operators "
                                f"(at line {tok.line}, column {tok.column})", tok.line, tok.column)

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def peek(self, ahead: int = 1) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "EOF":
            self.i += 1
        return tok

    def is_(self, kind: str, text: str | None = None, tok: Token | None = None) -> bool:
        tok = tok or self.tok
        return tok.kind == kind and (text is None or tok.text == text)

    def fail(self, expected: str, tok: Token | None = None) -> SelectorError:
        tok = tok or self.tok
        return SelectorError(f"Encountered {tok.shown()} at line {tok.line}, column {tok.column}. "
                             f"Was expecting {expected}.", tok.line, tok.column)

    def build(self, at: Token, fn, *args) -> Expression:
        try:
            return fn(*args)
        except _BuildError as exc:
            raise SelectorError(f"{exc} (at line {at.line}, column {at.column})", at.line, at.column) from None

    def expect(self, kind: str, text: str, expected: str) -> Token:
        if not self.is_(kind, text):
            raise self.fail(expected)
        return self.next()

    # grammar
    def selector(self) -> Expression:
        start = self.tok
        e = self.or_()
        if self.tok.kind != "EOF":
            raise self.fail('one of AND, OR, "=", "<>", ">", ">=", "<", "<=", BETWEEN, IN, IS or the end')
        return self.build(start, _as_boolean, e)

    def or_(self) -> Expression:
        start = self.tok
        left = self.and_()
        while self.is_("KEYWORD", "OR"):
            self.next()
            right_start = self.tok
            right = self.and_()
            left = Or(self.build(start, _as_boolean, left), self.build(right_start, _as_boolean, right))
        return left

    def and_(self) -> Expression:
        start = self.tok
        left = self.equality()
        while self.is_("KEYWORD", "AND"):
            self.next()
            right_start = self.tok
            right = self.equality()
            left = And(self.build(start, _as_boolean, left), self.build(right_start, _as_boolean, right))
        return left

    def equality(self) -> Expression:
        left = self.comparison()
        while True:
            tok = self.tok
            if self.is_("OP", "=") or self.is_("OP", "<>"):
                self.next()
                right = self.comparison()
                left = self.build(tok, _equal, left, right)
                if tok.text == "<>":
                    left = Not(left)
            elif self.is_("KEYWORD", "IS"):
                self.next()
                if self.is_("KEYWORD", "NULL"):
                    self.next()
                    left = _is_null(left)
                else:
                    self.expect("KEYWORD", "NOT", "NULL or NOT NULL after IS")
                    self.expect("KEYWORD", "NULL", "NULL after IS NOT")
                    left = Not(_is_null(left))
            else:
                return left

    def comparison(self) -> Expression:
        left = self.unary()
        while True:
            tok = self.tok
            if tok.kind == "OP" and tok.text in (">", ">=", "<", "<="):
                self.next()
                left = self.build(tok, _compare, left, tok.text, self.unary())
            elif self.is_("KEYWORD", "BETWEEN") or (self.is_("KEYWORD", "NOT")
                                                     and self.is_("KEYWORD", "BETWEEN", self.peek())):
                negated = self.next().text == "NOT"
                if negated:
                    self.next()
                low = self.unary()
                self.expect("KEYWORD", "AND", "AND between the bounds of BETWEEN")
                high = self.unary()
                left = self.build(tok, _not_between if negated else _between, left, low, high)
            elif self.is_("KEYWORD", "IN") or (self.is_("KEYWORD", "NOT") and self.is_("KEYWORD", "IN", self.peek())):
                negated = self.next().text == "NOT"
                if negated:
                    self.next()
                self.expect("OP", "(", '"(" after IN')
                values = [self.string()]
                while self.is_("OP", ","):
                    self.next()
                    values.append(self.string())
                self.expect("OP", ")", '"," or ")" in the IN list')
                left = self.build(tok, _in, left, values, negated)
            else:
                return left

    def string(self) -> str:
        if self.tok.kind != "STRING":
            raise self.fail("a string literal (IN lists hold quoted strings only)")
        return self.next().text[1:-1].replace("''", "'")

    def unary(self) -> Expression:
        if not (self.is_("OP", "+") or self.is_("OP", "-") or self.is_("KEYWORD", "NOT")):
            return self.primary()
        op = self.next()
        self.enter()
        operand_start = self.tok
        operand = self.unary()
        self.nesting -= 1
        if op.text == "+":
            return operand
        if op.text == "-":
            return Negate(operand)
        return Not(self.build(operand_start, _as_boolean, operand))

    def primary(self) -> Expression:
        tok = self.tok
        if tok.kind == "STRING":
            return Constant(self.string())
        if tok.kind == "DECIMAL":
            self.next()
            return self.build(tok, _decimal, tok.text)
        if tok.kind == "FLOAT":
            self.next()
            return self.build(tok, _float, tok.text)
        if tok.kind == "KEYWORD" and tok.text in ("TRUE", "FALSE", "NULL"):
            self.next()
            return Constant({"TRUE": True, "FALSE": False, "NULL": None}[tok.text], boolean=True)
        if tok.kind == "ID":
            self.next()
            return Property(tok.text)
        if self.is_("OP", "("):
            self.next()
            self.enter()
            e = self.or_()
            self.expect("OP", ")", 'an operator or ")"')
            self.nesting -= 1
            return e
        raise self.fail('a literal, a property name, "(", "+", "-" or NOT')


def parse(text: str) -> Selector:
    """Compile ``text``; raises :class:`SelectorError`. Uncached: use :func:`compile_selector`."""
    if text is None or not text.strip():
        raise SelectorError("the expression is empty", 1, 1)
    root = _Parser(text).selector()
    depth = _depth(root)
    if depth > MAX_DEPTH:
        raise SelectorError(f"the expression is {depth} levels deep; at most {MAX_DEPTH} are supported", 1, 1)
    return Selector(text, root)


def _depth(root: Expression) -> int:
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.children())
    return deepest


_cache: OrderedDict[str, Selector | SelectorError] = OrderedDict()
_cache_lock = threading.Lock()


def compile_selector(text: str) -> Selector:
    """:func:`parse` with a bounded cache of results and errors: the pull path asks on every pull."""
    with _cache_lock:
        hit = _cache.get(text)
        if hit is not None:
            _cache.move_to_end(text)
    if hit is None:
        try:
            hit = parse(text)
        except SelectorError as exc:
            hit = exc
        with _cache_lock:
            _cache[text] = hit
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(hit, SelectorError):
        raise SelectorError(hit.detail, hit.line, hit.column)  # a fresh one: no traceback piles up
    return hit
