"""The codec's single exception type, shared by both backends.

The Rust extension imports this class and raises it, so ``except codec.CodecError`` catches
failures from either backend alike.
"""
from __future__ import annotations

from kilolock.errors import KlError, one_line
from kilolock.schema import AttributePath, GetAttr, Index, PathStep, path_display

# Nesting limit for values and type specifications, identical in both backends (the Rust crate
# exposes its own copy as ``MAX_DEPTH`` and a test checks they agree). Real provider schemas
# nest a handful of levels; 64 leaves headroom while keeping recursion bounded.
MAX_DEPTH = 64


class CodecError(KlError):
    """A value or type that does not fit. The message starts with the path where it went wrong, in
    Terraform's form (``rules[3].cidr: expected string, got number``); an error about the whole
    value is the message alone (``expected object, got array``), as Terraform prints one."""

    def __init__(self, message: str = "") -> None:
        # Paths name attributes as they are, and an attribute name may hold a line break: the one
        # place both backends' messages pass (the Rust one constructs this class too) keeps them one line.
        super().__init__(one_line(str(message)))


class PathError(Exception):
    """Internal: an error that collects path steps while it unwinds to the API boundary, where
    ``schema.path_display`` (the one printed form of a path) renders them. The Rust backend's
    ``PathError::render`` writes the same text; the shared vectors hold both to it."""

    __slots__ = ("message", "segments")

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.segments: list[PathStep] = []  # innermost first

    def attr(self, name: str) -> None:
        self.segments.append(GetAttr(name))

    def index(self, key: int | str) -> None:
        self.segments.append(Index(key))

    def to_codec_error(self) -> CodecError:
        path: AttributePath = tuple(reversed(self.segments))
        return CodecError(f"{path_display(path)}: {self.message}" if path else self.message)


def too_deep() -> PathError:
    return PathError(f"nested deeper than {MAX_DEPTH} levels")
