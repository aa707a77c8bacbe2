"""Unary gRPC calls through the native extension's HTTP/2 client, awaited from an asyncio loop.

The refresh's event-loop path makes thousands of ReadResource calls; through grpc.aio each one
costs the loop ~120 µs of CPU in grpc's own Python and Cython, more than everything kl does per
instance. ``H2Calls`` hands the request bytes to ``kilolock._codec_rs.H2Channel`` (codec_rs/src/
transport.rs: the h2 crate on a one-thread tokio runtime, outside the GIL) and gets the answers
back in batches, through one file descriptor the loop watches.

It speaks to the plugin as kl's grpcio channel does: AutoMTLS with the same certificates where
that channel completed it (rustls, pinned to the certificate of the plugin's handshake), plaintext
on the private socket where that channel is plaintext. Without the native extension, reads stay on
grpc.aio, as they do where the orchestrator asks for grpc.aio (KL_READ_TRANSPORT=grpcio).
"""
from __future__ import annotations

import asyncio
import itertools
import os
from types import ModuleType

import grpc

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def native_module() -> ModuleType | None:
    """The extension, when it is built and has the HTTP/2 client. Independent of KL_CODEC, which
    chooses the codec's backend only: KL_READ_TRANSPORT=grpcio is the transport's own switch."""
    try:
        from kilolock import _codec_rs
    except ImportError:
        return None
    return _codec_rs if hasattr(_codec_rs, "H2Channel") else None


class H2RpcError(grpc.RpcError):
    """A failed call, with grpc.RpcError's code() and details() so callers treat both alike."""

    def __init__(self, code: int, details: str) -> None:
        super().__init__(details)
        self._code = _CODES.get(code, grpc.StatusCode.UNKNOWN)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class H2Calls:
    """Unary calls to one plugin from the running event loop; open and close it in that loop."""

    def __init__(self, native: ModuleType, target: str, max_message_bytes: int,
                 tls: tuple[bytes, bytes, bytes] | None = None) -> None:
        """``tls``: (server certificate DER, client certificate PEM, client key PEM) for AutoMTLS.
        Raises OSError when it cannot connect."""
        self._channel = native.H2Channel(target, max_message_bytes, tls)
        self._loop = asyncio.get_running_loop()
        self._fd: int = self._channel.wake_fd()
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._ids = itertools.count()
        self._closed = False
        self._flush_pending = False
        self._loop.add_reader(self._fd, self._on_wake)

    async def call(self, path: str, message: bytes, timeout: float | None) -> bytes:
        if self._closed:  # nothing would ever read its completion
            raise H2RpcError(grpc.StatusCode.UNAVAILABLE.value[0], "the channel is closed")
        call_id = next(self._ids)
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._waiting[call_id] = future
        self._channel.call(call_id, path, message, timeout)
        if not self._flush_pending:  # one flush for every call this turn of the loop makes
            self._flush_pending = True
            self._loop.call_soon(self._flush)
        try:
            return await future
        finally:
            self._waiting.pop(call_id, None)  # cancelled: its late answer is dropped

    def _flush(self) -> None:
        self._flush_pending = False
        self._channel.flush()

    def _on_wake(self) -> None:
        try:
            os.read(self._fd, 4096)
        except BlockingIOError:
            pass
        waiting = self._waiting
        for call_id, code, payload in self._channel.drain():
            future = waiting.pop(call_id, None)
            if future is None or future.done():
                continue
            if code == 0:
                future.set_result(payload)
            else:
                future.set_exception(H2RpcError(code, payload))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._channel.close()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(H2RpcError(grpc.StatusCode.CANCELLED.value[0], "the channel was closed"))
        self._waiting.clear()
