"""The provider channel through grpcio: kl's transport where the Rust extension is not built, and
where KL_PROVIDER_TRANSPORT=grpcio asks for it. The only module that imports grpc for the
blocking calls (``open_aio`` adds grpc.aio for the event loop's reads).

grpcio cannot complete AutoMTLS with current Go providers (TLS 1.3 with a P-521 certificate: its
BoringSSL does not offer ecdsa_secp521r1_sha512, grpc/grpc#41089); kilolock.provider.connection
then falls back to plaintext on a private socket.
"""
from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any, cast

# grpc's C core prints a line on stderr for every failed TLS handshake, and the AutoMTLS fallback
# makes that routine with this client; kl reports it through logging instead. Only a default: an
# operator's own GRPC_VERBOSITY wins, and it must be set before grpc is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc
import grpc.aio

from kilolock.provider.certs import der_to_pem
from kilolock.provider.rpc import RpcError, StatusCode, Tls

CLIENT_ID = f"grpcio {grpc.__version__}"


def rpc_error(exc: grpc.RpcError) -> RpcError:
    # Every RpcError grpcio's calls raise is also a grpc.Call, which carries the status.
    call = cast(grpc.Call, exc)
    return RpcError(StatusCode.of(call.code().value[0]), call.details() or "")


def _options(tls: Tls | None, max_message_bytes: int) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    if tls is not None:
        options.append(("grpc.ssl_target_name_override", "localhost"))
    return options


def _credentials(tls: Tls) -> grpc.ChannelCredentials:
    server_der, cert_pem, key_pem = tls
    return grpc.ssl_channel_credentials(root_certificates=der_to_pem(server_der), private_key=key_pem,
                                        certificate_chain=cert_pem)


class GrpcioChannel:
    transport = "grpcio"

    def __init__(self, target: str, max_message_bytes: int, tls: Tls | None = None) -> None:
        self._target, self._max, self._tls = target, max_message_bytes, tls
        options = _options(tls, max_message_bytes)
        if tls is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, _credentials(tls), options=options)
        self._calls: dict[str, grpc.UnaryUnaryMultiCallable[bytes, bytes]] = {}

    def unary(self, path: str, request: bytes, timeout: float | None = None) -> bytes:
        call = self._calls.get(path)
        if call is None:  # identity (de)serializers: bytes in, bytes out
            call = self._calls.setdefault(path, self._channel.unary_unary(path, None, None))
        try:
            answer: bytes = call(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise rpc_error(exc) from None
        return answer

    def stream(self, path: str, request: bytes) -> Generator[bytes, None, None]:
        call = self._channel.unary_stream(path, None, None)(request)
        try:
            yield from call
        except grpc.RpcError as exc:
            raise rpc_error(exc) from None
        finally:
            call.cancel()  # type: ignore[no-untyped-call]  # a reader that stops early ends the call (a no-op once it ended)

    def open_aio(self) -> grpc.aio.Channel:
        """A grpc.aio channel to the same plugin, bound to the running event loop, which must close it."""
        options = _options(self._tls, self._max)
        if self._tls is None:
            return grpc.aio.insecure_channel(self._target, options=options)
        return grpc.aio.secure_channel(self._target, _credentials(self._tls), options=options)

    def close(self) -> None:
        self._channel.close()


class AioCalls:
    """The event loop's ReadResource calls through grpc.aio, on a second channel to the plugin:
    opened and closed in that loop (the channel binds to it)."""

    def __init__(self, channel: GrpcioChannel) -> None:
        self._channel = channel.open_aio()
        self._calls: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {}

    async def call(self, path: str, message: bytes, timeout: float | None) -> bytes:
        call = self._calls.get(path)
        if call is None:
            call = self._calls.setdefault(path, self._channel.unary_unary(path, None, None))
        try:
            answer: bytes = await call(message, timeout=timeout)
        except grpc.RpcError as exc:
            raise rpc_error(exc) from None
        return answer

    async def aclose(self) -> None:
        await self._channel.close(None)
