"""A failed AutoMTLS attempt is remembered across runs (kilolock.provider.tlsmemo), keyed by the
binary's path, size and mtime and the client (kl's native HTTP/2 client or grpcio, and its
version), so a provider that cannot do it under this client is started once per run, not twice;
and the memory is only ever a cache. Every test runs under both transports."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import msgpack
import pytest

from kilolock.provider import launch_provider, spawn, tlsmemo, transport
from kit.providers import REAL_PROVIDERS, launched, require


@pytest.fixture(autouse=True, params=["native", "grpcio"])
def client_id(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The transport of the test (KL_PROVIDER_TRANSPORT); the id tlsmemo records failures under."""
    monkeypatch.setenv("KL_PROVIDER_TRANSPORT", request.param)
    assert transport.chosen() == request.param, "the native client needs the extension: scripts/setup-dev.sh"
    return transport.client_id(request.param)


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache dir of the test's own, and a process that has not failed AutoMTLS with anything yet
    (what a new kl run starts from)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("KL_DISABLE_PLUGIN_TLS", raising=False)
    monkeypatch.delenv("TF_DISABLE_PLUGIN_TLS", raising=False)
    monkeypatch.setattr(spawn, "tls_failed_here", set())
    return cache


def _starts(binary: str) -> int:
    return sum(1 for _, b in launched if b == binary)


def _new_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new kl process forgets: the in-process memory of failed attempts."""
    monkeypatch.setattr(spawn, "tls_failed_here", set())


def test_a_failed_attempt_is_remembered_across_runs(fake_binary, client_id: str, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kilolock.provider.connection")
    binary = fake_binary(FAKE_BAD_CERT="1")  # TLS fails as against a current Go provider
    before = _starts(binary)
    with launch_provider(binary) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
    assert _starts(binary) - before == 2  # the doomed TLS start, then plaintext
    assert tlsmemo.failed_with(binary) == client_id
    entry = json.loads(Path(tlsmemo.memo_path()).read_text())["failed"][os.path.realpath(binary)]
    assert entry["size"] == os.stat(binary).st_size and entry["client"] == client_id

    _new_run(monkeypatch)
    caplog.clear()
    before = _starts(binary)
    with launch_provider(binary) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
        assert client.read_resource("fake_echo", msgpack.packb({"id": "1"})).new_state == msgpack.packb({"id": "1"})
    assert _starts(binary) - before == 1  # straight to plaintext
    assert "failed in an earlier run" in caplog.text


def test_an_explicit_tls_request_still_tries(fake_binary, client_id: str) -> None:
    binary = fake_binary(FAKE_BAD_CERT="1")
    tlsmemo.remember_failure(binary, client_id)
    before = _starts(binary)
    with launch_provider(binary, tls=True) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
    assert _starts(binary) - before == 2


def test_a_changed_binary_is_tried_again(fake_binary, client_id: str) -> None:
    binary = fake_binary()  # completes AutoMTLS (the fake's certificate is P-256)
    tlsmemo.remember_failure(binary, client_id)
    st = os.stat(binary)
    os.utime(binary, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a new build at the same path
    assert tlsmemo.failed_with(binary) is None
    with launch_provider(binary) as client:
        assert client.connection.tls is True  # type: ignore[attr-defined]


def test_another_client_version_is_tried_again_and_the_memory_dropped_when_it_works(fake_binary, client_id: str) -> None:
    binary = fake_binary()
    older = client_id.split()[0] + " 0.0.1"  # failed under an older version of this client
    tlsmemo.remember_failure(binary, older)
    assert tlsmemo.failed_with(binary) == older
    before = _starts(binary)
    with launch_provider(binary) as provider:
        assert provider.connection.tls is True  # type: ignore[attr-defined]
    # grpcio's version is known only once grpc is imported, after the plugin started without TLS
    # on the memory: it starts again with TLS. The native client's is known before the start.
    assert _starts(binary) - before == (2 if client_id.startswith("grpcio ") else 1)
    assert tlsmemo.failed_with(binary) is None


@pytest.mark.parametrize("content", [b"", b"{not json", b"[1, 2]", b'{"format": 99, "failed": {}}',
                                     b'{"format": 1, "failed": {"x": 1}}', b"\xff\xfe"])
def test_a_damaged_file_reads_as_empty_and_is_replaced(fake_binary, client_id: str, content: bytes) -> None:
    binary = fake_binary(FAKE_BAD_CERT="1")
    path = Path(tlsmemo.memo_path())
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert tlsmemo.failed_with(binary) is None
    tlsmemo.remember_failure(binary, client_id)
    assert tlsmemo.failed_with(binary) == client_id
    assert not [p for p in path.parent.iterdir() if p.name != path.name]  # no temp file left


def test_an_unwritable_cache_only_costs_the_attempt(fake_binary, own_cache: Path) -> None:
    own_cache.parent.joinpath("cache").write_text("a file where the directory should be")
    binary = fake_binary(FAKE_BAD_CERT="1")
    with launch_provider(binary) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
    assert tlsmemo.failed_with(binary) is None


def test_the_memory_keeps_a_bounded_number_of_binaries(tmp_path: Path) -> None:
    for n in range(tlsmemo._MAX_ENTRIES + 10):
        b = tmp_path / f"bin{n}"
        b.write_text("x")
        tlsmemo.remember_failure(str(b), "1.0")
    failed = json.loads(Path(tlsmemo.memo_path()).read_text())["failed"]
    assert len(failed) == tlsmemo._MAX_ENTRIES
    assert tlsmemo.failed_with(str(tmp_path / f"bin{tlsmemo._MAX_ENTRIES + 9}")) == "1.0"  # the newest kept


@pytest.mark.parametrize("provider", [p for p in REAL_PROVIDERS if p.type != "null"], ids=lambda p: p.type)
def test_a_current_go_provider_starts_once_from_the_second_run(provider, client_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """grpcio cannot complete AutoMTLS with a provider built by a current Go (TLS 1.3, P-521):
    the first run learns it, the next starts plaintext at once. kl's native client completes it:
    every run starts the provider once, over TLS, and nothing is remembered."""
    require(provider)
    binary = str(provider.path)
    native = client_id.startswith("kl-h2 ")
    for run in range(2):
        _new_run(monkeypatch)
        before = _starts(binary)
        with launch_provider(binary) as started:
            assert started.connection.tls is native  # type: ignore[attr-defined]
            started.get_schema()
        assert _starts(binary) - before == (1 if native or run else 2), run
        assert tlsmemo.failed_with(binary) == (None if native else client_id)
