"""Shared bench helpers: quick mode and a summary table printed at the end of the run."""
from __future__ import annotations

import os

import pytest

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
_summary: list[str] = []


@pytest.fixture(scope="session")
def bench_summary() -> list[str]:
    """Lines appended here are printed after the run (figures for the closing note)."""
    return _summary


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _summary:
        terminalreporter.section("bench figures")
        for line in _summary:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def pg_server():
    """A PostgreSQL server for the benches: KL_TEST_DATABASE_URL, or a throwaway embedded cluster."""
    import shutil
    import tempfile
    from pathlib import Path

    url = os.environ.get("KL_TEST_DATABASE_URL")
    if url:
        yield url
        return
    from kilolock.store.embedded import EmbeddedCluster

    base = Path(tempfile.mkdtemp(prefix="kl-bench-pg-"))
    os.chmod(base, 0o755)  # as root the server runs unprivileged and must reach its directory
    cluster = EmbeddedCluster(base / "pg")
    cluster.ensure_running()
    try:
        yield cluster.url("postgres")
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def bench_db(pg_server):
    """A fresh, migrated database of the bench's own (a libpq URL)."""
    import uuid

    import psycopg

    from kilolock.store.migrate import apply_migrations

    name = f"kl_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = psycopg.conninfo.make_conninfo(pg_server, dbname=name)
    with psycopg.connect(url, autocommit=True) as conn:
        apply_migrations(conn)
    yield url
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
