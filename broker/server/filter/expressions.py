"""The compiled form of a SQL92 message selector and how it evaluates over message properties.

The node types and their semantics follow Apache RocketMQ 4.9's filter module (itself taken from
ActiveMQ's selector), because consumers written against Apache expect the same messages:

* properties are looked up by exact name in the message's properties (``TAGS``, ``KEYS`` and every
  user property); a missing one is ``null``;
* three-valued logic: a comparison with ``null`` is ``null``; ``AND``/``OR`` follow SQL's truth
  tables; ``NOT null`` is ``null``; a message matches only when the result is exactly TRUE;
* equality: ``null = x`` is ``null`` but ``x = null-property`` is FALSE (Apache's asymmetry) and two
  missing properties are equal; a string property compared with a number is converted with Java's
  ``Integer.valueOf``/``Long.valueOf``/``Double.valueOf`` of the literal's type;
* ``<``, ``>``…: two strings are compared as doubles; anything that does not convert is an
  evaluation error, which makes the *whole* selector not match that message (Apache catches it per
  message);
* a bare property used as a condition is a boolean cast: FALSE for any string, so it never matches.

Evaluation is a tree walk over small classes; compiling happens once per expression text (see
:mod:`broker.server.filter.sql92`), so the per-message cost is a few dict lookups and comparisons.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.server.filter.java_values import (
    EvaluationError,
    JInt,
    JLong,
    Value,
    java_compare,
    java_equals,
    parse_double,
    to_text,
    wrap_int,
)

Properties = Mapping[str, str]


class Expression:
    """A node. ``boolean`` says whether Apache types it as a BooleanExpression (a condition)."""

    boolean = False

    def evaluate(self, props: Properties) -> Any:
        raise NotImplementedError

    def children(self) -> tuple[Expression, ...]:
        return tuple(v for v in (getattr(self, name, None) for name in ("left", "right", "operand", "prop"))
                     if isinstance(v, Expression))


class Constant(Expression):
    def __init__(self, value: Value, boolean: bool = False) -> None:
        self.value = value
        self.boolean = boolean  # TRUE, FALSE and NULL are boolean constants

    def evaluate(self, props: Properties) -> Value:
        return self.value

    def __str__(self) -> str:
        return to_text(self.value)


class Property(Expression):
    def __init__(self, name: str) -> None:
        self.name = name

    def evaluate(self, props: Properties) -> str | None:
        return props.get(self.name)

    def __str__(self) -> str:
        return self.name


class Negate(Expression):
    """Unary minus: numbers only; a string property negates to null."""

    def __init__(self, operand: Expression) -> None:
        self.operand = operand

    def evaluate(self, props: Properties) -> Value:
        return negate(self.operand.evaluate(props))

    def __str__(self) -> str:
        return f"(- {self.operand})"


def negate(value: Value) -> Value:
    if isinstance(value, JInt):
        return JInt(wrap_int(-value, 32))
    if isinstance(value, JLong):
        return JLong(wrap_int(-value, 64))
    if isinstance(value, float):
        return -value
    return None


class Not(Expression):
    boolean = True

    def __init__(self, operand: Expression) -> None:
        self.operand = operand

    def evaluate(self, props: Properties) -> bool | None:
        value = self.operand.evaluate(props)
        return None if value is None else not value

    def __str__(self) -> str:
        return f"(NOT {self.operand})"


class BooleanCast(Expression):
    """A bare property where a condition is expected: TRUE only for a Boolean, which a property
    (always a string) never is."""

    boolean = True

    def __init__(self, operand: Expression) -> None:
        self.operand = operand

    def evaluate(self, props: Properties) -> bool | None:
        value = self.operand.evaluate(props)
        if value is None:
            return None
        return value if isinstance(value, bool) else False

    def __str__(self) -> str:
        return str(self.operand)


class In(Expression):
    boolean = True

    def __init__(self, prop: Property, values: list[str], negated: bool) -> None:
        self.prop = prop
        self.values = list(values)
        self.value_set = frozenset(values)
        self.negated = negated

    def evaluate(self, props: Properties) -> bool | None:
        value = self.prop.evaluate(props)
        if value is None:
            return None
        return (value in self.value_set) != self.negated

    def __str__(self) -> str:
        items = ", ".join(self.values)
        return f"{self.prop} {'NOT IN' if self.negated else 'IN'} ( {items} )"


class Equal(Expression):
    boolean = True

    def __init__(self, left: Expression, right: Expression) -> None:
        self.left, self.right = left, right

    def evaluate(self, props: Properties) -> bool | None:
        lv = self.left.evaluate(props)
        rv = self.right.evaluate(props)
        if (lv is None) != (rv is None):
            return None if lv is None else False
        if lv is None or java_equals(lv, rv):
            return True
        return java_compare(lv, rv) == 0

    def __str__(self) -> str:
        return f"({self.left} == {self.right})"


_ORDER = {">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0}


class Compare(Expression):
    """``>``, ``>=``, ``<``, ``<=``."""

    boolean = True

    def __init__(self, left: Expression, op: str, right: Expression) -> None:
        self.left, self.op, self.right = left, op, right
        self._test = _ORDER[op]

    def evaluate(self, props: Properties) -> bool | None:
        lv = self.left.evaluate(props)
        if lv is None:
            return None
        rv = self.right.evaluate(props)
        if rv is None:
            return None
        if isinstance(lv, str) and isinstance(rv, str):  # strings only compare as numbers
            try:
                lv, rv = parse_double(lv), parse_double(rv)
            except EvaluationError:
                raise EvaluationError(f"It's illegal to compare string by '>=', '>', '<', '<='. "
                                      f"lv={lv}, rv={rv}") from None
        return self._test(java_compare(lv, rv))

    def __str__(self) -> str:
        return f"({self.left} {self.op} {self.right})"


class _Logic(Expression):
    """AND / OR over two or more operands. Apache nests ``a AND b AND c`` as ``((a AND b) AND c)``;
    one flat node evaluates the same way (left to right, stopping at the first deciding value)
    without a level of recursion per operand, so long generated chains stay cheap."""

    boolean = True
    symbol = ""
    decides = False  # the value that settles the result: FALSE for AND, TRUE for OR

    def __init__(self, left: Expression, right: Expression) -> None:
        self.operands: tuple[Expression, ...] = tuple(
            op for side in (left, right) for op in (side.operands if type(side) is type(self) else (side,)))

    def children(self) -> tuple[Expression, ...]:
        return self.operands

    def evaluate(self, props: Properties) -> bool | None:
        unknown = False
        for operand in self.operands:
            value = operand.evaluate(props)
            if value is self.decides:
                return self.decides
            unknown = unknown or value is None
        return None if unknown else not self.decides

    def __str__(self) -> str:
        text = str(self.operands[0])
        for operand in self.operands[1:]:
            text = f"({text} {self.symbol} {operand})"
        return text


class And(_Logic):
    symbol = "&&"
    decides = False


class Or(_Logic):
    symbol = "||"
    decides = True


class Selector:
    """A compiled selector: ``matches(properties)`` is True exactly when Apache's broker would
    deliver the message (evaluation errors count as no match, as Apache logs and skips them)."""

    def __init__(self, text: str, root: Expression) -> None:
        self.text = text
        self.root = root

    def evaluate(self, props: Properties) -> bool | None:
        """TRUE, FALSE or None (SQL's unknown); raises :class:`EvaluationError`."""
        return self.root.evaluate(props)

    def matches(self, props: Properties) -> bool:
        try:
            return self.root.evaluate(props) is True
        except EvaluationError:
            return False

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


__all__ = ["And", "BooleanCast", "Compare", "Constant", "Equal", "EvaluationError", "Expression", "In", "JInt",
           "JLong", "Negate", "Not", "Or", "Property", "Selector"]
