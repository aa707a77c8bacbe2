"""Test setup shared by every suite: a real PostgreSQL server and an isolated database per test.

The server is a throwaway cluster started for the session (kit.pg), unless KL_TEST_DATABASE_URL
points at an existing server on which the suite may create and drop databases.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from kit import pg, pgbouncer
from kit.kl import run_kl as _run_kl
from kit.states import build_state

_TEMPLATE = "kl_test_template"

# Every process this test session starts (kl, and through it the providers) carries this mark in
# its environment, so leak checks count our own processes only, not a neighbour's on the machine.
SESSION_MARK = f"KL_TEST_SESSION={uuid.uuid4().hex}"
os.environ[SESSION_MARK.split("=")[0]] = SESSION_MARK.split("=")[1]
# What kl remembers in the user's cache dir (AutoMTLS failures: kilolock.provider.tlsmemo) stays
# in the session's own, so a test neither reads the user's nor leaves anything there.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="kl-test-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)


_CLI_KITS = ("kit.tfcli", "kit.clis")


def _drives_compiled_clis(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    return module is not None and any(getattr(v, "__module__", None) in _CLI_KITS for v in vars(module).values())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that drive Terraform / OpenTofu CLIs (they import from kit.tfcli or kit.clis) run
    last, in their usual order: on a cold machine the compiled CLIs are still building in the
    background while the rest of the suite runs (kit.clis)."""
    items[:] = [i for i in items if not _drives_compiled_clis(i)] + [i for i in items if _drives_compiled_clis(i)]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A libpq URL of a server (its `postgres` database) the tests may create databases on."""
    from kilolock.store.embedded import EmbeddedError

    with ExitStack() as stack:
        try:
            url = stack.enter_context(pg.server("kl-test-pg-"))
        except EmbeddedError as exc:
            pytest.fail(f"cannot start a test PostgreSQL server: {exc}", pytrace=False)
        yield url


@pytest.fixture(scope="session")
def pg_template(pg_server: str) -> str:
    """A database with every migration applied, cloned for each test (fast: CREATE DATABASE … TEMPLATE)."""
    return pg.migrated_template(pg_server, _TEMPLATE)


@pytest.fixture
def db_url(pg_server: str, pg_template: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A migrated database of this test's own; KL_DATABASE_URL points kl at it."""
    with pg.fresh_database(pg_server, pg_template) as url:
        monkeypatch.setenv("KL_DATABASE_URL", url)
        yield url


@pytest.fixture(scope="module")
def bouncer(pg_server: str) -> Iterator[str]:
    """A PgBouncer in transaction pooling mode in front of the test server, one per test module
    (kit.pgbouncer): a libpq URL template to format with a database name. Fails the test, naming
    what to install, when PgBouncer is missing."""
    pgbouncer.require()
    with pgbouncer.pgbouncer(pg_server) as template:
        yield template


@pytest.fixture
def empty_db_url(pg_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A database with no migrations applied."""
    with pg.fresh_database(pg_server, "template1") as url:
        monkeypatch.setenv("KL_DATABASE_URL", url)
        yield url


@pytest.fixture
def conn(db_url: str):
    import psycopg

    # autocommit, as kl's own connections: `conn.transaction()` is then a real transaction.
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


@pytest.fixture
def make_state():
    """build_state(serial, {name: attributes}, lineage=..., **top): a state of null_resources (kit.states)."""
    return build_state


@pytest.fixture
def run_kl():
    """Run `python -m kilolock ARGS` as a user would, with the test's environment (KL_DATABASE_URL)."""
    return _run_kl


@pytest.fixture(autouse=True)
def _restore_logging_levels():
    """kl's main() configures logging for a process (kilolock.provider at ERROR unless logs are
    asked for); tests that call it in-process must not change what later tests' loggers pass."""
    import logging

    loggers = [logging.getLogger(), logging.getLogger("kilolock"), logging.getLogger("kilolock.provider")]
    levels = [lg.level for lg in loggers]
    yield
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)
