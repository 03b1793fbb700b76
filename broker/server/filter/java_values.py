"""Java-typed values and the comparison rules of Apache's SQL92 filter.

Apache evaluates message selectors with Java objects: literals are ``Integer``, ``Long``, ``Double``,
``String`` or ``Boolean``, and message properties are always ``String``. Whether ``a > 5`` matches
depends on how Java converts between those types (``Integer.valueOf("7.5")`` fails, so a property
``"7.5"`` never satisfies ``a > 5``, while ``a > 5.0`` converts with ``Double.valueOf`` and does).
This module keeps those rules in one place so the evaluator can follow them exactly:
``Integer``/``Long`` are :class:`JInt`/:class:`JLong` (``int`` subclasses that remember their Java
type), ``Double`` is ``float``, ``Boolean`` is ``bool``, ``String`` is ``str``, ``null`` is ``None``.
"""

from __future__ import annotations

import math
import re
import struct

from broker.remoting.java_text import java_double

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


class EvaluationError(Exception):
    """A Java exception while evaluating (a failed number conversion, an impossible cast).

    Apache catches it per message and counts the message as not matching."""


class JInt(int):
    """A ``java.lang.Integer``."""

    def __repr__(self) -> str:
        return f"JInt({int(self)})"


class JLong(int):
    """A ``java.lang.Long``."""

    def __repr__(self) -> str:
        return f"JLong({int(self)})"


Value = None | bool | str | float | JInt | JLong


def kind(value: object) -> str:
    """The Java class name of ``value``: Boolean, Integer, Long, Double or String."""
    if isinstance(value, bool):
        return "Boolean"
    if isinstance(value, JInt):
        return "Integer"
    if isinstance(value, JLong):
        return "Long"
    if isinstance(value, float):
        return "Double"
    if isinstance(value, str):
        return "String"
    raise TypeError(f"not a selector value: {value!r}")


def wrap_int(value: int, bits: int) -> int:
    """Two's-complement overflow, as Java's ``-Integer.MIN_VALUE`` stays ``MIN_VALUE``."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


_JAVA_INT = re.compile(r"[+-]?\d+")  # Character.digit accepts every Unicode decimal digit, as \d does
_JAVA_DOUBLE = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")
_JAVA_HEX_DOUBLE = re.compile(r"([+-]?)0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP]([+-]?[0-9]+)[fFdD]?")


def parse_integer(text: str, bits: int) -> int:
    """``Integer.valueOf`` (bits 32) / ``Long.valueOf`` (bits 64): no blanks, no decimal point."""
    if not _JAVA_INT.fullmatch(text):
        raise EvaluationError(f'NumberFormatException: For input string: "{text}"')
    value = int(text)
    if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
        raise EvaluationError(f'NumberFormatException: For input string: "{text}"')
    return JInt(value) if bits == 32 else JLong(value)


def parse_double(text: str) -> float:
    """``Double.valueOf``: surrounding blanks (chars <= U+0020) trimmed, ``1.5f``/``2d`` suffixes,
    ``NaN``, ``Infinity`` and hexadecimal ``0x1.8p3`` accepted."""
    trimmed = text.strip("".join(chr(c) for c in range(0x21)))
    if _JAVA_DOUBLE.fullmatch(trimmed):
        body = trimmed.rstrip("fFdD") if trimmed[-1:] in "fFdD" and "Infinity" not in trimmed else trimmed
        return float(body.replace("Infinity", "inf").replace("NaN", "nan"))
    hexa = _JAVA_HEX_DOUBLE.fullmatch(trimmed)
    if hexa:
        sign, digits, exponent = hexa.groups()
        return float.fromhex(f"{sign}0x{digits if digits[0] != '.' else '0' + digits}p{exponent}")
    raise EvaluationError(f'NumberFormatException: For input string: "{text}"')


def boolean_value_of(text: str) -> bool:
    """``Boolean.valueOf(String)``: true only for "true" in any case."""
    return text.lower() == "true"


def _double_bits(value: float) -> int:
    """``Double.doubleToLongBits``: every NaN folds to one pattern."""
    if math.isnan(value):
        return 0x7FF8000000000000
    return struct.unpack(">q", struct.pack(">d", value))[0]


def _compare_doubles(a: float, b: float) -> int:
    """``Double.compare``: -0.0 < 0.0 and NaN above everything, equal to itself."""
    if a < b:
        return -1
    if a > b:
        return 1
    bits_a, bits_b = _double_bits(a), _double_bits(b)
    return (bits_a > bits_b) - (bits_a < bits_b)


def _compare_strings(a: str, b: str) -> int:
    """``String.compareTo``: UTF-16 code units."""
    ua, ub = a.encode("utf-16-be", "surrogatepass"), b.encode("utf-16-be", "surrogatepass")
    return (ua > ub) - (ua < ub)


def java_equals(a: object, b: object) -> bool:
    """``a.equals(b)`` for two non-null selector values (a different class is never equal)."""
    if kind(a) != kind(b):
        return False
    if isinstance(a, float):
        return _double_bits(a) == _double_bits(b)  # type: ignore[arg-type]
    return a == b


def _same_kind_compare(a: object, b: object) -> int:
    if isinstance(a, float):
        return _compare_doubles(a, float(b))  # type: ignore[arg-type]
    if isinstance(a, str):
        return _compare_strings(a, b)  # type: ignore[arg-type]
    return (a > b) - (a < b)  # type: ignore[operator]


def java_compare(lv: object, rv: object) -> int:
    """Apache's ``ComparisonExpression.__compare`` with string conversion on (as the broker parses):
    values of different classes are converted towards the right-hand or numeric side; classes that
    do not convert compare as -1; a conversion that fails raises :class:`EvaluationError`."""
    lk, rk = kind(lv), kind(rv)
    if lk != rk:
        if lk == "Boolean":
            if rk == "String":  # Apache casts the Boolean to String here: a ClassCastException
                raise EvaluationError("ClassCastException: Boolean cannot be cast to String")
            return -1
        if lk == "Integer":
            if rk == "Long":
                lv = JLong(lv)  # type: ignore[arg-type]
            elif rk == "Double":
                lv = float(lv)  # type: ignore[arg-type]
            elif rk == "String":
                rv = parse_integer(rv, 32)  # type: ignore[arg-type]
            else:
                return -1
        elif lk == "Long":
            if rk == "Integer":
                rv = JLong(rv)  # type: ignore[arg-type]
            elif rk == "Double":
                lv = float(lv)  # type: ignore[arg-type]
            elif rk == "String":
                rv = parse_integer(rv, 64)  # type: ignore[arg-type]
            else:
                return -1
        elif lk == "Double":
            if rk in ("Integer", "Long"):
                rv = float(rv)  # type: ignore[arg-type]
            elif rk == "String":
                rv = parse_double(rv)  # type: ignore[arg-type]
            else:
                return -1
        else:  # String on the left
            if rk == "Boolean":
                lv = boolean_value_of(lv)  # type: ignore[arg-type]
            elif rk == "Integer":
                lv = parse_integer(lv, 32)  # type: ignore[arg-type]
            elif rk == "Long":
                lv = parse_integer(lv, 64)  # type: ignore[arg-type]
            else:  # Double
                lv = parse_double(lv)  # type: ignore[arg-type]
    return _same_kind_compare(lv, rv)


def to_text(value: object) -> str:
    """A value as Java's ``toString`` shows it in error messages (strings quoted as in a selector)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, float):
        return java_double(value)
    return str(int(value))  # type: ignore[arg-type]


def to_java_string(value: object) -> str:
    """``String.valueOf(value)``: what ``String.format("%s", value)`` shows (strings unquoted)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return to_text(value)
