"""Kubernetes resource quantities (`1000`, `500m`, `4Gi`, `1.5e3`), read exactly as
apimachinery's `resource.Quantity` reads them, for the batch resources Koordinator writes.

    parse_quantity("4Gi")        → Fraction(4294967296)
    ceil_value(parse_quantity("1.5"))    → 2      # Quantity.Value(): rounded up
    ceil_milli(parse_quantity("500m"))   → 500    # Quantity.MilliValue()

The grammar (apimachinery `quantity.go`): an optional sign, digits with an optional decimal
point (at least one digit), then one suffix: binary `Ki Mi Gi Ti Pi Ei`, decimal
`n u m "" k M G T P E`, or a decimal exponent `e3` / `E-2`. Nothing else, and no spaces.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["ceil_milli", "ceil_value", "parse_quantity"]

_NUMBER = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(.*)")
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_MAX_EXPONENT = 60
"""apimachinery caps quantities at 2**63-1 (about 9.2e18); any exponent past this is absurd."""
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity string; ValueError naming it when it is none."""
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a quantity (like 1000, 500m or 4Gi)")
    sign, number, suffix = match.groups()
    value = Fraction(number)
    if suffix in _BINARY:
        value *= 1 << _BINARY[suffix]
    elif suffix in _DECIMAL:
        value *= Fraction(10) ** _DECIMAL[suffix]
    else:
        exponent = _EXPONENT.fullmatch(suffix)
        if exponent is None:
            raise ValueError(f"{text!r} is not a quantity: unknown suffix {suffix!r}")
        power = int(exponent[1]) if len(exponent[1]) <= 6 else _MAX_EXPONENT + 1
        if abs(power) > _MAX_EXPONENT:
            # 10**999999999 would take the event loop hours to compute: from a pod annotation.
            raise ValueError(f"{text!r} is not a quantity: exponent beyond ±{_MAX_EXPONENT}")
        value *= Fraction(10) ** power
    return -value if sign == "-" else value


def ceil_value(value: Fraction) -> int:
    """`Quantity.Value()`: the value in units, rounded up."""
    return math.ceil(value)


def ceil_milli(value: Fraction) -> int:
    """`Quantity.MilliValue()`: the value in thousandths, rounded up."""
    return math.ceil(value * 1000)
