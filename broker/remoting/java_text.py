"""Numbers as Java prints them: what Apache's broker puts in its answers and what its filter
compares, so our bodies and messages read the same (``Double.toString``)."""

from __future__ import annotations

import math
from decimal import Decimal


def java_double(value: float) -> str:
    """``Double.toString``: ``0.0``, ``12.5``, ``1.0E7``, ``1.0E-4``, ``NaN``, ``Infinity``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    if 1e-3 <= abs(value) < 1e7:
        text = repr(float(value))
        return text if "." in text else text + ".0"
    mantissa, _, exponent = f"{Decimal(repr(float(value))):E}".partition("E")  # shortest digits
    if "." in mantissa:
        mantissa = mantissa.rstrip("0")
    mantissa = mantissa + "0" if mantissa.endswith(".") else mantissa if "." in mantissa else mantissa + ".0"
    return f"{mantissa}E{int(exponent)}"
