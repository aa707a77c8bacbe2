"""Fixtures of the reliability suite (tests/reliability), which runs alone with
`python -m pytest tests/reliability`; the PostgreSQL server and `run_kl` come from tests/conftest.py."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from faultkit import assert_no_new_providers, install_fake, provider_pids  # noqa: E402


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
