"""Fixtures for the notification tests: a real webhook receiver per test (kit.webhook)."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

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
