"""Fuzzing the cty codec, both backends side by side: whatever the type and the bytes, each call
gives a result or one CodecError with a one-line message, never another exception (a Rust panic
included) and never a hang; and the Rust and Python backends agree on success or failure, and on
the bytes when they succeed.

tests/codec/test_differential.py checks that the backends agree on well-formed values (200 cases
each). These targets go after the other side: wire bytes and JSON text that are mostly wrong
(structured msgpack of the wrong shape, unknown-value extensions, deep nesting, huge numbers, bad
UTF-8, lone surrogates, ill-formed type specifications), 1,000+ cases per target.
"""
from __future__ import annotations

import json
import math
import time
import types
from collections.abc import Callable
from typing import Any, Protocol

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kilolock.codec import MAX_DEPTH, CodecError
from kit.fuzz import FUZZ, RecordProperty, Tally, assert_one_line, hang_guard

# --- backends ---------------------------------------------------------------------------------------


def _backends() -> tuple[types.ModuleType, types.ModuleType]:
    from kilolock.codec import pure

    try:
        from kilolock._native import codec
    except ImportError as exc:
        pytest.fail("the Rust codec is not built into this checkout: run `cargo build --release --manifest-path "
                    f"codec_rs/Cargo.toml && cp codec_rs/target/release/lib_native.so kilolock/_native.abi3.so` ({exc})")
    return pure, codec


PY, RS = _backends()

# A call slower than this is a hang for our purposes: real calls here take microseconds.
HANG_SECONDS = 5.0


def outcome(call: Callable[[], Any], tally: Tally, what: str) -> tuple[str, Any]:
    """("ok", result) or ("error", message); anything else fails the test, naming the input."""
    start = time.monotonic()
    try:
        result = call()
    except CodecError as exc:
        assert_one_line(str(exc), what)
        return "error", str(exc)
    except BaseException as exc:  # a pyo3 PanicException is a BaseException, not an Exception
        raise AssertionError(f"{what}: {type(exc).__name__} instead of CodecError: {exc}") from exc
    finally:
        elapsed = time.monotonic() - start
        tally.timed(elapsed)
        assert elapsed < HANG_SECONDS, f"{what}: took {elapsed:.1f}s"
    return "ok", result


class OnBackend(Protocol):
    """A call made once per backend module. A Protocol rather than Callable[[ModuleType], Any]:
    mypy cannot infer a lambda against a Callable when the lambda binds loop variables as extra
    defaulted parameters (``lambda impl, spec=spec: ...``), which the loops below do."""

    def __call__(self, impl: types.ModuleType, /) -> Any: ...


def both(fn: OnBackend, tally: Tally, what: str) -> tuple[str, Any]:
    """Run FN on each backend; they must agree on ok/error and on the bytes when ok."""
    py = outcome(lambda: fn(PY), tally, f"python backend, {what}")
    rs = outcome(lambda: fn(RS), tally, f"rust backend, {what}")
    assert py[0] == rs[0], f"backends disagree on {what}: python {py}, rust {rs}"
    if py[0] == "ok" and isinstance(py[1], bytes):
        assert py[1] == rs[1], f"backends give different bytes for {what}: python {py[1]!r}, rust {rs[1]!r}"
    return py


# --- types ------------------------------------------------------------------------------------------

NAMES = st.one_of(st.sampled_from(["id", "a", "b", "tags", ""]), st.text(max_size=5))
PRIMITIVES = ["string", "number", "bool", "dynamic"]


def _extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    def obj(attrs: dict[str, Any], optional: list[str]) -> list[Any]:
        opt = [a for a in optional if a in attrs]
        return ["object", attrs, opt] if opt else ["object", attrs]

    return st.one_of(
        st.tuples(st.sampled_from(["list", "set", "map"]), inner).map(list),
        st.builds(obj, st.dictionaries(NAMES, inner, max_size=4), st.lists(NAMES, max_size=2)),
        st.lists(inner, max_size=3).map(lambda e: ["tuple", e]),
    )


TYPES = st.recursive(st.sampled_from(PRIMITIVES), _extend, max_leaves=8)


def nested_type(depth: int) -> Any:
    ty: Any = "string"
    for _ in range(depth):
        ty = ["list", ty]
    return ty


# One type in ten nests around the depth limit (both backends must refuse past it, alike).
TYPE_OR_DEEP = st.integers(0, 9).flatmap(
    lambda pick: st.integers(MAX_DEPTH - 3, MAX_DEPTH + 3).map(nested_type) if pick == 0 else TYPES)


def type_bytes(ty: Any) -> bytes:
    return json.dumps(ty, ensure_ascii=False).encode()


# --- random JSON, as values and as text -------------------------------------------------------------

SCALARS = st.one_of(
    st.none(), st.booleans(), st.text(max_size=8),
    st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
)
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=4),
                           max_leaves=12)

# Spellings json.dumps never makes but a hand-edited state or a buggy tool might.
ODD_TOKENS = [
    "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e-400", "-0", "-0.0", "0e0", "1E+2", "01", "1.", ".5", "+1",
    "123456789012345678901234567890123456789", "0.1000000000000000055511151231257827", "9223372036854775808",
    "-9223372036854775809", "18446744073709551616", "1e308", "4.9e-324", "true", "false", "null", "nul", "tru",
    '"\\ud800"', '"\\udc00\\ud800"', '"\\u00"', '"\\x41"', '"\t"', '"\x00"', "\"\\/\"", "[]", "{}", "[,]", "{,}", "[1,]",
    '{"a":1,"a":2}', '{"a"}', '{1:2}', "[" * 70 + "]" * 70, "[" * 200, '{"a":' * 70 + "1" + "}" * 70,
    '{"value":1,"type":"number"}', '{"value":"x","type":["list","string"]}', '{"type":"bogus","value":1}',
    '{"value":[1],"type":["tuple",["number","string"]]}', '{"value":null}', '{"type":"string"}',
    '{"value":1,"type":"number","extra":2}', '{"value":{"a":1},"type":["object",{"a":"number"},["a"]]}',
]


@st.composite
def json_text(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return json.dumps(draw(JSON_VALUES), ensure_ascii=draw(st.booleans())).encode()
    if kind == 1:
        return draw(st.sampled_from(ODD_TOKENS)).encode()
    if kind == 2:  # odd tokens inside a structure, where the type check has to reach them
        parts = draw(st.lists(st.sampled_from(ODD_TOKENS), min_size=1, max_size=3))
        keys = draw(st.lists(NAMES, min_size=len(parts), max_size=len(parts)))
        if draw(st.booleans()):
            return ("[" + ",".join(parts) + "]").encode()
        return ("{" + ",".join(json.dumps(k) + ":" + p for k, p in zip(keys, parts, strict=True)) + "}").encode()
    if kind == 3:
        return draw(st.binary(max_size=60))
    if kind == 4:
        return draw(st.text(max_size=30)).encode("utf-8", "surrogatepass")
    # A valid text with one byte changed, cut or inserted.
    raw = bytearray(json.dumps(draw(JSON_VALUES)).encode())
    pos = draw(st.integers(0, len(raw)))
    action = draw(st.sampled_from(["cut", "flip", "insert"]))
    if action == "cut":
        return bytes(raw[:pos])
    if action == "flip" and raw:
        raw[min(pos, len(raw) - 1)] = draw(st.integers(0, 255))
    else:
        raw[pos:pos] = draw(st.binary(min_size=1, max_size=3))
    return bytes(raw)


@st.composite
def shaped_json(draw: st.DrawFn, ty: Any, depth: int = 0) -> Any:
    """A value that mostly fits TY, with a random wrong piece now and then (ill-typed by design)."""
    if depth > 6 or draw(st.integers(0, 9)) == 0:
        return draw(SCALARS)
    if ty == "string":
        return draw(st.text(max_size=6))
    if ty == "number":
        return draw(st.integers(-(2**66), 2**66) | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(["12", "x", "1e3"]))
    if ty == "bool":
        return draw(st.booleans() | st.sampled_from(["true", "false", "yes", 0, 1]))
    if ty == "dynamic":
        if draw(st.booleans()):
            inner = draw(TYPES)
            return {"value": draw(shaped_json(inner, depth + 1)), "type": inner}
        return draw(JSON_VALUES)
    kind = ty[0]
    if kind in ("list", "set"):
        return draw(st.lists(shaped_json(ty[1], depth + 1), max_size=3))
    if kind == "map":
        return draw(st.dictionaries(NAMES, shaped_json(ty[1], depth + 1), max_size=3))
    if kind == "tuple":
        items = [draw(shaped_json(t, depth + 1)) for t in ty[1]]
        if draw(st.integers(0, 4)) == 0:
            items = items[:-1] if bool(items) and draw(st.booleans()) else items + [None]
        return items
    attrs = ty[1]
    keys = draw(st.lists(st.sampled_from(sorted(attrs)), unique=True)) if attrs else []
    doc = {k: draw(shaped_json(attrs[k], depth + 1)) for k in keys}
    if draw(st.integers(0, 5)) == 0:
        doc[draw(NAMES)] = draw(SCALARS)  # an attribute the type does not have
    return doc


# --- random wire bytes -------------------------------------------------------------------------------

MP_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.floats(width=32),
    st.text(max_size=8), st.binary(max_size=8),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=6)),
    st.sampled_from([msgpack.ExtType(0, b"\x00"), msgpack.ExtType(12, b""), msgpack.ExtType(12, b"\x80"),
                     msgpack.ExtType(12, msgpack.packb({1: False, 2: "pre", 3: [1, True], 4: [9, False], 5: 0, 6: 3})),
                     msgpack.ExtType(12, msgpack.packb({3: "x", 5: -1, 99: None})), msgpack.ExtType(12, b"\xff" * 1100)]),
)
MP_VALUES = st.recursive(
    MP_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4) | st.integers(-3, 3) | st.binary(max_size=3), inner, max_size=4),
    max_leaves=12,
)


def _deep(depth: int, head: bytes) -> bytes:
    return head * depth + b"\xc0"


@st.composite
def wire_bytes(draw: st.DrawFn, ty: Any) -> bytes:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.binary(max_size=80))
    if kind == 1:
        return msgpack.packb(draw(MP_VALUES), use_bin_type=draw(st.booleans()))
    if kind == 2:  # a dynamic pair: [type JSON as bin or str, value], with the type often wrong
        spec = draw(st.one_of(TYPES.map(type_bytes), st.binary(max_size=12), st.sampled_from([b'"bogus"', b"[", b'["list"]'])))
        as_str = draw(st.booleans())
        pair = [spec.decode("utf-8", "replace") if as_str else spec, draw(MP_VALUES)]
        return msgpack.packb(pair if draw(st.integers(0, 4)) else pair + [1], use_bin_type=True)
    if kind == 3:  # nesting around the depth limit: fixarray(1), fixmap(1) with key "a", dynamic pairs
        depth = draw(st.integers(MAX_DEPTH - 3, MAX_DEPTH + 40))
        head = draw(st.sampled_from([b"\x91", b"\x81\xa1a", b"\x92\xc4\x09\"dynamic\""]))
        return _deep(depth, head)
    if kind == 4:  # the real encoding of a fitting value, then damaged
        wire = bytearray(_try_encode(ty, draw(shaped_json(ty))))
        if wire:
            for _ in range(draw(st.integers(1, 3))):
                i = draw(st.integers(0, len(wire) - 1))
                wire[i] = draw(st.integers(0, 255))
        return bytes(wire[: draw(st.integers(0, len(wire)))]) if draw(st.booleans()) else bytes(wire)
    # Headers that promise more than follows: str32/bin32/array32/map32/ext32 with huge lengths.
    # Negative ext codes (msgpack's reserved ones, e.g. -1 timestamp) cannot be built with msgpack.ExtType.
    head = draw(st.sampled_from([b"\xdb", b"\xc6", b"\xdd", b"\xdf", b"\xc9", b"\xda", b"\xdc", b"\xde", b"\xd9",
                                 b"\xd4\xff", b"\xd6\xff", b"\xc7\x00\x80", b"\xd5\x0c"]))
    return head + draw(st.binary(min_size=0, max_size=6))


def _try_encode(ty: Any, value: Any) -> bytes:
    try:
        return PY.compile_type(type_bytes(ty)).encode(json.dumps(value).encode())
    except CodecError:
        return b""


# --- invalid type specifications ---------------------------------------------------------------------

TYPE_WORDS = ["string", "number", "bool", "dynamic", "list", "set", "map", "object", "tuple", "any", "String", ""]


@st.composite
def type_spec(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 4))
    if kind == 0:  # random JSON built from type words: mostly malformed specs
        words = st.sampled_from(TYPE_WORDS)
        spec = draw(st.recursive(words | SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=3),
                                 max_leaves=10))
        return json.dumps(spec).encode()
    if kind == 1:  # a valid type with one node replaced by junk
        spec = draw(TYPES)
        junk = draw(SCALARS | st.sampled_from([["list"], ["object"], ["object", [], []], ["object", {}, "a"], ["tuple", {}],
                                               ["object", {"a": "string"}, ["b"]], ["object", {"a": "string"}, ["a", "a"]],
                                               ["map", "string", "extra"], {"list": "string"}]))
        return json.dumps(_replace_random_node(spec, junk, draw)).encode()
    if kind == 2:
        return type_bytes(nested_type(draw(st.integers(MAX_DEPTH - 2, MAX_DEPTH + 5))))
    if kind == 3:
        return draw(json_text())
    return type_bytes(draw(TYPES))


def _replace_random_node(spec: Any, junk: Any, draw: st.DrawFn) -> Any:
    if isinstance(spec, str) or draw(st.integers(0, 2)) == 0:
        return junk
    if spec[0] in ("list", "set", "map"):
        return [spec[0], _replace_random_node(spec[1], junk, draw)]
    if spec[0] == "tuple":
        if not spec[1]:
            return junk
        i = draw(st.integers(0, len(spec[1]) - 1))
        return ["tuple", [_replace_random_node(t, junk, draw) if n == i else t for n, t in enumerate(spec[1])]]
    if not spec[1]:
        return junk
    key = draw(st.sampled_from(sorted(spec[1])))
    return [spec[0], {k: _replace_random_node(t, junk, draw) if k == key else t for k, t in spec[1].items()}, *spec[2:]]


# --- the targets --------------------------------------------------------------------------------------


def _compiled(ty: Any, tally: Tally) -> tuple[Any, Any] | None:
    spec = type_bytes(ty)
    result = both(lambda impl: impl.compile_type(spec), tally, f"compile_type({spec!r})")
    if result[0] == "error":
        return None  # past the depth limit: both refused the type with a CodecError
    return PY.compile_type(spec), RS.compile_type(spec)


def test_fuzz_decode_random_wire_bytes(record_property: RecordProperty) -> None:
    tally = Tally("codec decode: random msgpack against random types (python+rust)")

    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        ty = data.draw(TYPE_OR_DEEP, label="type")
        compiled = _compiled(ty, tally)
        wire = data.draw(wire_bytes(ty), label="wire")
        if compiled is None:
            tally.count("type refused")
            return
        py_t, rs_t = compiled
        result = both(lambda impl: (py_t if impl is PY else rs_t).decode(wire), tally, f"decode({wire!r}) as {type_bytes(ty)!r}")
        if result[0] == "ok":  # a decoded value is canonical JSON that encodes back
            json.loads(result[1])
        tally.count(result[0])

    with hang_guard():
        run()
    tally.finish(record_property)


def test_fuzz_encode_random_json(record_property: RecordProperty) -> None:
    tally = Tally("codec encode: random (mostly ill-typed) JSON against random types (python+rust)")

    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        ty = data.draw(TYPE_OR_DEEP, label="type")
        compiled = _compiled(ty, tally)
        if data.draw(st.booleans()):
            text = json.dumps(data.draw(shaped_json(ty if compiled else "dynamic")), ensure_ascii=data.draw(st.booleans())).encode()
        else:
            text = data.draw(json_text())
        if compiled is None:
            tally.count("type refused")
            return
        py_t, rs_t = compiled
        result = both(lambda impl: (py_t if impl is PY else rs_t).encode(text), tally, f"encode({text!r}) as {type_bytes(ty)!r}")
        if result[0] == "ok":  # what was accepted must decode again, identically in both backends
            both(lambda impl: (py_t if impl is PY else rs_t).decode(result[1]), tally, f"decode(encode({text!r}))")
        tally.count(result[0])

    with hang_guard():
        run()
    tally.finish(record_property)


def test_fuzz_compile_random_type_specs(record_property: RecordProperty) -> None:
    tally = Tally("codec compile_type: random type specifications (python+rust)")

    @FUZZ
    @given(type_spec(), st.data())
    def run(spec: bytes, data: st.DataObject) -> None:
        result = both(lambda impl: impl.compile_type(spec), tally, f"compile_type({spec!r})")
        tally.count(result[0])
        if result[0] == "ok":  # a type both accepted must then handle a null and garbage alike
            py_t, rs_t = PY.compile_type(spec), RS.compile_type(spec)
            assert py_t.type_json == rs_t.type_json, spec
            for blob in (b"\xc0", data.draw(st.binary(max_size=20))):
                both(lambda impl, blob=blob: (py_t if impl is PY else rs_t).decode(blob), tally, f"decode({blob!r}) as {spec!r}")
            both(lambda impl: (py_t if impl is PY else rs_t).encode(b"null"), tally, f"encode(null) as {spec!r}")

    with hang_guard():
        run()
    tally.finish(record_property)


def test_nan_and_infinity_in_floats_do_not_escape_as_other_errors() -> None:
    """msgpack float NaN/inf on the wire for a number: a value or a CodecError, the same in both."""
    tally = Tally("nan")
    for value in (math.nan, math.inf, -math.inf):
        for spec in (b'"number"', b'"dynamic"', b'["list","number"]'):
            wire = msgpack.packb([value] if spec.startswith(b"[") else value)
            both(lambda impl, spec=spec, wire=wire: impl.compile_type(spec).decode(wire), tally, f"decode({wire!r}) as {spec!r}")


def test_attribute_names_with_line_breaks_keep_messages_one_line() -> None:
    """Found by the encode target (random seed): the error path quotes an attribute name as it is,
    so a name holding a newline split the message over two lines, in both backends alike."""
    tally = Tally("regression")
    for spec, text in ((b'["object",{"\\n":"number"}]', b'{"\\n": false}'),
                       (b'["object",{"a\\r\\nb":["list","string"]}]', b'{"a\\r\\nb": [1]}'),
                       (b'["map",["object",{"\\n":"bool"}]]', b'{"k\\n": {"\\n": 3}}')):
        kind, message = both(lambda impl, spec=spec, text=text: impl.compile_type(spec).encode(text), tally, f"encode({text!r}) as {spec!r}")
        assert kind == "error" and "\\n" in message, message
