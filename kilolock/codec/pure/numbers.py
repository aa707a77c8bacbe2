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
# go-cty keeps a zero's sign (big.Float) and writes it: "-0" from a provider stays "-0" in state.
NEGATIVE_ZERO = Dec(True, "", 0)


def parse_number(text: str) -> Dec:
    """Parse JSON number syntax exactly; ``ValueError`` names what is wrong."""
    m = _NUMBER_RE.match(text)
    if m is None:
        raise ValueError("not a decimal number")
    sign, int_part, frac, exp_sign, exp_text = m.groups()
    frac = frac or ""
    digits = (int_part + frac).lstrip("0")
    if not digits:
        return NEGATIVE_ZERO if sign == "-" else ZERO
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
        return "-0" if d.neg else "0"
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
    """How go-cty puts the number on the wire: int64 range as int, else a non-integer float64
    holds exactly as float64, anything else as its decimal text."""
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
        # Beyond int64 an integer goes as its decimal text even where float64 holds it exactly
        # (2**64, 1e20): go-cty v1.16 (Terraform 1.12) sends only non-integers as float64.
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


def _decimal_digits(odd: int, exp2: int) -> tuple[str, int]:
    """``odd × 2**exp2`` exactly, as math/big's ``decimal`` holds it: digits without trailing
    zeros and the decimal point's position (value = 0.digits × 10**point)."""
    if exp2 >= 0:
        text = str(odd << exp2)
        point = len(text)
    else:
        text = str(odd * 5**-exp2)
        point = len(text) + exp2
    return text.rstrip("0"), point


def _round_up(digits: str, point: int, n: int) -> tuple[str, int]:
    while n > 0 and digits[n - 1] == "9":
        n -= 1
    if n == 0:
        return "1", point + 1
    return digits[: n - 1] + chr(ord(digits[n - 1]) + 1), point


def _round_down(digits: str, point: int, n: int) -> tuple[str, int]:
    digits = digits[:n].rstrip("0")
    return digits, point if digits else 0


def _shortest_at_53_bits(m53: int, exp2: int) -> tuple[str, int]:
    """The digits Go's ``big.Float.Text('f', -1)`` writes for ``m53 × 2**exp2`` held at 53-bit
    precision (``m53`` in [2**52, 2**53)), by math/big's ``roundShortest``: the interval is
    ±½ ulp of the 53-bit mantissa even at a power of two or below float64's normal range (so it
    may name a decimal that float64 itself would round elsewhere), inclusive when the mantissa is
    even, and the three decimals are compared digit by digit at equal index whatever their
    decimal points."""
    digits, point = _decimal_digits(m53, exp2)
    lower, _ = _decimal_digits(2 * m53 - 1, exp2 - 1)
    upper, _ = _decimal_digits(2 * m53 + 1, exp2 - 1)
    inclusive = m53 % 2 == 0
    for i, m in enumerate(digits):
        low = lower[i] if i < len(lower) else "0"
        up = upper[i] if i < len(upper) else "0"
        ok_down = low != m or (inclusive and i + 1 == len(lower))
        ok_up = m != up and (inclusive or ord(m) + 1 < ord(up) or i + 1 < len(upper))
        n = i + 1
        if n >= len(digits):  # math/big's round* leave a decimal alone at or past its end
            return digits, point
        if ok_down and ok_up:
            # round half to even only when the dropped part is exactly one 5
            if digits[n] == "5" and n + 1 == len(digits):
                ok_down = (ord(digits[n - 1]) - 48) % 2 == 0
            else:
                ok_down = digits[n] < "5"
            return _round_down(digits, point, n) if ok_down else _round_up(digits, point, n)
        if ok_down:
            return _round_down(digits, point, n)
        if ok_up:
            return _round_up(digits, point, n)
    return digits, point


_TWO_53 = float(1 << 53)


def float_text(f: float) -> str:
    """A decoded float64 as Terraform writes it: go-cty holds it as a ``big.Float`` of 53-bit
    precision (``NumberFloatVal``) and state gets its ``Text('f', -1)``, whose shortest digits are
    not always float64's shortest round-trip digits (2**64 is 18446744073709550000, the smallest
    subnormal has 16 significant digits)."""
    if math.isnan(f) or math.isinf(f):
        raise ValueError("number is not finite")
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    if f.is_integer() and -_TWO_53 <= f <= _TWO_53:
        return str(int(f))  # an ulp of at most 1 (2 at 2**53): only the integer itself fits
    fraction, exp = math.frexp(abs(f))
    m53 = int(fraction * _TWO_53)
    digits, point = _shortest_at_53_bits(m53, exp - 53)
    return canonical_text(Dec(f < 0, digits, point - len(digits)))


def sort_key(d: Dec) -> decimal.Decimal:
    """Exact numeric ordering for set elements."""
    if not d.digits:
        return decimal.Decimal(0)
    return decimal.Decimal((1 if d.neg else 0, tuple(int(c) for c in d.digits), d.exp))
