"""kl's two transports to a plugin (kilolock.provider.rpc): the native HTTP/2 client
(kilolock.provider.h2channel over codec_rs/src/transport.rs) and grpcio, against the fake
provider, a grpcio server: the same answers and the same errors, blocking and from the event
loop, over AutoMTLS and plaintext, on both protocols; deadlines, crashes, cancellation, Ctrl-C and
close end every call; a certificate that is not the plugin's is refused; a refresh-sized use of
the native client never imports grpc. The real Go providers go through both in tests/refresh
(test_read_paths, test_refresh_real) and tests/provider (test_real_providers, test_tlsmemo)."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import msgpack
import pytest

from kilolock.provider import ProviderCallError, ProviderDiagnosticsError, launch_provider
from kilolock.provider.certs import generate_client_certificate, process_client_certificate
from kilolock.provider.client import AsyncReads, GrpcProviderClient
from kilolock.provider.connection import MAX_MESSAGE_BYTES
from kilolock.provider.h2channel import H2Calls, NativeChannel, native_module
from kilolock.provider.rpc import RpcError, StatusCode
from kit.paths import REPO

T = TypeVar("T")
TRANSPORTS = ["native", "grpcio"]


@pytest.fixture(scope="module")
def native() -> ModuleType:
    module = native_module()
    if module is None:
        pytest.fail("kilolock._native.transport is not built: build the extension (scripts/setup-dev.sh, or "
                    "`cd codec_rs && cargo build --release` and copy lib_native.so to kilolock/_native.abi3.so)")
    return module


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, native: ModuleType) -> str:
    """The test's transport: every plugin it launches talks through that client."""
    monkeypatch.setenv("KL_PROVIDER_TRANSPORT", request.param)
    return str(request.param)


def in_loop(client: Any, use: Callable[[AsyncReads], Awaitable[T]]) -> T:
    """USE(reads) in a fresh event loop, with reads opened and closed there."""
    async def main() -> T:
        reads = client.async_reads()
        try:
            assert reads.transport == client.transport
            return await use(reads)
        finally:
            await reads.aclose()
    return asyncio.run(main())


def read(client: Any, type_name: str, state: bytes, private: bytes = b"", **kw: Any) -> Any:
    return in_loop(client, lambda r: r.read_resource(type_name, state, private, **kw))


@pytest.mark.parametrize("tls", [True, False], ids=["automtls", "plaintext"])
@pytest.mark.parametrize("proto", [5, 6])
def test_both_transports_give_the_same_answers_blocking_and_looped(fake_binary, monkeypatch, proto: int, tls: bool) -> None:
    state = msgpack.packb({"id": "1", "rule": [], "secret": None, "value": "v"})
    ident = msgpack.packb({"id": "1", "region": None})
    cases: tuple[tuple[tuple[Any, ...], dict[str, Any]], ...] = ((("fake_echo", state, b"p"), {}), (("fake_sensitive", msgpack.packb({"id": "1"})), {}),
             (("fake_echo", msgpack.packb({"id": "1"})), {"current_identity": ident}),
             (("fake_gone", msgpack.packb({"id": "1"})), {}))
    answers = {}
    for transport in TRANSPORTS:
        monkeypatch.setenv("KL_PROVIDER_TRANSPORT", transport)
        with launch_provider(fake_binary(proto=proto), tls=tls) as client:
            assert (client.connection.tls, client.transport) == (tls, transport)  # type: ignore[attr-defined]
            schema = client.get_schema()
            blocking = [client.read_resource(*args, **kw) for args, kw in cases]
            looped = [read(client, *args, **kw) for args, kw in cases]
            assert looped == blocking
            answers[transport] = (schema, blocking)
    assert answers["native"] == answers["grpcio"]


@pytest.mark.usefixtures("transport")
def test_errors_read_the_same_blocking_and_looped(fake_binary) -> None:
    with launch_provider(fake_binary(proto=6, FAKE_SLOW_SECONDS="30"), tls=True, rpc_timeout=0.5) as client:
        with pytest.raises(ProviderDiagnosticsError) as blocking:
            client.read_resource("fake_error", msgpack.packb({"id": "1"}))
        with pytest.raises(ProviderDiagnosticsError) as looped:
            read(client, "fake_error", msgpack.packb({"id": "1"}))
        assert str(looped.value) == str(blocking.value) and looped.value.diagnostics == blocking.value.diagnostics
        for how in (lambda *a: read(client, *a), client.read_resource):
            started = time.monotonic()
            with pytest.raises(ProviderCallError, match=r"^provider fake: ReadResource did not answer within 0.5s$"):
                how("fake_slow", msgpack.packb({"id": "1"}))
            assert time.monotonic() - started < 3
        assert read(client, "fake_echo", msgpack.packb({"id": "1"})).new_state  # the connection lives on
        assert client.read_resource("fake_echo", msgpack.packb({"id": "1"})).new_state


@pytest.mark.usefixtures("transport")
@pytest.mark.parametrize("looped", [True, False], ids=["looped", "blocking"])
def test_a_crash_mid_call_names_the_exit(fake_binary, looped: bool) -> None:
    client = launch_provider(fake_binary(), tls=True)
    try:
        with pytest.raises(ProviderCallError) as err:
            if looped:
                read(client, "fake_crash", msgpack.packb({"id": "1"}))
            else:
                client.read_resource("fake_crash", msgpack.packb({"id": "1"}))
        assert "the plugin exited during ReadResource (exit status 2)" in str(err.value), str(err.value)
    finally:
        client.close()


@pytest.mark.usefixtures("native")
def test_many_calls_in_flight_each_get_their_own_answer(fake_binary) -> None:
    with launch_provider(fake_binary(), tls=True) as client:
        async def many(reads: AsyncReads) -> list[Any]:
            return list(await asyncio.gather(*(reads.read_resource("fake_echo", msgpack.packb({"id": str(n)}), f"p{n}".encode())
                                               for n in range(300))))
        assert client.transport == "native"
        results = in_loop(client, many)
    assert [msgpack.unpackb(r.new_state)["id"] for r in results] == [str(n) for n in range(300)]
    assert [r.private for r in results] == [f"p{n}+read".encode() for n in range(300)]


def test_statuses_are_grpcs_and_close_ends_what_is_in_flight(native, fake_binary) -> None:
    with launch_provider(fake_binary(FAKE_SLOW_SECONDS="30"), tls=False) as client:
        target = client.connection.process.handshake.grpc_target  # type: ignore[attr-defined]
        channel = NativeChannel(native, target, MAX_MESSAGE_BYTES)
        read_path = "/tfplugin5.Provider/ReadResource"
        with pytest.raises(RpcError) as err:
            channel.unary("/tfplugin5.Provider/NoSuchMethod", b"", 5.0)
        assert err.value.code == StatusCode.UNIMPLEMENTED

        async def main() -> None:
            calls = H2Calls(channel)
            with pytest.raises(RpcError) as err:
                await calls.call("/tfplugin5.Provider/NoSuchMethod", b"", 5.0)
            assert err.value.code == StatusCode.UNIMPLEMENTED
            # A cancelled call's late answer is dropped; the next call is unaffected.
            slow = asyncio.ensure_future(calls.call(read_path, _read_request(client, "fake_slow"), None))
            await asyncio.sleep(0.2)
            slow.cancel()
            answer = await calls.call(read_path, _read_request(client, "fake_echo"), 5.0)
            assert b"+read" in answer
            pending = asyncio.ensure_future(calls.call(read_path, _read_request(client, "fake_slow"), None))
            await asyncio.sleep(0.2)
            started = time.monotonic()
            calls.close()
            with pytest.raises(RpcError) as closed:
                await pending
            assert closed.value.code == StatusCode.CANCELLED and time.monotonic() - started < 1
            with pytest.raises(RpcError) as after:  # closed calls fail at once, not never
                await asyncio.wait_for(calls.call(read_path, b"", None), 1)
            assert after.value.code == StatusCode.UNAVAILABLE
        asyncio.run(main())
        assert b"+read" in channel.unary(read_path, _read_request(client, "fake_echo"), 5.0)  # the channel outlives its H2Calls

        # Closing the channel ends a blocking call in flight on another thread, and a stream.
        outcome: list[BaseException] = []
        waiting = threading.Thread(target=lambda: _catch(outcome, lambda: channel.unary(read_path, _read_request(client, "fake_slow"), None)))
        waiting.start()
        stream = channel.stream("/plugin.GRPCStdio/StreamStdio", b"")
        streamed = threading.Thread(target=lambda: _catch(outcome, lambda: _drain(stream)))
        streamed.start()
        time.sleep(0.3)
        started = time.monotonic()
        channel.close()
        waiting.join(5)
        streamed.join(5)
        assert time.monotonic() - started < 2 and not waiting.is_alive() and not streamed.is_alive()
        codes = sorted(e.code for e in outcome if isinstance(e, RpcError))
        assert codes == [StatusCode.CANCELLED, StatusCode.UNAVAILABLE], outcome
        with pytest.raises(RpcError) as after_close:
            channel.unary(read_path, b"", 1.0)
        assert after_close.value.code == StatusCode.UNAVAILABLE


def _catch(into: list[BaseException], fn: Callable[[], Any]) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        into.append(exc)


def _drain(stream: Iterator[bytes]) -> None:
    for _ in stream:
        pass


def test_a_server_stream_yields_each_message_until_it_ends(native, fake_binary) -> None:
    from kilolock.provider._pb import grpc_stdio_pb2

    with launch_provider(fake_binary(), tls=True) as client:
        hs = client.connection.process.handshake  # type: ignore[attr-defined]
        ours = process_client_certificate()
        channel = NativeChannel(native, hs.grpc_target, MAX_MESSAGE_BYTES, (hs.server_cert_der, ours.cert_pem, ours.key_pem))
        try:
            with pytest.raises(RpcError) as err:
                list(channel.stream("/plugin.GRPCStdio/NoSuchStream", b""))
            assert err.value.code == StatusCode.UNIMPLEMENTED
            # The fake sends one message, then keeps the stream open until the plugin shuts down.
            stream = channel.stream("/plugin.GRPCStdio/StreamStdio", b"")
            first = grpc_stdio_pb2.StdioData.FromString(next(stream))
            assert (first.channel, first.data) == (grpc_stdio_pb2.StdioData.STDERR, b"hello from StreamStdio\n")
            threading.Timer(0.2, channel.close).start()
            with pytest.raises(RpcError) as ended:
                next(stream)
            assert ended.value.code == StatusCode.CANCELLED
        finally:
            channel.close()


def test_ctrl_c_interrupts_a_blocking_call(native, fake_binary) -> None:
    # Python's own SIGINT handler, as an interactive kl has it, whatever the suite's process has by
    # now: in two full runs this session the Ctrl-C never arrived here (the read ran its 30 s and
    # returned) while the test passed alone; an earlier test's handler is the likely cause.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_a_slow_read(fake_binary)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_a_slow_read(fake_binary: Any) -> None:
    with launch_provider(fake_binary(FAKE_SLOW_SECONDS="30"), tls=False) as client:
        assert client.transport == "native"
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        started = time.monotonic()
        try:
            with pytest.raises(KeyboardInterrupt):
                client.read_resource("fake_slow", msgpack.packb({"id": "1"}))
        finally:
            timer.cancel()
        assert time.monotonic() - started < 2
        assert client.read_resource("fake_echo", msgpack.packb({"id": "1"})).new_state  # the channel still works


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


_NO_GRPC = """
import sys
from kilolock.provider import launch_provider
with launch_provider(sys.argv[1]) as client:
    client.get_schema()
    assert client.read_resource("fake_echo", b"\\x81\\xa2id\\xa11").new_state
    print(client.transport, client.connection.tls, "grpc" in sys.modules)
"""


@pytest.mark.usefixtures("native")
@pytest.mark.parametrize("transport, imports_grpc", [("native", False), ("grpcio", True)])
def test_the_native_transport_never_imports_grpc(fake_binary, transport: str, imports_grpc: bool, tmp_path: Path) -> None:
    # A small refresh spends ~25-35 ms of CPU importing grpc; through the native client it need not.
    env = {**os.environ, "KL_PROVIDER_TRANSPORT": transport, "XDG_CACHE_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", _NO_GRPC, fake_binary()], env=env, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [transport, "True", str(imports_grpc)]


def test_the_extension_is_built_without_aws_lc_jitter_entropy(native) -> None:
    # .cargo/config.toml: with it, a process's first TLS handshake spent ~45 ms of CPU gathering
    # entropy, and its failing health check aborts processes on some fresh VMs. Its functions are
    # named jent_* (83 such names were in the library built without the setting).
    # The submodule has no file of its own: the extension's .so is its package's.
    library = sys.modules[native.__name__.rpartition(".")[0]].__file__
    assert library is not None
    assert b"jent_" not in Path(library).read_bytes(), \
        f"{library} was built with CPU jitter entropy: build it under the repository, where .cargo/config.toml applies"
