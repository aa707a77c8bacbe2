"""Fixtures for kl serve tests: a real server on 127.0.0.1 (port 0) in a thread, over the test's
own database, and a small HTTP client."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kit.httpclient import Client


@pytest.fixture
def start_server(db_url: str) -> Iterator[Callable[..., Client]]:
    from kilolock.server.auth import Authenticator
    from kilolock.server.backend import BackendPolicy
    from kilolock.server.http import KilolockHTTPServer, ServerConfig, serve_in_thread
    from kilolock.store import db

    started = []

    def start(auth: Authenticator | None = None, allow_force_unlock: bool = False, tls=None, **config) -> Client:
        cfg = ServerConfig(policy=BackendPolicy(allow_empty_force_unlock=allow_force_unlock), **config)
        server = KilolockHTTPServer(("127.0.0.1", 0), cfg, auth or Authenticator(), lambda: db.connect(db_url), tls)
        serve_in_thread(server)
        started.append(server)
        return Client(server.url, server=server)

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


@pytest.fixture
def client(start_server) -> Client:
    return start_server()
