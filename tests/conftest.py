"""Test setup shared by every suite: a real PostgreSQL server and an isolated database per test.

The server is a throwaway cluster started for the session (the same embedded-cluster code kl
uses), unless KL_TEST_DATABASE_URL points at an existing server on which the suite may create
and drop databases.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"

_TEMPLATE = "kl_test_template"

# Every process this test session starts (kl, and through it the providers) carries this mark in
# its environment, so leak checks count our own processes only, not a neighbour's on the machine.
SESSION_MARK = f"KL_TEST_SESSION={uuid.uuid4().hex}"
os.environ[SESSION_MARK.split("=")[0]] = SESSION_MARK.split("=")[1]


def _admin_url(server_url: str, dbname: str) -> str:
    import psycopg.conninfo

    params = psycopg.conninfo.conninfo_to_dict(server_url)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**params)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A libpq URL of a server (its `postgres` database) the tests may create databases on."""
    external = os.environ.get("KL_TEST_DATABASE_URL")
    if external:
        yield external
        return
    from kilolock.store.embedded import EmbeddedCluster, EmbeddedError

    base = Path(tempfile.mkdtemp(prefix="kl-test-pg-"))
    os.chmod(base, 0o755)
    cluster = EmbeddedCluster(base / "pg")
    try:
        cluster.ensure_running()
    except EmbeddedError as exc:
        pytest.fail(f"cannot start a test PostgreSQL server: {exc}", pytrace=False)
    try:
        yield cluster.url("postgres")
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_template(pg_server: str) -> str:
    """A database with every migration applied, cloned for each test (fast: CREATE DATABASE … TEMPLATE)."""
    import psycopg

    from kilolock.store.migrate import apply_migrations

    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{_TEMPLATE}"')
        admin.execute(f'CREATE DATABASE "{_TEMPLATE}"')
    with psycopg.connect(_admin_url(pg_server, _TEMPLATE)) as conn:
        apply_migrations(conn)
    return _TEMPLATE


def _fresh_database(pg_server: str, template: str) -> Iterator[str]:
    import psycopg

    name = f"kl_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield _admin_url(pg_server, name)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(pg_server: str, pg_template: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A migrated database of this test's own; KL_DATABASE_URL points kl at it."""
    for url in _fresh_database(pg_server, pg_template):
        monkeypatch.setenv("KL_DATABASE_URL", url)
        yield url


@pytest.fixture
def empty_db_url(pg_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A database with no migrations applied."""
    for url in _fresh_database(pg_server, "template1"):
        monkeypatch.setenv("KL_DATABASE_URL", url)
        yield url


@pytest.fixture
def conn(db_url: str):
    import psycopg

    # autocommit, as kl's own connections: `conn.transaction()` is then a real transaction.
    with psycopg.connect(db_url, autocommit=True) as c:
        yield c


NULL_PROVIDER = 'provider["registry.terraform.io/hashicorp/null"]'


def build_state(serial: int, instances: dict[str, dict], lineage: str = "lineage-1", **top) -> bytes:
    """A Terraform v4 state with one null_resource per entry: {name: attributes}. For store tests
    that need exact control over content; fixtures made by real Terraform cover the real shape."""
    import json

    doc = {
        "version": 4,
        "terraform_version": "1.0.3",
        "serial": serial,
        "lineage": lineage,
        "outputs": {},
        "resources": [
            {"mode": "managed", "type": "null_resource", "name": name, "provider": NULL_PROVIDER,
             "instances": [{"schema_version": 0, "attributes": attrs, "sensitive_attributes": []}]}
            for name, attrs in instances.items()
        ],
    }
    doc.update(top)
    return json.dumps(doc).encode()


@pytest.fixture
def make_state():
    return build_state


@pytest.fixture
def run_kl():
    """Run `python -m kilolock ARGS` as a user would, with the test's environment (KL_DATABASE_URL)."""
    import subprocess
    import sys

    def run(*args: str, input: bytes | None = None, env: dict | None = None, timeout: float = 120,
            cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
        full_env = dict(os.environ)
        full_env.pop("KL_DEBUG", None)
        full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
        if env:
            full_env.update(env)
        return subprocess.run([sys.executable, "-m", "kilolock", *args], input=input, capture_output=True,
                              env=full_env, timeout=timeout, cwd=str(cwd or REPO))

    return run


@pytest.fixture(autouse=True)
def _restore_logging_levels():
    """kl's main() configures logging for a process (kilolock.provider at ERROR unless logs are
    asked for); tests that call it in-process must not change what later tests' loggers pass."""
    import logging

    loggers = [logging.getLogger(), logging.getLogger("kilolock"), logging.getLogger("kilolock.provider")]
    levels = [lg.level for lg in loggers]
    yield
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)
