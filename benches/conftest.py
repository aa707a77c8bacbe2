"""Shared bench fixtures: the PostgreSQL server (kit.pg), a database per bench, and a summary table
printed at the end of the run."""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit import pg

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
def pg_server() -> Iterator[str]:
    """A PostgreSQL server for the benches: KL_TEST_DATABASE_URL, or a throwaway embedded cluster."""
    with pg.server("kl-bench-pg-") as url:
        yield url


@pytest.fixture
def bench_db(pg_server: str) -> Iterator[str]:
    """A fresh, migrated database of the bench's own (a libpq URL)."""
    import psycopg

    from kilolock.store.migrate import apply_migrations

    with pg.fresh_database(pg_server, prefix="kl_bench_") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            apply_migrations(conn)
        yield url


@pytest.fixture(scope="session")
def kl_pyz() -> Iterator[Path]:
    """kl.pyz for the whole-process benches: $KL_TEST_PYZ if set (a kl.pyz built earlier in the
    run), else one built once for the session."""
    from kit.pyz import build

    base = Path(tempfile.mkdtemp(prefix="kl-bench-pyz-"))
    prebuilt = os.environ.get("KL_TEST_PYZ")
    if prebuilt:
        shutil.copyfile(prebuilt, base / "kl.pyz")
        yield base / "kl.pyz"
    else:
        yield build(base / "kl.pyz")
    shutil.rmtree(base, ignore_errors=True)
