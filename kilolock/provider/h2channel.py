"""The provider channel through kl's own HTTP/2 client (kilolock._native.transport.H2Channel: codec_rs/src/
transport.rs, the h2 crate on a one-thread tokio runtime, outside the GIL): the default transport
where the extension is built.

``NativeChannel`` serves the blocking calls (schema, configure, the reader threads' ReadResource,
StreamStdio, Shutdown) and ``H2Calls`` the event loop's ReadResource calls over the same
connection. Through grpc.aio each of those cost the loop ~120 µs of CPU in grpc's own Python and
Cython, more than everything kl does per instance; here the answers come back in batches through
one file descriptor the loop watches. A refresh over this channel never imports grpc (~25-35 ms of
a small refresh's CPU), and its TLS handshake runs without the GIL while kl imports.

AutoMTLS is rustls with aws-lc, pinned to the certificate of the plugin's handshake: it completes
TLS 1.3 with the P-521 certificates of current Go providers, which grpcio cannot.
"""
from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Generator
from types import ModuleType
from typing import Any

from kilolock.provider.rpc import RpcError, StatusCode, Tls

_STREAM_POLL = 0.5  # seconds: how long one wait of a stream reader lasts (it waits again)


def native_module() -> ModuleType | None:
    """The extension's HTTP/2 client (kilolock._native.transport), when it is built. Independent of KL_CODEC, which
    chooses the codec's backend only: KL_PROVIDER_TRANSPORT=grpcio is the transport's own switch."""
    try:
        from kilolock._native import transport
    except ImportError:
        return None
    return transport


class NativeChannel:
    transport = "native"

    def __init__(self, native: ModuleType, target: str, max_message_bytes: int, tls: Tls | None = None) -> None:
        """Connects (TCP or unix socket, TLS, the HTTP/2 preface) without holding the GIL. Raises
        OSError when it cannot."""
        self.h2: Any = native.H2Channel(target, max_message_bytes, tls)
        self.ids = itertools.count()  # the event loop's call ids, unique over the channel's life

    def unary(self, path: str, request: bytes, timeout: float | None = None) -> bytes:
        code, payload = self.h2.call_blocking(path, request, timeout)
        if code:
            raise RpcError(StatusCode.of(code), payload)
        answer: bytes = payload
        return answer

    def stream(self, path: str, request: bytes) -> Generator[bytes, None, None]:
        stream = self.h2.stream(path, request)
        while True:
            event = stream.recv(_STREAM_POLL)
            if event is None:
                continue
            if isinstance(event, bytes):
                yield event
                continue
            code, details = event
            if code:
                raise RpcError(StatusCode.of(code), details)
            return

    def close(self) -> None:
        self.h2.close()


class H2Calls:
    """Unary calls over a NativeChannel from the running event loop; open and close it in that
    loop. Closing it leaves the channel open (its owner, the plugin connection, closes that); one
    H2Calls at a time per channel, since it drains the channel's completions."""

    def __init__(self, channel: NativeChannel) -> None:
        self._channel = channel.h2
        self._loop = asyncio.get_running_loop()
        self._fd: int = self._channel.wake_fd()
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._ids = channel.ids
        self._closed = False
        self._flush_pending = False
        self._channel.drain()  # late answers to an earlier H2Calls' cancelled calls
        self._loop.add_reader(self._fd, self._on_wake)

    async def call(self, path: str, message: bytes, timeout: float | None) -> bytes:
        if self._closed:  # nothing would ever read its completion
            raise RpcError(StatusCode.UNAVAILABLE, "the channel is closed")
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
                future.set_exception(RpcError(StatusCode.of(code), payload))

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Stops reading answers in this loop; calls still waiting fail with CANCELLED."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(RpcError(StatusCode.CANCELLED, "the calls were closed"))
        self._waiting.clear()
