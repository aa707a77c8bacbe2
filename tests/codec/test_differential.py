"""Property-based differential test: random types and values through both backends.

Both must give the same bytes (or both raise CodecError with the same message), and
decode(encode(x)) must equal an independent reference canonicalisation of x written here from
the rules (exact decimals; float64 values as go-cty writes them; strings NFC; sets
sorted/deduplicated; keys sorted by UTF-8 bytes; sets of non-primitives sorted by element text;
dynamic values wrapped with their type). The float64 digits come from the pure backend's
``float_text``: test_gocty_oracle holds that one to go-cty itself.
"""
from __future__ import annotations

import decimal
import json
import types
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kilolock.codec import CodecError
from kilolock.codec.pure.numbers import float_text

PRIMITIVES = ["string", "number", "bool"]
NAMES = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)


def _types() -> st.SearchStrategy[Any]:
    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(
            st.tuples(st.sampled_from(["list", "set", "map"]), inner).map(list),
            # Names that NFC makes one are one attribute to go-cty (kl refuses the type: test_backend).
            st.dictionaries(NAMES, inner, max_size=4).filter(lambda d: len({_nfc(k) for k in d}) == len(d))
            .map(lambda d: ["object", d]),
            st.lists(inner, max_size=3).map(lambda e: ["tuple", e]),
        )

    return st.recursive(st.sampled_from(PRIMITIVES + ["dynamic"]), extend, max_leaves=8)


# --- numbers: exact decimals, spelled in several ways --------------------------------------------

NUMBERS = st.one_of(
    st.integers(min_value=-(10**25), max_value=10**25).map(decimal.Decimal),
    st.integers(min_value=-(2**63) - 2, max_value=2**63 + 2).map(decimal.Decimal),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: decimal.Decimal(repr(f))),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(decimal.Decimal),  # exact binary values
    st.decimals(allow_nan=False, allow_infinity=False, min_value=-(10**30), max_value=10**30, places=None).filter(
        lambda d: d.is_finite() and (d == 0 or -300 < d.adjusted() < 300)),
)


def _plain(mantissa: str, exp: int) -> str:
    """Exact fixed notation (Decimal's own formatting rounds to the context precision)."""
    if exp >= 0:
        return mantissa + "0" * exp
    mantissa = mantissa.rjust(-exp + 1, "0")
    return mantissa[:exp] + "." + mantissa[exp:]


@st.composite
def _spelled(draw: st.DrawFn, d: decimal.Decimal) -> str:
    sign, digits, exp = d.as_tuple()
    assert isinstance(exp, int), d  # only NaN and infinities have a letter for exponent; NUMBERS draws neither
    mantissa = "".join(map(str, digits)) or "0"
    style = draw(st.sampled_from(["fixed", "exp", "padded"]))
    prefix = "-" if sign else ""
    if style == "exp":
        return f"{prefix}{int(mantissa)}e{exp}"
    text = _plain(mantissa, exp)
    if style == "padded" and "." not in text:
        text += ".0"
    elif style == "padded":
        text += "00"
    return prefix + text


# --- values for a type, as (JSON text pieces builder) ----------------------------------------------


def _json_value(depth: int = 0) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=5)),
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(NAMES, inner, max_size=3)),
        max_leaves=6,
    )


@st.composite
def _value(draw: st.DrawFn, ty: Any) -> Any:
    """A value of type ty as a tree: None, bool, Decimal, str, list, dict, ('wrap', type, value)."""
    if draw(st.integers(0, 9)) == 0:
        return None
    if ty == "string":
        return draw(st.text(max_size=8))
    if ty == "number":
        return draw(NUMBERS)
    if ty == "bool":
        return draw(st.booleans())
    if ty == "dynamic":
        if draw(st.booleans()):
            concrete = draw(_types().filter(lambda t: t != "dynamic"))
            return ("wrap", concrete, draw(_value(concrete)))
        return draw(_json_value())
    kind = ty[0]
    if kind in ("list", "set"):
        return draw(st.lists(_value(ty[1]), max_size=4))
    if kind == "map":
        return draw(st.dictionaries(NAMES, _value(ty[1]), max_size=4))
    if kind == "tuple":
        return [draw(_value(t)) for t in ty[1]]
    attrs = ty[1]
    present = draw(st.lists(st.sampled_from(sorted(attrs)), unique=True)) if attrs else []
    order = draw(st.permutations(present))
    return {name: draw(_value(attrs[name])) for name in order}


@st.composite
def _render(draw: st.DrawFn, v: Any) -> str:
    """JSON text with random number spellings, whitespace and key order as generated."""
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, decimal.Decimal):
        return draw(_spelled(v))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=draw(st.booleans()))
    if isinstance(v, tuple):
        _, concrete, inner = v
        return '{"value":' + draw(_render(inner)) + ',"type":' + json.dumps(concrete) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(draw(_render(x)) for x in v) + "]"
    return "{" + ",".join(json.dumps(k) + ":" + draw(_render(x)) for k, x in v.items()) + "}"


# --- the reference canonicaliser ------------------------------------------------------------------


def _fixed(d: decimal.Decimal) -> str:
    sign, digits, exp = d.as_tuple()
    assert isinstance(exp, int), d  # finite: a drawn number or a finite float's repr
    text = ("-" if sign else "") + _plain("".join(map(str, digits)) or "0", exp)
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _canon_number(d: decimal.Decimal) -> str:
    if d == d.to_integral_value():
        # int64 range as an int, beyond it as decimal text: either way exact
        return str(int(d)) if -(2**63) <= d < 2**63 else _fixed(d)
    f = float(d)
    if decimal.Decimal(f) == d:  # go-cty sends it as float64 and writes it back as big.Float does
        return float_text(f)
    return _fixed(d)


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _type_json(ty: Any) -> str:
    if isinstance(ty, str):
        return json.dumps(ty)
    if ty[0] == "object":
        return '["object",{' + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _type_json(ty[1][k])
                                        for k in sorted(ty[1])) + "}]"
    if ty[0] == "tuple":
        return '["tuple",[' + ",".join(_type_json(t) for t in ty[1]) + "]]"
    return f'["{ty[0]}",{_type_json(ty[1])}]'


def _infer(v: Any) -> Any:
    if v is None:
        return "dynamic"
    if v is True or v is False:
        return "bool"
    if isinstance(v, decimal.Decimal):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return ["tuple", [_infer(x) for x in v]]
    return ["object", {k: _infer(x) for k, x in v.items()}]


def _set_key(ty: Any, v: Any) -> Any:
    if v is None:
        return (1, 0)
    if ty == "string":
        return (0, _nfc(v).encode())
    if ty == "number":
        return (0, decimal.Decimal(_canon_number(v)))
    return (0, v)


def canonical(ty: Any, v: Any) -> str:
    if v is None:
        return "null"
    if ty == "string":
        return json.dumps(_nfc(v), ensure_ascii=False)
    if ty == "number":
        return _canon_number(v)
    if ty == "bool":
        return "true" if v else "false"
    if ty == "dynamic":
        concrete, inner = (v[1], v[2]) if isinstance(v, tuple) else (_infer(v), v)
        return '{"type":' + _type_json(concrete) + ',"value":' + canonical(concrete, inner) + "}"
    kind = ty[0]
    if kind == "list":
        return "[" + ",".join(canonical(ty[1], x) for x in v) + "]"
    if kind == "tuple":
        return "[" + ",".join(canonical(t, x) for t, x in zip(ty[1], v, strict=True)) + "]"
    if kind == "set":
        if ty[1] in PRIMITIVES:
            by_key: dict[Any, str] = {}
            for x in v:
                by_key.setdefault(_set_key(ty[1], x), canonical(ty[1], x))
            return "[" + ",".join(by_key[k] for k in sorted(by_key)) + "]"
        return "[" + ",".join(sorted({canonical(ty[1], x) for x in v})) + "]"
    if kind == "map":
        return "{" + ",".join(json.dumps(_nfc(k), ensure_ascii=False) + ":" + canonical(ty[1], v[k])
                              for k in sorted(v, key=lambda s: _nfc(s).encode())) + "}"
    # Attribute names NFC, as go-cty's cty.Object keys them.
    return "{" + ",".join(json.dumps(_nfc(k), ensure_ascii=False) + ":" + canonical(ty[1][k], v.get(k))
                          for k in sorted(ty[1], key=lambda s: _nfc(s).encode())) + "}"


def _has_non_nfc_name(ty: Any) -> bool:
    if not isinstance(ty, list):
        return False
    if ty[0] == "object":
        return any(_nfc(k) != k or _has_non_nfc_name(t) for k, t in ty[1].items())
    if ty[0] == "tuple":
        return any(_has_non_nfc_name(t) for t in ty[1])
    return _has_non_nfc_name(ty[1])


def _has_nfc_collision(v: Any) -> bool:
    if isinstance(v, tuple):
        return _has_nfc_collision(v[2])
    if isinstance(v, list):
        return any(_has_nfc_collision(x) for x in v)
    if isinstance(v, dict):
        return len({_nfc(k) for k in v}) < len(v) or any(_has_nfc_collision(x) for x in v.values())
    return False


@st.composite
def _case(draw: st.DrawFn) -> tuple[Any, Any, str]:
    ty = draw(_types())
    value = draw(_value(ty))
    return ty, value, draw(_render(value))


def _outcome(fn: Callable[[bytes], Any], arg: bytes) -> tuple[str, Any]:
    try:
        return "ok", fn(arg)
    except CodecError as exc:
        # Path and words must match; only the detail of a JSON syntax error (here: a type
        # specification inside the wire value) is each parser's own.
        return "error", str(exc).split("invalid JSON: ")[0]


SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@SETTINGS
@given(_case())
# An attribute name that NFC changes (U+F900 is U+8C48): go-cty's cty.Object keys it normalized, so
# that is what goes on the wire and what a decode looks up (both backends wrote it as given, then
# refused to read it back).
@example(case=(["object", {"\uf900": "string"}], {}, "{}"))
def test_backends_agree_and_roundtrip_is_canonical(both: tuple[types.ModuleType, types.ModuleType],
                                                   case: tuple[Any, Any, str]) -> None:
    ty, value, text = case
    type_bytes = json.dumps(ty, ensure_ascii=False).encode()
    py_t, rs_t = (impl.compile_type(type_bytes) for impl in both)
    py_out = _outcome(py_t.encode, text.encode())
    rs_out = _outcome(rs_t.encode, text.encode())
    assert py_out == rs_out, text
    if py_out[0] == "error":
        # What go-cty refuses too (test_gocty_oracle checks the rule): elements of different
        # types in a collection of dynamic, and map keys that are one key once normalized.
        # And an attribute written in a form NFC changes: go-cty keys the type's attributes NFC
        # and looks a value's up as written (the oracle agreed on one such case).
        if ("must all have one type" in py_out[1] and "dynamic" in json.dumps(ty)) or (
                "duplicate key" in py_out[1] and _has_nfc_collision(value)) or (
                "unknown attribute" in py_out[1] and _has_non_nfc_name(ty)):
            return
        pytest.fail(f"valid value rejected: {py_out[1]} for {text}")
    wire = py_out[1]
    decoded = py_t.decode(wire)
    assert decoded == rs_t.decode(wire)
    if "dynamic" in json.dumps(ty):
        # A dynamic value comes back with the type go-cty gives its value (a list of dynamic
        # holding bools is a list of bool): test_gocty_oracle checks those against go-cty itself.
        return
    assert decoded.decode() == canonical(ty, value)


@SETTINGS
@given(_case(), st.data())
def test_backends_agree_on_mangled_input(both: tuple[types.ModuleType, types.ModuleType],
                                         case: tuple[Any, Any, str], data: st.DataObject) -> None:
    """Corrupted wire bytes: same output or an error from both (never a crash, never a hang)."""
    ty, _, text = case
    type_bytes = json.dumps(ty, ensure_ascii=False).encode()
    py_t, rs_t = (impl.compile_type(type_bytes) for impl in both)
    try:
        wire = bytearray(py_t.encode(text.encode()))
    except CodecError:
        return  # a value go-cty refuses too (see test_backends_agree_and_roundtrip_is_canonical)
    cut = data.draw(st.integers(0, len(wire)))
    if data.draw(st.booleans()) and wire:
        wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    else:
        wire = wire[:cut]
    py_out = _outcome(py_t.decode, bytes(wire))
    rs_out = _outcome(rs_t.decode, bytes(wire))
    assert py_out == rs_out


@st.composite
def _ill_typed_case(draw: st.DrawFn) -> tuple[Any, str]:
    """Random JSON against a random type: mostly ill-typed, sometimes by accident valid."""
    ty = draw(_types())
    return ty, draw(_render(draw(_json_value())))


@SETTINGS
@given(_ill_typed_case())
# Attributes named "": the dot goes after a step even when that step wrote nothing (the Rust
# backend once left it out after an empty name).
@example((["object", {"": ["object", {"": "string"}]}], '{"":{"":false}}'))
@example((["object", {"a": ["object", {"": ["list", "string"]}]}], '{"a":{"":[1]}}'))
def test_backends_agree_on_ill_typed_json(both: tuple[types.ModuleType, types.ModuleType],
                                          case: tuple[Any, str]) -> None:
    """Same bytes, or the same CodecError message (path and words), for any well-formed JSON."""
    ty, text = case
    type_bytes = json.dumps(ty, ensure_ascii=False).encode()
    py_t, rs_t = (impl.compile_type(type_bytes) for impl in both)
    assert _outcome(py_t.encode, text.encode()) == _outcome(rs_t.encode, text.encode()), text


FUZZ_TYPES = [b'"dynamic"', b'["object",{"a":["list","number"],"b":["set","string"],"c":["map","bool"]}]',
              b'["tuple",["string",["set",["object",{"x":"dynamic"}]]]]']


@SETTINGS
@given(st.sampled_from(FUZZ_TYPES), st.binary(max_size=64) | st.text(max_size=40).map(str.encode))
def test_arbitrary_bytes_give_codec_errors_only(both: tuple[types.ModuleType, types.ModuleType],
                                                type_bytes: bytes, blob: bytes) -> None:
    """Garbage in either direction: a result or a CodecError, the same from both backends."""
    py_t, rs_t = (impl.compile_type(type_bytes) for impl in both)
    assert _outcome(py_t.decode, blob) == _outcome(rs_t.decode, blob)
    py_enc, rs_enc = _outcome(py_t.encode, blob), _outcome(rs_t.encode, blob)
    assert py_enc[0] == rs_enc[0]
    if py_enc[0] == "ok":
        assert py_enc == rs_enc
