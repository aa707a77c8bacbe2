"""Fixtures of the reliability suite (tests/reliability), which runs alone with
`python -m pytest tests/reliability`; the PostgreSQL server and `run_kl` come from tests/conftest.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from kit.faults import install_fake
from kit.procs import assert_no_new_providers, provider_pids


@pytest.fixture(autouse=True)
def no_orphan_providers():
    """Whatever a fault did, no provider process of this session outlives the test."""
    before = provider_pids()
    yield
    assert_no_new_providers(before)


@pytest.fixture
def fake_cache(tmp_path: Path):
    """(make, events): make(**env) installs the fake provider and returns the plugin cache;
    events is the file the fake logs read/stop/shutdown/configure to."""
    events = tmp_path / "events.log"
    events.touch()

    def make(**env: str) -> Path:
        return install_fake(tmp_path, events, **env)

    return make, events
