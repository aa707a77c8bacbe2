"""The codec's single exception type, shared by both backends.

The Rust extension imports this class and raises it, so ``except codec.CodecError`` catches
failures from either backend alike.
"""
from __future__ import annotations

from kilolock.errors import KlError, one_line

# Nesting limit for values and type specifications, identical in both backends (the Rust crate
# exposes its own copy as ``MAX_DEPTH`` and a test checks they agree). Real provider schemas
# nest a handful of levels; 64 leaves headroom while keeping recursion bounded.
MAX_DEPTH = 64


class CodecError(KlError):
    """A value or type that does not fit; the message starts with the path (``.rules[3].cidr:``)."""

    def __init__(self, message: str = "") -> None:
        # Paths name attributes as they are, and an attribute name may hold a line break: the one
        # place both backends' messages pass (the Rust one constructs this class too) keeps them one line.
        super().__init__(one_line(str(message)))


class PathError(Exception):
    """Internal: an error that collects path segments while it unwinds to the API boundary."""

    __slots__ = ("message", "segments")

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.segments: list[str] = []

    def to_codec_error(self) -> CodecError:
        path = "".join(reversed(self.segments)) or "(root)"
        return CodecError(f"{path}: {self.message}")


def too_deep() -> PathError:
    return PathError(f"nested deeper than {MAX_DEPTH} levels")
