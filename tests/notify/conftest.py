"""Fixtures for the notification tests: a real webhook receiver per test (kit.webhook)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from kit.paths import REPO
from kit.webhook import Receiver


@pytest.fixture
def start_receiver() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def start(statuses: list[int] | None = None) -> Receiver:
        r = Receiver(statuses)
        started.append(r)
        return r

    yield start
    for r in started:
        r.close()


@pytest.fixture
def receiver(start_receiver) -> Receiver:
    return start_receiver()


@pytest.fixture(autouse=True)
def _database(db_url: str) -> str:
    """Every notification test runs kl against a database of its own."""
    return db_url


@pytest.fixture
def kl_serve(db_url: str) -> Iterator[str]:
    """A real `kl serve` process on a free port over the test's database: its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, KL_DATABASE_URL=db_url, PYTHONPATH=str(REPO))
    env.pop("KL_SERVE_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "kilolock", "serve", "--listen", f"127.0.0.1:{port}", "-q"],
                            env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "kl serve:" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(30)
