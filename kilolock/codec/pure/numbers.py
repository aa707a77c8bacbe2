"""Exact decimal numbers as cty keeps them: parsing, canonical text, and the wire form.

A number is held as ``Dec(neg, digits, exp)`` meaning ``±int(digits) × 10**exp`` with no leading
or trailing zeros in ``digits`` (``""`` is zero). Nothing passes through a binary float, so
``0.8`` stays 0.8 and a 30-digit integer keeps every digit.
"""
from __future__ import annotations

import decimal
import math
import re

# Magnitude limit on the most significant digit (10**±EXP_LIMIT): far beyond float64's range,
# and it keeps an input like ``1e999999999`` from expanding into a gigabyte of zeros.
EXP_LIMIT = 1000
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_FLOAT_MAX_FRACTION_DIGITS = 1074  # a non-integer float64 has at most this many decimals
_FLOAT_MAX_DIGITS = 800  # ... and fewer significant digits than this (767)
_FLOAT_MAX_INT_DIGITS = 309  # float64's largest integer has 309 digits
_MAX_POW5_IN_53_BITS = 22  # 5**22 < 2**53 <= 5**23: an exact float64 has at most 10**22's fives

_NUMBER_RE = re.compile(r"(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([-+]?)([0-9]+))?\Z")

WIRE_INT = 0
WIRE_FLOAT = 1
WIRE_STR = 2


class Dec:
    __slots__ = ("digits", "exp", "neg")

    def __init__(self, neg: bool, digits: str, exp: int) -> None:
        self.neg = neg
        self.digits = digits
        self.exp = exp


ZERO = Dec(False, "", 0)


def parse_number(text: str) -> Dec:
    """Parse JSON number syntax exactly; ``ValueError`` names what is wrong."""
    m = _NUMBER_RE.match(text)
    if m is None:
        raise ValueError("not a decimal number")
    sign, int_part, frac, exp_sign, exp_text = m.groups()
    frac = frac or ""
    digits = (int_part + frac).lstrip("0")
    if not digits:
        return ZERO
    exp_text = (exp_text or "0").lstrip("0") or "0"
    if len(exp_text) > 9:
        raise ValueError("number out of range")
    exp = int(exp_text)
    if exp_sign == "-":
        exp = -exp
    exp -= len(frac)
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    if not -EXP_LIMIT <= exp + len(stripped) - 1 <= EXP_LIMIT:
        raise ValueError("number out of range")
    return Dec(sign == "-", stripped, exp)


def from_int(value: int) -> Dec:
    return parse_number(str(value))


def canonical_text(d: Dec) -> str:
    """go-cty's ``big.Float.Text('f', -1)`` form: fixed notation, no exponent, no trailing zeros."""
    digits = d.digits
    if not digits:
        return "0"
    if d.exp >= 0:
        text = digits + "0" * d.exp
    else:
        k = -d.exp
        if len(digits) > k:
            text = digits[:-k] + "." + digits[-k:]
        else:
            text = "0." + "0" * (k - len(digits)) + digits
    return "-" + text if d.neg else text


def wire_form(d: Dec) -> tuple[int, int | float | str]:
    """How go-cty puts the number on the wire: int64 range as int, else a value float64 holds
    exactly as float64, anything else as its decimal text."""
    digits = d.digits
    if not digits:
        return WIRE_INT, 0
    if d.exp >= 0:
        if len(digits) + d.exp <= 19:
            v = int(digits) * 10**d.exp
            if d.neg:
                v = -v
            if _INT64_MIN <= v <= _INT64_MAX:
                return WIRE_INT, v
        # Beyond int64, go-cty (msgpack/marshal.go) still sends an integer that float64 holds
        # exactly, such as 1e20 or 2**64, as a float64; only the rest become strings.
        if d.exp <= _MAX_POW5_IN_53_BITS and len(digits) + d.exp <= _FLOAT_MAX_INT_DIGITS:
            mantissa = int(digits) * 5**d.exp
            twos = (mantissa & -mantissa).bit_length() - 1
            odd = mantissa >> twos
            exp2 = twos + d.exp
            if odd < (1 << 53) and odd.bit_length() + exp2 <= 1024:
                return WIRE_FLOAT, math.ldexp(-odd if d.neg else odd, exp2)
        return WIRE_STR, canonical_text(d)
    k = -d.exp
    # A non-integer dyadic rational always ends in the digit 5 in decimal: cheap early exit.
    if digits[-1] == "5" and k <= _FLOAT_MAX_FRACTION_DIGITS and len(digits) <= _FLOAT_MAX_DIGITS:
        mantissa, rem = divmod(int(digits), 5**k)
        if rem == 0:
            twos = (mantissa & -mantissa).bit_length() - 1
            odd = mantissa >> twos
            exp2 = twos - k
            if odd < (1 << 53) and exp2 >= -1074:
                return WIRE_FLOAT, math.ldexp(-odd if d.neg else odd, exp2)
    return WIRE_STR, canonical_text(d)


def float_text(f: float) -> str:
    """A decoded float64: its shortest round-trip digits, in canonical fixed notation."""
    if math.isnan(f) or math.isinf(f):
        raise ValueError("number is not finite")
    return canonical_text(parse_number(repr(f)))


def sort_key(d: Dec) -> decimal.Decimal:
    """Exact numeric ordering for set elements."""
    if not d.digits:
        return decimal.Decimal(0)
    return decimal.Decimal((1 if d.neg else 0, tuple(int(c) for c in d.digits), d.exp))
