"""Fault injection with the project's fake provider: every failure is one clear error, within the
timeout, with no process left behind."""
from __future__ import annotations

import logging
import os
import threading
import time

import msgpack
import pytest

from kilolock.errors import KlError
from kilolock.provider import (
    PluginStartError,
    ProviderCallError,
    ProviderDiagnosticsError,
    Severity,
    launch_provider,
    transport,
)
from kilolock.schema import GetAttr, Index
from kit.procs import survivors
from kit.providers import stderr_shows

START_TIMEOUT = 3.0


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("garbage", "is not a Terraform provider plugin: its first output line was 'Welcome to the fake tool!"),
        ("not-plugin", "is not a Terraform provider plugin: its first output line was 'usage: fake-tool"),
        ("exit-early", "exited before the plugin handshake (exit status 3); stderr: fake: loading configuration | fake: fatal: cannot open /nonexistent/config.yml"),
        ("wrong-cookie", "is a go-plugin binary for another application: it rejected Terraform's magic cookie"),
        ("netrpc", "speaks netrpc, the pre-0.12 plugin RPC"),
        ("proto4", "speaks plugin protocol '4'; kl supports protocols 5 and 6"),
        ("hang", f"did not complete the plugin handshake within {START_TIMEOUT:g}s"),
    ],
)
def test_start_failures_are_clear_and_bounded(fake_binary, mode: str, expected: str) -> None:
    binary = fake_binary(mode)
    started = time.monotonic()
    with pytest.raises(PluginStartError) as err:
        launch_provider(binary, tls=False, start_timeout=START_TIMEOUT)
    assert time.monotonic() - started < START_TIMEOUT + 3
    assert expected in str(err.value)
    assert binary in str(err.value)
    assert isinstance(err.value, KlError)


def test_missing_and_non_executable_binaries(tmp_path) -> None:
    with pytest.raises(PluginStartError, match="does not exist"):
        launch_provider(str(tmp_path / "terraform-provider-nope"))
    text = tmp_path / "terraform-provider-text"
    text.write_text("just text\n")
    with pytest.raises(PluginStartError, match="is not executable"):
        launch_provider(str(text))
    text.chmod(0o755)  # executable, but no interpreter line: the kernel refuses it
    with pytest.raises(PluginStartError, match="cannot be executed: Exec format error"):
        launch_provider(str(text))


@pytest.mark.parametrize("proto", [5, 6])
@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "automtls"])
def test_fake_round_trip_both_protocols(fake_binary, proto: int, tls: bool) -> None:
    with launch_provider(fake_binary(proto=proto), tls=tls) as client:
        assert client.protocol_version == proto
        # The fake's server certificate is P-256, which grpcio verifies under TLS 1.3: real mTLS.
        assert client.connection.tls is tls  # type: ignore[attr-defined]
        schema = client.get_schema()
        block = schema.resource_schemas["fake_echo"].block
        assert [a.name for a in block.attributes] == ["id", "secret", "value"]
        assert block.attributes[1].sensitive and block.block_types[0].max_items == 3
        state = msgpack.packb({"id": "1", "rule": [], "secret": None, "value": "v"})
        result = client.read_resource("fake_echo", state, b"p")
        assert result.new_state == state and result.private == b"p+read"


@pytest.mark.parametrize("proto", [5, 6])
def test_unknown_field_6_is_handed_over_as_paths(fake_binary, proto: int) -> None:
    with launch_provider(fake_binary(proto=proto), tls=False) as client:
        result = client.read_resource("fake_sensitive", msgpack.packb({"id": "1"}))
    # Two field 6 records: steps{attribute_name:"secret"}, then steps{attribute_name:"tags"} steps{element_key_string:"k"}.
    assert result.sensitive_paths == ((GetAttr("secret"),), (GetAttr("tags"), Index("k")))
    assert result.new_state is not None


def test_garbage_in_field_6_fails_the_read_naming_the_provider(fake_binary) -> None:
    with launch_provider(fake_binary(FAKE_SENSITIVE_GARBAGE="1"), tls=False) as client:
        with pytest.raises(ProviderCallError) as err:
            client.read_resource("fake_sensitive", msgpack.packb({"id": "1"}))
        assert str(err.value) == "provider fake: ReadResource: malformed sensitive paths (field 6): AttributePath.Step without a selector"
        assert client.read_resource("fake_echo", msgpack.packb({"id": "1"})).sensitive_paths == ()  # the provider lives on


def test_error_diagnostics_raise_one_exception_type(fake_binary) -> None:
    with launch_provider(fake_binary(proto=6), tls=False) as client, pytest.raises(ProviderDiagnosticsError) as err:
        client.read_resource("fake_error", msgpack.packb({"id": "1"}))
    diags = err.value.diagnostics
    assert [d.severity for d in diags] == [Severity.ERROR, Severity.WARNING]
    assert diags[0].attribute == (GetAttr("rule"), Index(1), GetAttr("cidr"))
    assert str(err.value) == "provider fake: ReadResource fake_error: at rule[1].cidr: Invalid thing: the rule is wrong"


def test_upgrade_error_and_gone_object(fake_binary) -> None:
    with launch_provider(fake_binary(), tls=False) as client:
        assert client.upgrade_resource_state("fake_echo", 1, b'{"id":"1"}') == b'\xc4\x0a{"id":"1"}'
        with pytest.raises(ProviderDiagnosticsError, match="newer state: version 3"):
            client.upgrade_resource_state("fake_echo", 3, b"{}")
        assert client.read_resource("fake_gone", msgpack.packb({"id": "1"})).new_state is None


def test_crash_mid_call_is_a_clear_error_and_reaped(fake_binary) -> None:
    client = launch_provider(fake_binary(), tls=False)
    pid = client.connection.process.pid  # type: ignore[attr-defined]
    try:
        with pytest.raises(ProviderCallError) as err:
            client.read_resource("fake_crash", msgpack.packb({"id": "1"}))
        assert "the plugin exited during ReadResource (exit status 2)" in str(err.value)
        # The tail explains the exit: the panic, not the info/debug JSON log lines before it.
        assert str(err.value).endswith(" | panic: fake provider crashed on purpose"), str(err.value)
        assert '"@level"' not in str(err.value) and "fake provider serving" not in str(err.value), str(err.value)
    finally:
        client.close()
    assert survivors([pid]) == []


def test_slow_read_hits_the_call_timeout(fake_binary) -> None:
    with launch_provider(fake_binary(FAKE_SLOW_SECONDS="30"), tls=False) as client:
        started = time.monotonic()
        with pytest.raises(ProviderCallError, match="ReadResource did not answer within 0.5s"):
            client.read_resource("fake_slow", msgpack.packb({"id": "1"}), timeout=0.5)
        assert time.monotonic() - started < 5


def test_the_client_wide_deadline_applies_to_every_call(fake_binary) -> None:
    with launch_provider(fake_binary(FAKE_SLOW_SECONDS="30"), tls=False, rpc_timeout=0.5) as client:
        assert client.read_resource("fake_echo", msgpack.packb({"id": "1"})).new_state  # fast calls are unaffected
        started = time.monotonic()
        with pytest.raises(ProviderCallError, match="ReadResource did not answer within 0.5s"):
            client.read_resource("fake_slow", msgpack.packb({"id": "1"}))
        assert time.monotonic() - started < 5


def test_stop_interrupts_an_in_flight_read(fake_binary) -> None:
    with launch_provider(fake_binary(FAKE_SLOW_SECONDS="30"), tls=False) as client:
        outcome: list[BaseException] = []

        def slow() -> None:
            try:
                client.read_resource("fake_slow", msgpack.packb({"id": "1"}))
            except BaseException as exc:  # noqa: BLE001 - the test inspects what the read raised
                outcome.append(exc)

        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.5)
        client.stop()
        t.join(timeout=5)
        assert not t.is_alive()
    assert len(outcome) == 1 and "cancelled by StopProvider" in str(outcome[0])


def test_close_kills_a_provider_that_ignores_shutdown(fake_binary) -> None:
    client = launch_provider(fake_binary(FAKE_SLOW_SECONDS="30"), tls=False)
    proc = client.connection.process  # type: ignore[attr-defined]
    os.kill(proc.pid, 19)  # SIGSTOP: Shutdown cannot be answered, the 2 s grace runs out
    started = time.monotonic()
    client.close()
    assert 1.5 < time.monotonic() - started < 8
    assert proc.exit_description() == "killed by SIGKILL"
    assert survivors([proc.pid]) == []


def test_stdio_stream_and_stderr_are_drained_into_logging(fake_binary, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(1, logger="kilolock.provider")
    with launch_provider(fake_binary(), tls=False) as client:
        client.get_schema()
        deadline = time.monotonic() + 3
        while "hello from StreamStdio" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    messages = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert ("kilolock.provider.fake", "INFO", "fake: fake provider serving proto=5") in messages
    assert any("hello from StreamStdio" in m for _, _, m in messages)


def test_automtls_is_the_default_and_env_turns_it_off(fake_binary, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KL_DISABLE_PLUGIN_TLS", raising=False)
    monkeypatch.delenv("TF_DISABLE_PLUGIN_TLS", raising=False)
    with launch_provider(fake_binary()) as client:
        assert client.connection.tls is True  # type: ignore[attr-defined]
        assert stderr_shows(client, "client cert present")
    monkeypatch.setenv("KL_DISABLE_PLUGIN_TLS", "1")
    with launch_provider(fake_binary()) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
        assert stderr_shows(client, "client cert absent")
    monkeypatch.delenv("KL_DISABLE_PLUGIN_TLS")
    monkeypatch.setenv("TF_DISABLE_PLUGIN_TLS", "1")  # Terraform's switch is honoured too
    with launch_provider(fake_binary()) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]


def test_failed_tls_falls_back_to_plaintext_and_says_so(fake_binary, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kilolock.provider.connection")
    binary = fake_binary(FAKE_BAD_CERT="1")
    with launch_provider(binary, tls=True) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
        assert stderr_shows(client, "client cert absent")
        assert client.read_resource("fake_echo", msgpack.packb({"id": "1"})).new_state == msgpack.packb({"id": "1"})
    assert f"{transport.client_id(transport.chosen())} could not complete AutoMTLS with {binary}" in caplog.text
    assert "private 0700 unix socket directory" in caplog.text


def test_socket_lives_in_a_private_directory_removed_at_close(fake_binary) -> None:
    client = launch_provider(fake_binary(), tls=False)
    proc = client.connection.process  # type: ignore[attr-defined]
    try:
        assert os.stat(proc.socket_dir).st_mode & 0o777 == 0o700
        assert os.path.dirname(proc.handshake.address) == proc.socket_dir
    finally:
        client.close()
    assert not os.path.exists(proc.socket_dir)


@pytest.mark.parametrize("proto", [5, 6])
def test_identity_schemas_and_identity_round_trip(fake_binary, proto: int) -> None:
    from kilolock.schema import Attribute

    with launch_provider(fake_binary(proto=proto), tls=False) as client:
        schemas = client.get_identity_schemas()
        assert list(schemas) == ["fake_echo"] and schemas["fake_echo"].version == 1
        assert schemas["fake_echo"].block.attributes == (
            Attribute(name="id", type=b'"string"', description="the id", required=True),
            Attribute(name="region", type=b'"string"', optional=True),
        )
        ident = msgpack.packb({"id": "1", "region": None})
        result = client.read_resource("fake_echo", msgpack.packb({"id": "1"}), current_identity=ident)
        assert result.new_identity == ident  # the fake echoes it back
        assert client.read_resource("fake_echo", msgpack.packb({"id": "1"})).new_identity is None
