"""The native HTTP/2 client for the event loop's reads (kilolock.provider.h2channel over
codec_rs/src/transport.rs), against the fake provider, a grpcio server: the same answers and the
same errors as grpc.aio, over AutoMTLS and plaintext, on both protocols; deadlines, crashes,
cancellation and close end every call; a certificate that is not the plugin's is refused. The
real Go providers go through it in tests/refresh (test_read_paths, test_refresh_real)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, TypeVar

import grpc
import msgpack
import pytest

from kilolock.provider import ProviderCallError, ProviderDiagnosticsError, launch_provider
from kilolock.provider import client as provider_client
from kilolock.provider.certs import generate_client_certificate, process_client_certificate
from kilolock.provider.client import AsyncReads, GrpcProviderClient
from kilolock.provider.connection import MAX_MESSAGE_BYTES
from kilolock.provider.h2channel import H2Calls, H2RpcError, native_module

T = TypeVar("T")
TRANSPORTS = ["native", "grpcio"]


@pytest.fixture(scope="module")
def native() -> ModuleType:
    module = native_module()
    if module is None:
        pytest.fail("kilolock._codec_rs has no H2Channel: build the extension (scripts/setup-dev.sh, or "
                    "`cd codec_rs && cargo build --release` and copy it to kilolock/_codec_rs.abi3.so)")
    return module


def in_loop(client: Any, transport: str, use: Callable[[AsyncReads], Awaitable[T]]) -> T:
    """USE(reads) in a fresh event loop, with reads opened and closed there."""
    async def main() -> T:
        reads = client.async_reads(native=transport == "native")
        try:
            assert reads.transport == transport
            return await use(reads)
        finally:
            await reads.aclose()
    return asyncio.run(main())


def read(client: Any, transport: str, type_name: str, state: bytes, private: bytes = b"", **kw: Any) -> Any:
    return in_loop(client, transport, lambda r: r.read_resource(type_name, state, private, **kw))


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("tls", [True, False], ids=["automtls", "plaintext"])
@pytest.mark.parametrize("proto", [5, 6])
def test_answers_are_the_blocking_clients(fake_binary, proto: int, tls: bool, transport: str) -> None:
    with launch_provider(fake_binary(proto=proto), tls=tls) as client:
        assert client.connection.tls is tls  # type: ignore[attr-defined]
        state = msgpack.packb({"id": "1", "rule": [], "secret": None, "value": "v"})
        ident = msgpack.packb({"id": "1", "region": None})
        for args, kw in (((("fake_echo", state, b"p")), {}), (("fake_sensitive", msgpack.packb({"id": "1"})), {}),
                         (("fake_echo", msgpack.packb({"id": "1"})), {"current_identity": ident}),
                         (("fake_gone", msgpack.packb({"id": "1"})), {})):
            assert read(client, transport, *args, **kw) == client.read_resource(*args, **kw), args


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_errors_read_as_the_blocking_clients(fake_binary, transport: str) -> None:
    with launch_provider(fake_binary(proto=6, FAKE_SLOW_SECONDS="30"), tls=True, rpc_timeout=0.5) as client:
        with pytest.raises(ProviderDiagnosticsError) as blocking:
            client.read_resource("fake_error", msgpack.packb({"id": "1"}))
        with pytest.raises(ProviderDiagnosticsError) as looped:
            read(client, transport, "fake_error", msgpack.packb({"id": "1"}))
        assert str(looped.value) == str(blocking.value) and looped.value.diagnostics == blocking.value.diagnostics
        started = time.monotonic()
        with pytest.raises(ProviderCallError, match=r"^provider fake: ReadResource did not answer within 0.5s$"):
            read(client, transport, "fake_slow", msgpack.packb({"id": "1"}))
        assert time.monotonic() - started < 3
        assert read(client, transport, "fake_echo", msgpack.packb({"id": "1"})).new_state  # the connection lives on


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_crash_mid_call_names_the_exit(fake_binary, transport: str) -> None:
    client = launch_provider(fake_binary(), tls=True)
    try:
        with pytest.raises(ProviderCallError) as err:
            read(client, transport, "fake_crash", msgpack.packb({"id": "1"}))
        assert "the plugin exited during ReadResource (exit status 2)" in str(err.value), str(err.value)
    finally:
        client.close()


@pytest.mark.usefixtures("native")
def test_many_calls_in_flight_each_get_their_own_answer(fake_binary) -> None:
    with launch_provider(fake_binary(), tls=True) as client:
        async def many(reads: AsyncReads) -> list[Any]:
            return list(await asyncio.gather(*(reads.read_resource("fake_echo", msgpack.packb({"id": str(n)}), f"p{n}".encode())
                                               for n in range(300))))
        results = in_loop(client, "native", many)
    assert [msgpack.unpackb(r.new_state)["id"] for r in results] == [str(n) for n in range(300)]
    assert [r.private for r in results] == [f"p{n}+read".encode() for n in range(300)]


def test_statuses_are_grpcs_and_close_ends_what_is_in_flight(native, fake_binary) -> None:
    with launch_provider(fake_binary(FAKE_SLOW_SECONDS="30"), tls=False) as client:
        target = client.connection.process.handshake.grpc_target  # type: ignore[attr-defined]

        async def main() -> None:
            calls = H2Calls(native, target, MAX_MESSAGE_BYTES)
            with pytest.raises(H2RpcError) as err:
                await calls.call("/tfplugin5.Provider/NoSuchMethod", b"", 5.0)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
            # A cancelled call's late answer is dropped; the next call is unaffected.
            slow = asyncio.ensure_future(calls.call("/tfplugin5.Provider/ReadResource", _read_request(client, "fake_slow"), None))
            await asyncio.sleep(0.2)
            slow.cancel()
            answer = await calls.call("/tfplugin5.Provider/ReadResource", _read_request(client, "fake_echo"), 5.0)
            assert b"+read" in answer
            pending = asyncio.ensure_future(calls.call("/tfplugin5.Provider/ReadResource", _read_request(client, "fake_slow"), None))
            await asyncio.sleep(0.2)
            started = time.monotonic()
            calls.close()
            with pytest.raises(H2RpcError) as closed:
                await pending
            assert closed.value.code() == grpc.StatusCode.CANCELLED and time.monotonic() - started < 1
            with pytest.raises(H2RpcError) as after:  # a closed channel fails at once, not never
                await asyncio.wait_for(calls.call("/tfplugin5.Provider/ReadResource", b"", None), 1)
            assert after.value.code() == grpc.StatusCode.UNAVAILABLE
        asyncio.run(main())


def _read_request(client: Any, type_name: str) -> bytes:
    assert isinstance(client, GrpcProviderClient)
    return client._read_request(type_name, msgpack.packb({"id": "1"}), b"", None, None)


def test_only_the_plugins_own_certificate_is_accepted(native, fake_binary) -> None:
    with launch_provider(fake_binary(), tls=True) as client:
        hs = client.connection.process.handshake  # type: ignore[attr-defined]
        ours = process_client_certificate()
        other = generate_client_certificate()
        with pytest.raises(OSError, match="TLS handshake with unix:.* failed: invalid peer certificate"):
            native.H2Channel(hs.grpc_target, MAX_MESSAGE_BYTES, (other.cert_der, ours.cert_pem, ours.key_pem))
        with pytest.raises(OSError, match="cannot connect to unix:/nonexistent/sock"):
            native.H2Channel("unix:/nonexistent/sock", MAX_MESSAGE_BYTES, None)
        native.H2Channel(hs.grpc_target, MAX_MESSAGE_BYTES, (hs.server_cert_der, ours.cert_pem, ours.key_pem)).close()


@pytest.mark.usefixtures("native")
def test_reads_fall_back_to_grpc_aio_when_the_native_client_cannot_connect(fake_binary, monkeypatch, caplog) -> None:
    def refuse(*args: Any) -> Any:
        raise OSError("cannot connect to somewhere: refused")
    monkeypatch.setattr(provider_client.h2channel, "native_module", lambda: SimpleNamespace(H2Channel=refuse))
    caplog.set_level(logging.INFO, logger="kilolock.provider.client")
    with launch_provider(fake_binary(), tls=False) as client:
        async def one(reads: AsyncReads) -> Any:
            assert reads.transport == "grpcio"
            return await reads.read_resource("fake_echo", msgpack.packb({"id": "1"}))
        assert asyncio.run(_open_and(client, one)).new_state
    assert "the native HTTP/2 client could not connect to provider fake (cannot connect to somewhere: refused); " \
           "reading through grpc.aio" in caplog.text


async def _open_and(client: Any, use: Callable[[AsyncReads], Awaitable[T]]) -> T:
    reads = client.async_reads()
    try:
        return await use(reads)
    finally:
        await reads.aclose()


def test_the_extension_is_built_without_aws_lc_jitter_entropy(native) -> None:
    # .cargo/config.toml: with it, a process's first TLS handshake spent ~45 ms of CPU gathering
    # entropy, and its failing health check aborts processes on some fresh VMs. Its functions are
    # named jent_* (83 such names were in the library built without the setting).
    assert b"jent_" not in Path(native.__file__).read_bytes(), \
        f"{native.__file__} was built with CPU jitter entropy: build it under the repository, where .cargo/config.toml applies"
