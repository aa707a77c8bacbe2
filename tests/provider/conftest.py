"""Fixtures for the provider stack: real provider binaries, the fake provider, and the no-survivor check."""
from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kilolock.provider import process as plugin_process
from kilolock.provider.process import LaunchSpec
from kit.paths import FAKE_PROVIDER, REPO
from kit.procs import running, start_ticks
from kit.providers import REAL_PROVIDERS, RealProvider, launched, require


@pytest.fixture(params=REAL_PROVIDERS, ids=lambda p: p.type)
def real_provider(request: pytest.FixtureRequest) -> RealProvider:
    require(request.param)
    return request.param


# --- the fake provider ----------------------------------------------------------------------------


@pytest.fixture
def fake_binary(tmp_path: Path):
    """Returns make(mode="serve", proto=5, **env) -> path of an executable wrapper for that mode."""

    def make(mode: str = "serve", proto: int = 5, **env: str) -> str:
        path = tmp_path / f"terraform-provider-fake_{mode}_{proto}"
        exports = {"FAKE_MODE": mode, "FAKE_PROTO": str(proto), "PYTHONPATH": str(REPO), **env}
        lines = ["#!/bin/sh"] + [f"export {k}='{v}'" for k, v in exports.items()]
        lines.append(f'exec "{sys.executable}" "{FAKE_PROVIDER}" "$@"')
        path.write_text("\n".join(lines) + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
        return str(path)

    return make


# --- no provider survives -------------------------------------------------------------------------

_original_init = plugin_process.PluginProcess.__init__


# When each launched process started: a pid recorded early in a long session may belong to another
# process by its end.
_started: dict[int, int | None] = {}


def _recording_init(self: plugin_process.PluginProcess, spec: LaunchSpec, popen: subprocess.Popen[bytes], socket_dir: str) -> None:
    launched.append((popen.pid, spec.binary))
    _started[popen.pid] = start_ticks(popen.pid)
    _original_init(self, spec, popen, socket_dir)


@pytest.fixture(autouse=True, scope="session")
def no_provider_survives():
    plugin_process.PluginProcess.__init__ = _recording_init  # type: ignore[method-assign]
    yield
    plugin_process.PluginProcess.__init__ = _original_init  # type: ignore[method-assign]
    alive = [(pid, b) for pid, b in launched if running(pid) and start_ticks(pid) == _started.get(pid)]
    assert not alive, f"provider processes survived the test session: {alive}"


@pytest.fixture(autouse=True)
def no_live_plugin_after_test():
    yield
    with plugin_process._live_lock:
        leftover = list(plugin_process._live)
    for proc in leftover:
        proc.kill()
    assert not leftover, f"test left plugins running: {[p.spec.binary for p in leftover]}"
