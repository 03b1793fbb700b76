"""Split SQL text into statements and fill ``${name}`` parameters, without parsing SQL.

Why a scanner rather than ``text.split(";")``: a ``;`` inside a string literal, a quoted identifier
or a comment does not end a statement, and the shell has to know whether the lines typed so far end
one. The same scan tells whether a ``${name}`` placeholder sits inside a string literal: there its
value is escaped the engine's way (``''`` for DuckDB and DataFusion, ``\\'`` for Spark, which reads
``'a''b'`` as two adjacent literals), so ``--param key="O'Brien"`` cannot break out of the literal.

Parameters are declared in comments, ``-- @param NAME = DEFAULT | description``; ``--param
NAME=VALUE`` on the command line overrides the default. A placeholder with neither is an error
(:class:`ParamError`), and so is a ``--param`` no placeholder uses (a typo would otherwise go unseen).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator

PARAM_DECL = re.compile(r"^\s*--\s*@param\s+([A-Za-z_]\w*)\s*(?:=\s*(.*?))?\s*(?:\|\s*(.*?))?\s*$")
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_]\w*)\}")

# scanner states
_CODE, _SQUOTE, _DQUOTE, _BACKTICK, _LINE_COMMENT, _BLOCK_COMMENT, _DOLLAR = range(7)
_COMMENTS = (_LINE_COMMENT, _BLOCK_COMMENT)
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_]\w*)?\$")


class ParamError(ValueError):
    """A placeholder without a value, or a value for no placeholder."""


@dataclass(frozen=True)
class Statement:
    """One statement: ``text`` starts at its first code character (leading blanks and comments
    dropped) and has no trailing ``;``; ``line`` is the 1-based line of that character."""

    text: str
    line: int

    def padded(self) -> str:
        """The text preceded by ``line - 1`` newlines, so that the line numbers engines put in their
        errors (DuckDB ``LINE n``, Spark ``line n``, DataFusion ``Line: n``) are the file's."""
        return "\n" * (self.line - 1) + self.text


@dataclass(frozen=True)
class Param:
    name: str
    default: str | None
    description: str


@dataclass(frozen=True)
class _Span:
    state: int
    start: int
    end: int
    closed: bool = True   # False: a string/identifier/comment still open at the end of the text


def _spans(text: str, backslash_escapes: bool) -> Iterator[_Span]:
    """Maximal runs of one scanner state over ``text``: code (a lone ``;`` is a run of its own),
    string literals, quoted identifiers, comments, dollar-quoted strings."""
    i, n = 0, len(text)
    while i < n:
        c, start = text[i], i
        if c == "'":
            i, closed = i + 1, False
            while i < n:
                if backslash_escapes and text[i] == "\\":
                    i += 2
                elif text[i] == "'" and text.startswith("''", i):
                    i += 2
                elif text[i] == "'":
                    i, closed = i + 1, True
                    break
                else:
                    i += 1
            yield _Span(_SQUOTE, start, min(i, n), closed)
        elif c in "\"`":
            i, closed = i + 1, False
            while i < n:
                if text.startswith(c * 2, i):
                    i += 2
                elif text[i] == c:
                    i, closed = i + 1, True
                    break
                else:
                    i += 1
            yield _Span(_DQUOTE if c == '"' else _BACKTICK, start, min(i, n), closed)
        elif text.startswith("--", i):
            end = text.find("\n", i)
            i = n if end == -1 else end
            yield _Span(_LINE_COMMENT, start, i)
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            yield _Span(_BLOCK_COMMENT, start, i, depth == 0)
        elif c == "$" and not text.startswith("${", i) and (m := _DOLLAR_TAG.match(text, i)):
            tag = m.group(0)
            end = text.find(tag, m.end())
            i = n if end == -1 else end + len(tag)
            yield _Span(_DOLLAR, start, i, end != -1)
        elif c == ";":
            i += 1
            yield _Span(_CODE, start, i)
        else:
            i += 1
            while i < n and text[i] not in "'\"`$-/;":
                i += 1
            yield _Span(_CODE, start, i)


def split_statements(text: str, *, backslash_escapes: bool = False) -> tuple[list[Statement], str]:
    """The complete (``;``-terminated) statements of ``text`` and the rest after the last ``;``.

    Statements made only of blanks and comments are dropped. The rest is what the shell keeps
    waiting on; a file's rest, when it holds code, is its last statement (see :func:`statements_of`).
    """
    statements: list[Statement] = []
    begin, first_code = 0, None
    for span in _spans(text, backslash_escapes):
        chunk = text[span.start:span.end]
        if span.state == _CODE and chunk == ";":
            if first_code is not None:
                statements.append(_statement(text, first_code, span.start))
            begin, first_code = span.end, None
        elif span.state not in _COMMENTS and first_code is None and chunk.strip():
            first_code = span.start + len(chunk) - len(chunk.lstrip())
    return statements, text[begin:]


def _statement(text: str, start: int, end: int) -> Statement:
    return Statement(text[start:end].rstrip(), text.count("\n", 0, start) + 1)


def _first_code(text: str, backslash_escapes: bool) -> int | None:
    for span in _spans(text, backslash_escapes):
        chunk = text[span.start:span.end]
        if span.state not in _COMMENTS and chunk.strip():
            return span.start + len(chunk) - len(chunk.lstrip())
    return None


def has_code(text: str, *, backslash_escapes: bool = False) -> bool:
    """True when ``text`` holds anything but blanks and comments."""
    return _first_code(text, backslash_escapes) is not None


def statements_of(text: str, *, backslash_escapes: bool = False) -> list[Statement]:
    """Every statement of a script: the ``;``-terminated ones and a last one without ``;``."""
    statements, rest = split_statements(text, backslash_escapes=backslash_escapes)
    first = _first_code(rest, backslash_escapes)
    if first is not None:
        offset = len(text) - len(rest)
        statements.append(_statement(text, offset + first, len(text)))
    return statements


# ---- parameters --------------------------------------------------------------------------------------
def declared_params(text: str) -> list[Param]:
    """``-- @param NAME = DEFAULT | description`` lines, in order (no ``= DEFAULT``: required)."""
    params: dict[str, Param] = {}
    for line in text.splitlines():
        m = PARAM_DECL.match(line)
        if m:
            name, default, description = m.group(1), m.group(2), m.group(3) or ""
            params[name] = Param(name, default if default not in (None, "") else None, description)
    return list(params.values())


def placeholders(text: str, *, backslash_escapes: bool = False) -> list[str]:
    """Names of the ``${name}`` placeholders outside comments, first use first."""
    seen: dict[str, None] = {}
    for span in _spans(text, backslash_escapes):
        if span.state in (_CODE, _SQUOTE, _DQUOTE, _BACKTICK):
            for m in PLACEHOLDER.finditer(text, span.start, span.end):
                seen.setdefault(m.group(1))
    return list(seen)


def substitute(text: str, values: dict[str, str], *, escape_literal: Callable[[str], str],
               backslash_escapes: bool = False) -> str:
    """``text`` with every ``${name}`` outside comments replaced by ``values[name]``: escaped with
    ``escape_literal`` inside a single-quoted string, verbatim elsewhere. Raises :class:`ParamError`
    when a placeholder has no value."""
    out: list[str] = []
    for span in _spans(text, backslash_escapes):
        chunk = text[span.start:span.end]
        if span.state in (_CODE, _SQUOTE, _DQUOTE, _BACKTICK):
            escape = escape_literal if span.state == _SQUOTE else (lambda v: v)

            def fill(m: re.Match) -> str:
                name = m.group(1)
                if name not in values:
                    raise ParamError(f"the query needs a value for ${{{name}}}: add --param {name}=VALUE")
                return escape(values[name])

            chunk = PLACEHOLDER.sub(fill, chunk)
        out.append(chunk)
    return "".join(out)


def resolve_params(text: str, given: dict[str, str], *, backslash_escapes: bool = False) -> dict[str, str]:
    """Values for the placeholders of ``text``: ``given`` over the declared defaults. Raises
    :class:`ParamError` naming a missing value or a given name no placeholder uses."""
    used = placeholders(text, backslash_escapes=backslash_escapes)
    unused = sorted(set(given) - set(used))
    if unused:
        hint = f" (it uses: {', '.join(used)})" if used else " (it has no ${name} placeholders)"
        raise ParamError(f"--param {', '.join(unused)}: not used by the query{hint}")
    values = {p.name: p.default for p in declared_params(text) if p.default is not None}
    values.update(given)
    missing = [name for name in used if name not in values]
    if missing:
        raise ParamError("the query needs " + ", ".join(f"--param {n}=VALUE" for n in missing))
    return values


def parse_param(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (an argparse type helper: raises ValueError with a readable message)."""
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_]\w*", name.strip()):
        raise ValueError(f"{text!r} is not NAME=VALUE")
    return name.strip(), value


def pending(text: str, *, backslash_escapes: bool = False) -> bool:
    """True when ``text`` (what the shell holds after the last ``;``) still matters: it has code,
    or a string or comment is open. Blanks and complete comments can be dropped."""
    last = None
    for last in _spans(text, backslash_escapes):
        pass
    return has_code(text, backslash_escapes=backslash_escapes) or (last is not None and not last.closed)
