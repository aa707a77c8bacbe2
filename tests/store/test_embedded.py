"""The embedded default database: with no KL_DATABASE_URL, kl starts its own PostgreSQL."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def data_dir():
    # Not pytest's tmp_path: as root the server runs as an unprivileged account, which must be
    # able to reach the directory (pytest's base dir is 0700 root).
    base = Path(tempfile.mkdtemp(prefix="kl-embedded-"))
    os.chmod(base, 0o755)
    yield base
    import shutil

    shutil.rmtree(base, ignore_errors=True)


def test_fresh_machine_import_just_works_then_stop(run_kl, make_state, data_dir, monkeypatch):
    monkeypatch.delenv("KL_DATABASE_URL", raising=False)
    env = {"KL_DATA_DIR": str(data_dir)}
    try:
        r = run_kl("state", "import", "dev", "-", input=make_state(1, {"a": {"id": "1"}}), env=env)
        assert r.returncode == 0, r.stderr
        assert (data_dir / "pg" / "PG_VERSION").exists()
        mode = (data_dir / "pg").stat().st_mode & 0o777
        assert mode == 0o700, oct(mode)
        conf = (data_dir / "pg" / "postgresql.auto.conf").read_text()
        assert "listen_addresses = ''" in conf  # no TCP listener at all
        status = run_kl("db", "status", env=env)
        assert status.returncode == 0 and b"embedded" in status.stdout and b"schema    current" in status.stdout
        listing = run_kl("state", "list", env=env)
        assert listing.returncode == 0 and b"dev " in listing.stdout
    finally:
        stop = run_kl("db", "stop", env=env)
    assert stop.returncode == 0 and b"stopped" in stop.stdout
    assert not (data_dir / "pg" / "postmaster.pid").exists()
    assert b"was not running" in run_kl("db", "stop", env=env).stdout


def test_two_first_runs_at_once_share_one_cluster(run_kl, make_state, data_dir, monkeypatch):
    import concurrent.futures

    monkeypatch.delenv("KL_DATABASE_URL", raising=False)
    env = {"KL_DATA_DIR": str(data_dir)}
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda n: run_kl("state", "import", f"s{n}", "-", input=make_state(1, {}), env=env), range(2)))
        assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
        assert run_kl("state", "list", env=env).stdout.count(b"\ns") == 2
    finally:
        run_kl("db", "stop", env=env)


def test_a_server_that_died_without_stopping_is_started_again(run_kl, make_state, data_dir, monkeypatch):
    """A host or container restart leaves the socket and postmaster.pid behind with no server:
    the next command starts it again rather than refusing every connection."""
    import signal
    import time

    monkeypatch.delenv("KL_DATABASE_URL", raising=False)
    env = {"KL_DATA_DIR": str(data_dir)}
    pg = data_dir / "pg"
    try:
        assert run_kl("state", "import", "dev", "-", input=make_state(1, {"a": {"id": "1"}}), env=env).returncode == 0
        postmaster = int((pg / "postmaster.pid").read_text().split("\n", 1)[0])
        children = [int(p) for p in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()]
        for pid in [postmaster, *children]:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{postmaster}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (pg / "postmaster.pid").exists() and (pg / ".s.PGSQL.5432").exists(), "the kill left no stale files to test with"

        listing = run_kl("state", "list", env=env)
        assert listing.returncode == 0, listing.stderr
        assert b"dev " in listing.stdout
        assert int((pg / "postmaster.pid").read_text().split("\n", 1)[0]) != postmaster
    finally:
        run_kl("db", "stop", env=env)
