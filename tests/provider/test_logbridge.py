from __future__ import annotations

import logging

import pytest

from kilolock.provider.logbridge import TRACE, StderrLogBridge, provider_log_level
from kit.providers import stderr_shows


def test_hclog_json_and_prefixed_lines(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("kilolock.provider.unit")
    caplog.set_level(TRACE, logger="kilolock.provider.unit")
    bridge = StderrLogBridge(logger)
    bridge.line('{"@level":"trace","@message":"Calling downstream","@module":"sdk.proto","@timestamp":"2026-01-01T00:00:00.000000Z","tf_rpc":"ReadResource"}\n')
    bridge.line("2026/01/01 [WARN] old-style warning\n")
    bridge.line("plain text\n")
    bridge.line("panic: runtime error: index out of range\n")
    bridge.line("goroutine 1 [running]:\n")
    got = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert got == [
        (TRACE, "sdk.proto: Calling downstream tf_rpc='ReadResource'"),
        (logging.WARNING, "2026/01/01 [WARN] old-style warning"),
        (logging.DEBUG, "plain text"),
        (logging.ERROR, "panic: runtime error: index out of range"),
        (logging.ERROR, "goroutine 1 [running]:"),  # everything after a panic is an error, as in Terraform
    ]


def test_level_from_environment() -> None:
    assert provider_log_level({}) is None
    assert provider_log_level({"TF_LOG": "off"}) is None
    assert provider_log_level({"KL_LOG": "debug"}) == logging.DEBUG
    assert provider_log_level({"TF_LOG": "1", "KL_LOG": "error"}) == TRACE
    assert provider_log_level({"TF_LOG_PROVIDER": "warn", "TF_LOG": "trace"}) == logging.WARNING


def test_plugins_log_at_warn_unless_logs_are_asked_for(fake_binary, monkeypatch: pytest.MonkeyPatch) -> None:
    from kilolock.provider import launch_provider

    for var in ("TF_LOG", "TF_LOG_PROVIDER", "KL_LOG", "TF_LOG_SDK_PROTO"):
        monkeypatch.delenv(var, raising=False)
    with launch_provider(fake_binary(), tls=False) as client:
        assert stderr_shows(client, "TF_LOG_SDK_PROTO=WARN")
    monkeypatch.setenv("KL_LOG", "debug")
    with launch_provider(fake_binary(), tls=False) as client:
        assert stderr_shows(client, "TF_LOG_SDK_PROTO=(unset)")
    monkeypatch.delenv("KL_LOG")
    monkeypatch.setenv("TF_LOG_SDK_PROTO", "info")  # an operator's own setting is kept
    with launch_provider(fake_binary(), tls=False) as client:
        assert stderr_shows(client, "TF_LOG_SDK_PROTO=info")
