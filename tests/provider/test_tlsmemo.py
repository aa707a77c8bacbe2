"""A failed AutoMTLS attempt is remembered across runs (kilolock.provider.tlsmemo), keyed by the
binary's path, size and mtime and the grpcio version, so a provider that cannot do it under this
grpcio is started once per run, not twice; and the memory is only ever a cache."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import grpc
import msgpack
import pytest

from kilolock.provider import launch, launch_provider, tlsmemo
from kit.providers import REAL_PROVIDERS, launched, require


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache dir of the test's own, and a process that has not failed AutoMTLS with anything yet
    (what a new kl run starts from)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("KL_DISABLE_PLUGIN_TLS", raising=False)
    monkeypatch.delenv("TF_DISABLE_PLUGIN_TLS", raising=False)
    monkeypatch.setattr(launch, "tls_failed_here", set())
    return cache


def _starts(binary: str) -> int:
    return sum(1 for _, b in launched if b == binary)


def _new_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new kl process forgets: the in-process memory of failed attempts."""
    monkeypatch.setattr(launch, "tls_failed_here", set())


def test_a_failed_attempt_is_remembered_across_runs(fake_binary, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kilolock.provider.connection")
    binary = fake_binary(FAKE_BAD_CERT="1")  # TLS fails as against a current Go provider
    before = _starts(binary)
    with launch_provider(binary) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
    assert _starts(binary) - before == 2  # the doomed TLS start, then plaintext
    assert tlsmemo.failed_with(binary) == grpc.__version__
    entry = json.loads(Path(tlsmemo.memo_path()).read_text())["failed"][os.path.realpath(binary)]
    assert entry["size"] == os.stat(binary).st_size and entry["grpcio"] == grpc.__version__

    _new_run(monkeypatch)
    caplog.clear()
    before = _starts(binary)
    with launch_provider(binary) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
        assert client.read_resource("fake_echo", msgpack.packb({"id": "1"})).new_state == msgpack.packb({"id": "1"})
    assert _starts(binary) - before == 1  # straight to plaintext
    assert "failed in an earlier run" in caplog.text


def test_an_explicit_tls_request_still_tries(fake_binary) -> None:
    binary = fake_binary(FAKE_BAD_CERT="1")
    tlsmemo.remember_failure(binary, grpc.__version__)
    before = _starts(binary)
    with launch_provider(binary, tls=True) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
    assert _starts(binary) - before == 2


def test_a_changed_binary_is_tried_again(fake_binary) -> None:
    binary = fake_binary()  # completes AutoMTLS (the fake's certificate is P-256)
    tlsmemo.remember_failure(binary, grpc.__version__)
    st = os.stat(binary)
    os.utime(binary, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a new build at the same path
    assert tlsmemo.failed_with(binary) is None
    with launch_provider(binary) as client:
        assert client.connection.tls is True  # type: ignore[attr-defined]


def test_another_grpcio_is_tried_again_and_the_memory_dropped_when_it_works(fake_binary) -> None:
    binary = fake_binary()
    tlsmemo.remember_failure(binary, "0.0.1")  # failed under some older grpcio
    assert tlsmemo.failed_with(binary) == "0.0.1"
    before = _starts(binary)
    with launch_provider(binary) as client:
        assert client.connection.tls is True  # type: ignore[attr-defined]
    assert _starts(binary) - before == 2  # started plaintext on the memory, then again with TLS
    assert tlsmemo.failed_with(binary) is None


@pytest.mark.parametrize("content", [b"", b"{not json", b"[1, 2]", b'{"format": 99, "failed": {}}',
                                     b'{"format": 1, "failed": {"x": 1}}', b"\xff\xfe"])
def test_a_damaged_file_reads_as_empty_and_is_replaced(fake_binary, content: bytes) -> None:
    binary = fake_binary(FAKE_BAD_CERT="1")
    path = Path(tlsmemo.memo_path())
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert tlsmemo.failed_with(binary) is None
    tlsmemo.remember_failure(binary, grpc.__version__)
    assert tlsmemo.failed_with(binary) == grpc.__version__
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
def test_a_current_go_provider_starts_once_from_the_second_run(provider, monkeypatch: pytest.MonkeyPatch) -> None:
    require(provider)
    binary = str(provider.path)
    with launch_provider(binary) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
    assert tlsmemo.failed_with(binary) == grpc.__version__
    _new_run(monkeypatch)
    before = _starts(binary)
    with launch_provider(binary) as client:
        assert client.connection.tls is False  # type: ignore[attr-defined]
        client.get_schema()
    assert _starts(binary) - before == 1
