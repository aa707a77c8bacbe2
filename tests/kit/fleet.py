"""Shared by the fleet tests (tests/fleet): states of real null_resources, worker processes, and what
the database says about their runs."""
from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kit.faults import fake_state
from kit.kl import kl_cmd, kl_env
from kit.paths import PLUGIN_CACHE
from kit.states import build_state

LEASE = 3.0  # seconds: short, so a killed worker's job is taken over quickly
POLL = "200ms"


def add_states(db_url: str, names: list[str], instances: int = 5, search_path: Path = PLUGIN_CACHE,
               legacy_address: bool = False) -> None:
    """States of INSTANCES null_resources each, stored with their provider search path (kl state set).
    LEGACY_ADDRESS: the provider written as Terraform 0.12 wrote it (`provider.null`), which a
    refresh rewrites, so that `kl refresh --commit` has a version to write."""
    from kilolock import tfstate
    from kilolock.store import settings, states, writes

    with psycopg.connect(db_url, autocommit=True) as conn:
        for name in names:
            raw = build_state(1, {f"n{i}": {"id": f"{name}-{i}", "triggers": None} for i in range(instances)},
                              lineage=f"lineage-{name}")
            if legacy_address:
                doc = json.loads(raw)
                for r in doc["resources"]:
                    r["provider"] = "provider.null"
                raw = json.dumps(doc).encode()
            writes.store_document(conn, name, tfstate.parse_state(raw), raw, source="import", actor="test")
            settings.update(conn, states.state_id(conn, name),
                            settings.Changes({"provider_search_paths": [str(search_path)]}), "test")


def add_fake_state(db_url: str, name: str, cache: Path) -> None:
    from kilolock import tfstate
    from kilolock.store import settings, states, writes

    raw = fake_state(["fake_slow"], lineage=f"lineage-{name}")
    with psycopg.connect(db_url, autocommit=True) as conn:
        writes.store_document(conn, name, tfstate.parse_state(raw), raw, source="import", actor="test")
        settings.update(conn, states.state_id(conn, name), settings.Changes({"provider_search_paths": [str(cache)]}), "test")


def q(db_url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []


def runs_of(db_url: str, state: str) -> list[tuple[Any, ...]]:
    """(status, started_at, finished_at, error_summary) of a state's refresh runs, oldest first."""
    return q(db_url, "SELECT rr.status, rr.started_at, rr.finished_at, rr.error_summary FROM refresh_runs rr "
                     "JOIN states s ON s.id = rr.state_id WHERE s.name = %s ORDER BY rr.started_at", (state,))


def assert_no_overlap(db_url: str) -> None:
    """No two refresh runs of one state were ever running at the same time."""
    rows = q(db_url, "SELECT state_id, started_at, finished_at FROM refresh_runs ORDER BY state_id, started_at")
    for (s1, _, end1), (s2, start2, _) in itertools.pairwise(rows):
        if s1 == s2:
            assert end1 is not None and end1 <= start2, f"two runs of one state overlapped: {rows}"


def wait_for(what: str, check: Any, timeout: float = 40.0, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def start_worker(db_url: str, name: str, *extra: str, env: dict[str, str] | None = None,
                 log: Path | None = None) -> subprocess.Popen[bytes]:
    """A `kl worker` process. LOG: its output goes to that file rather than to a pipe read only when
    it stops: a worker that logs a retry every few hundred milliseconds through a long outage would
    fill the pipe (64 KiB) and block in write(), which looks like a worker that never recovers."""
    with open(log, "wb") if log is not None else contextlib.nullcontext() as out:
        return subprocess.Popen(kl_cmd("worker", "--name", name, "--lease", f"{LEASE:g}s", "--poll", POLL, *extra),
                                env=kl_env(KL_DATABASE_URL=db_url, **(env or {})),
                                stdout=out if out is not None else subprocess.PIPE, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str]:
    """Signal PROC and wait for it: (exit code, its output; "" when it went to a file)."""
    if proc.poll() is None:
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, (out or b"").decode()


@contextlib.contextmanager
def own_cluster(prefix: str) -> Iterator[tuple[Any, str]]:
    """A PostgreSQL cluster of the caller's own with a migrated database "fleet": (cluster, url).
    For tests that restart PostgreSQL, which would break every other test on the shared server."""
    from kilolock.store.embedded import EmbeddedCluster, EmbeddedError

    base = Path(tempfile.mkdtemp(prefix=prefix))  # short: the unix socket path has a length limit
    base.chmod(0o755)
    cluster = EmbeddedCluster(base / "pg")
    try:
        cluster.ensure_running()
    except EmbeddedError as exc:
        pytest.fail(f"cannot start a PostgreSQL cluster for the restart test: {exc}", pytrace=False)
    try:
        with psycopg.connect(cluster.url("postgres"), autocommit=True) as admin:
            admin.execute('CREATE DATABASE "fleet"')
        url = cluster.url("fleet")
        r = subprocess.run(kl_cmd("db", "migrate"), env=kl_env(KL_DATABASE_URL=url), capture_output=True)
        assert r.returncode == 0, r.stderr
        yield cluster, url
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


def restart(cluster: Any) -> None:
    """Restart the cluster own_cluster made (fast shutdown: every session is terminated)."""
    from kilolock.store.embedded import find_pg_bin

    cluster._run([str(find_pg_bin() / "pg_ctl"), "-D", str(cluster.data_dir), "-l", str(cluster.log_file),
                  "-m", "fast", "-w", "-t", "60", "restart"], "restart")
