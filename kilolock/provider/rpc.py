"""The RPC layer under the provider client: a channel that moves message bytes, and its errors.

A plugin's gRPC calls go through one of two clients (``transport``): kl's own HTTP/2 client in the
Rust extension (``h2channel.NativeChannel``, the default where the extension is built), or grpcio
(``grpcio_channel.GrpcioChannel``, without the extension or with KL_PROVIDER_TRANSPORT=grpcio).
Both build on this module, which imports neither, so the client above them treats both alike and
a refresh that uses the native client never imports grpc.
"""
from __future__ import annotations

import enum
from collections.abc import Generator
from typing import Protocol

Tls = tuple[bytes, bytes, bytes]  # (server certificate DER, client certificate PEM, client key PEM)


class StatusCode(enum.IntEnum):
    """gRPC status codes (grpc/doc/statuscodes.md)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

    @classmethod
    def of(cls, code: int) -> StatusCode:
        try:
            return cls(code)
        except ValueError:
            return cls.UNKNOWN


class RpcError(Exception):
    """A call that ended with a status other than OK."""

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class Channel(Protocol):
    """A connection to one plugin's gRPC server; safe to use from many threads at once."""

    @property
    def transport(self) -> str:
        """Which client this is: "native" or "grpcio"."""

    def unary(self, path: str, request: bytes, timeout: float | None = None) -> bytes:
        """Call ``path`` ("/package.Service/Method") with the serialized request; the answer's
        bytes. Raises RpcError."""

    def stream(self, path: str, request: bytes) -> Generator[bytes, None, None]:
        """A server-streaming call: each message's bytes as it comes. Ends when the server ends
        the call with OK; raises RpcError otherwise (CANCELLED when the channel closes). Closing
        the generator before its end cancels the call."""

    def close(self) -> None:
        """Ends the connection; calls in flight fail."""
