"""The pure-Python backend: cty JSON <-> cty msgpack, driven by a compiled type.

Its modules and functions are the Rust crate's (codec_rs/src), so the two read side by side:

    pure/__init__.py  CodecType, compile_type    lib.rs (the Python bindings)
    pure/mp.py        msgpack writer and Reader  mp.rs
    pure/marshal.py   JSON -> msgpack            marshal.rs
    pure/unmarshal.py msgpack -> JSON            unmarshal.rs
    pure/types.py     CtyType, parse_type        types.rs
    pure/numbers.py   exact decimals             numbers.rs
    pure/jsontext.py  strict JSON, quoting       jsontext.rs
    codec/errors.py   PathError, MAX_DEPTH       errors.rs (and the CodecError both raise)

Rust alone has order.rs: the bookkeeping that Python's dicts and ``sorted()`` do here.
Errors are raised as ``PathError`` at the failing value and collect path steps on their way out;
this module's API boundary turns one into a ``CodecError`` naming the full path, as lib.rs does.
"""
from __future__ import annotations

from kilolock.codec.errors import CodecError, PathError
from kilolock.codec.pure.marshal import encode
from kilolock.codec.pure.types import CtyType, parse_type
from kilolock.codec.pure.unmarshal import decode


def _as_bytes(data: object) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray):
        return bytes(data)
    raise PathError(f"expected bytes, got {type(data).__name__}")


class CodecType:
    """A compiled type with the codec's two operations."""

    __slots__ = ("_type",)

    def __init__(self, cty_type: CtyType) -> None:
        self._type = cty_type

    @property
    def type_json(self) -> bytes:
        """The canonical JSON type specification."""
        return self._type.json.encode()

    def encode(self, json_bytes: bytes | bytearray) -> bytes:
        """cty JSON -> msgpack exactly as go-cty writes it."""
        try:
            return encode(_as_bytes(json_bytes), self._type)
        except PathError as exc:
            raise exc.to_codec_error() from None

    def decode(self, msgpack_bytes: bytes | bytearray) -> bytes:
        """msgpack -> canonical cty JSON (sorted keys, compact, exact numbers)."""
        try:
            return decode(_as_bytes(msgpack_bytes), self._type)
        except PathError as exc:
            raise exc.to_codec_error() from None


def compile_type(type_json: bytes | bytearray) -> CodecType:
    """Compile Terraform's JSON type syntax into a reusable codec type."""
    try:
        return CodecType(parse_type(_as_bytes(type_json)))
    except PathError as exc:
        raise exc.to_codec_error() from None


__all__ = ["CodecError", "CodecType", "compile_type"]
