"""The codec API as types (as psycopg's ``pq/abc.py`` is for its libpq wrappers): what each
backend, the Rust extension's ``kilolock._native.codec`` and the pure-Python ``kilolock.codec.pure``,
provides, so callers and ``kilolock.codec`` type-check against one interface."""
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class CodecType(Protocol):
    """A compiled cty type: ``_native.codec.CodecType`` or ``pure.CodecType``."""

    @property
    def type_json(self) -> bytes:
        """The canonical JSON type specification."""
        ...

    def encode(self, json_bytes: bytes | bytearray) -> bytes:
        """cty JSON -> msgpack exactly as go-cty writes it; ``CodecError`` if it does not fit."""
        ...

    def decode(self, msgpack_bytes: bytes | bytearray) -> bytes:
        """msgpack -> canonical cty JSON; ``CodecError`` if it does not fit."""
        ...


@runtime_checkable
class Backend(Protocol):
    """A codec backend module."""

    def compile_type(self, type_json: bytes | bytearray) -> CodecType:
        """Compile Terraform's JSON type syntax; ``CodecError`` if it is not one."""
        ...
