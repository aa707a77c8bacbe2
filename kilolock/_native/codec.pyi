"""The Rust codec backend (codec_rs/src/, all but transport.rs and p256.rs): the same API as
kilolock.codec.pure, both typed by kilolock.codec.abc; its errors are kilolock.codec.errors.CodecError."""
from typing import final

__version__: str
MAX_DEPTH: int

@final
class CodecType:
    @property
    def type_json(self) -> bytes:
        """The canonical JSON type specification."""
    def encode(self, json_bytes: bytes | bytearray) -> bytes:
        """cty JSON -> msgpack exactly as go-cty writes it."""
    def decode(self, msgpack_bytes: bytes | bytearray) -> bytes:
        """msgpack -> canonical cty JSON (sorted keys, compact, exact numbers)."""

def compile_type(type_json: bytes | bytearray) -> CodecType:
    """Compile Terraform's JSON type syntax into a reusable codec type."""
