"""Fixtures of the reliability suite (tests/reliability), which runs alone with
`python -m pytest tests/reliability`; the PostgreSQL server and `run_kl` come from tests/conftest.py."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from faultkit import install_fake  # noqa: E402


@pytest.fixture
def fake_cache(tmp_path: Path):
    """(make, events): make(**env) installs the fake provider and returns the plugin cache;
    events is the file the fake logs read/stop/shutdown/configure to."""
    events = tmp_path / "events.log"
    events.touch()

    def make(**env: str) -> Path:
        return install_fake(tmp_path, events, **env)

    return make, events
