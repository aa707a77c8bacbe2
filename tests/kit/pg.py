"""The PostgreSQL server of a test or bench session, and databases of a test's own.

The server is a throwaway cluster (the same embedded-cluster code kl uses), unless
KL_TEST_DATABASE_URL points at an existing server on which the session may create and drop
databases.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # psycopg is imported where a connection is made, not by every importer of kit.pg
    import psycopg
    import pytest
    from psycopg.rows import TupleRow


def database_url(server_url: str, dbname: str) -> str:
    """SERVER_URL with its database replaced by DBNAME."""
    import psycopg.conninfo

    params = psycopg.conninfo.conninfo_to_dict(server_url)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo("", **params)


@contextmanager
def server(prefix: str) -> Iterator[str]:
    """A libpq URL of a server (its `postgres` database) for the session: KL_TEST_DATABASE_URL, or a
    cluster of its own under a temporary directory named PREFIX..., stopped and removed at the end.
    Raises kilolock.store.embedded.EmbeddedError when the cluster cannot start."""
    external = os.environ.get("KL_TEST_DATABASE_URL")
    if external:
        yield external
        return
    from kilolock.store.embedded import EmbeddedCluster

    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(base, 0o755)  # as root the server runs unprivileged and must reach its directory
    cluster = EmbeddedCluster(base / "pg")
    cluster.ensure_running()
    try:
        yield cluster.url("postgres")
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


def migrated_template(server_url: str, name: str) -> str:
    """(Re)create database NAME with every migration applied, to clone per test (CREATE DATABASE … TEMPLATE)."""
    import psycopg

    from kilolock.store.migrate import apply_migrations

    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(database_url(server_url, name)) as conn:
        apply_migrations(conn)
    return name


@contextmanager
def fresh_database(server_url: str, template: str = "template1", prefix: str = "kl_test_") -> Iterator[str]:
    """A new database cloned from TEMPLATE, dropped (connections and all) at the end; yields its URL."""
    import psycopg

    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield database_url(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def one_row(conn: psycopg.Connection[TupleRow], query: str, params: Sequence[Any] | None = None) -> TupleRow:
    """The first row QUERY returns, failing the test when it returns none."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, f"no row from {query!r}"
    return row


def record_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement any cursor executes from now on (Connection.execute goes through one too),
    as text, in order: for tests of how many statements, and which, a write costs."""
    import psycopg

    sent: list[str] = []
    real_execute = psycopg.Cursor.execute

    def recording(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> psycopg.Cursor[Any]:
        sent.append(query if isinstance(query, str) else repr(query))
        return real_execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", recording)
    return sent
