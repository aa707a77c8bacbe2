"""Which client carries a plugin's gRPC calls: kl's own HTTP/2 client where the Rust extension is
built ("native", kilolock.provider.h2channel), else grpcio ("grpcio", kilolock.provider.
grpcio_channel). KL_PROVIDER_TRANSPORT=grpcio asks for grpcio; =native (the default) falls back to
grpcio without the extension.

Imports neither client at module level: grpc loads only when grpcio is chosen.
"""
from __future__ import annotations

from kilolock.errors import env_choice
from kilolock.provider.h2channel import NativeChannel, native_module
from kilolock.provider.rpc import Channel, Tls

VARIABLE = "KL_PROVIDER_TRANSPORT"
TRANSPORTS = ("native", "grpcio")


def chosen() -> str:
    """The transport this process uses; KlError naming the variable when its value is unknown."""
    value = env_choice(VARIABLE, TRANSPORTS)
    if value == "native" and native_module() is None:
        return "grpcio"
    return value


def client_id(transport: str) -> str:
    """The client and its version, as tlsmemo records a failed AutoMTLS attempt under it (a new
    version of the client gets a fresh attempt). For grpcio this imports grpc."""
    if transport == "native":
        native = native_module()
        assert native is not None
        return f"kl-h2 {native.__version__}"
    from kilolock.provider.grpcio_channel import CLIENT_ID

    return CLIENT_ID


def open_channel(transport: str, target: str, max_message_bytes: int, tls: Tls | None) -> Channel:
    """A connected channel (the native client connects, and completes TLS, here; grpcio at its
    first call). Raises OSError when the native client cannot connect."""
    native = native_module() if transport == "native" else None
    if native is not None:
        return NativeChannel(native, target, max_message_bytes, tls)
    from kilolock.provider.grpcio_channel import GrpcioChannel

    return GrpcioChannel(target, max_message_bytes, tls)
