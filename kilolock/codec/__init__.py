"""The cty codec: cty JSON (as Terraform writes state) <-> cty msgpack (as providers speak it).

Two backends with one API (typed in ``kilolock.codec.abc``) and byte-identical output: the Rust
extension's ``kilolock._native.codec`` and the pure-Python ``kilolock.codec.pure``, laid out alike (see
its docstring). ``KL_CODEC=rust|python`` forces one (a forced backend that cannot load is an error
that says why); unset, Rust is used when it imports.

    t = codec.compile_type(b'["object",{"id":"string"}]')
    t.encode(json_bytes) -> msgpack bytes;  t.decode(msgpack_bytes) -> canonical JSON bytes

Canonical JSON is the same bytes for the same value: keys sorted by UTF-8 bytes, compact, numbers
in go-cty's fixed notation (a float64 from the wire as go-cty's 53-bit big.Float prints it, as
Terraform writes state), strings NFC, sets sorted (primitives in cty's order, other elements by
their canonical text) and deduplicated, dynamic values with the type their value has.
``t.decode(t.encode(x))`` is the canonical form of a JSON value ``x``. docs/paths-and-values.md
("Values: what Terraform would write") says where and why it differs from go-cty.

Rust dev build (the .so is gitignored):
    cargo build --release --manifest-path codec_rs/Cargo.toml
    cp codec_rs/target/release/lib_native.so kilolock/_native.abi3.so
"""
from __future__ import annotations

import os

from kilolock.codec.abc import Backend, CodecType
from kilolock.codec.blocks import block_type_json
from kilolock.codec.errors import MAX_DEPTH, CodecError
from kilolock.schema import Block


def _load_rust() -> Backend:
    from kilolock._native import codec

    return codec


def _select() -> tuple[str, Backend]:
    forced = os.environ.get("KL_CODEC", "")
    if forced == "python":
        from kilolock.codec import pure

        return "python", pure
    if forced == "rust":
        try:
            return "rust", _load_rust()
        except ImportError as exc:
            raise CodecError(f"KL_CODEC=rust but the Rust codec cannot be loaded: {exc}") from None
    if forced:
        raise CodecError(f"KL_CODEC={forced!r} is not a codec backend (use 'rust' or 'python')")
    try:
        return "rust", _load_rust()
    except ImportError:
        from kilolock.codec import pure

        return "python", pure


backend, __impl__ = _select()


def compile_type(type_json: bytes) -> CodecType:
    """Compile Terraform's JSON type syntax into a reusable codec type (``encode``/``decode``)."""
    return __impl__.compile_type(type_json)


def compile_block(block: Block) -> CodecType:
    """Compile a provider schema block's implied type (nested blocks, nested attributes)."""
    return __impl__.compile_type(block_type_json(block))


__all__ = [
    "MAX_DEPTH",
    "CodecError",
    "CodecType",
    "backend",
    "block_type_json",
    "compile_block",
    "compile_type",
]
