"""kl serve through PgBouncer in transaction pooling mode (issue 13): real Terraform 1.8.5 with its
http backend against a `kl serve` process whose KL_DATABASE_URL points at a real PgBouncer
(pool_mode = transaction, few server connections, kl_pooler=transaction): init, apply, a second
apply refused while the first holds the lock and then waiting for it, the unlocks, and the state
landed in PostgreSQL as Terraform wrote it. Nothing of a session is relied on: no prepared
statement, no session advisory lock, no LISTEN."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kit import breakcommit, pgbouncer
from kit.fleet import own_cluster, q, restart
from kit.kl import run_kl
from kit.paths import REPO
from kit.tfcli import Workspace, tool_binary, wait_for_lock_holder

TOOL = "terraform-1.8.5"
SLOW = """
resource "null_resource" "slow" {
  triggers = { v = "slow" }
  provisioner "local-exec" { command = "sleep 6" }
}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pooled_serve(bouncer: str, db_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A `kl serve` process over PgBouncer: (its URL, its log file)."""
    from kilolock.server.auth import hash_password

    pooled = bouncer.format(dbname=psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]) + " kl_pooler=transaction"
    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\n")
    port = _free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:  # a file, not a pipe: one log line per request
        proc = subprocess.Popen(
            [sys.executable, "-m", "kilolock", "serve", "--listen", f"127.0.0.1:{port}", "--users-file", str(users),
             "--pool-size", "4"],
            env={**os.environ, "PYTHONPATH": str(REPO), "KL_DATABASE_URL": pooled}, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "kl serve:" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", log
        proc.terminate()
        assert proc.wait(timeout=30) == 0, log.read_text(errors="replace")  # SIGTERM is a clean stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _rows(db_url: str, sql: str, name: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute(sql, (name,)).fetchall()


def test_terraform_apply_lock_and_unlock_through_a_transaction_pooler(pooled_serve, db_url, tmp_path):
    url, log = pooled_serve
    name = "pooled/app"
    ws = Workspace(TOOL, tool_binary(TOOL), tmp_path / "first", f"{url}/states/{name}", "alice", "alice-pw")
    ws.dir.mkdir()
    ws.write(SLOW)
    ws.run("init", "-input=false", "-no-color")
    other = Workspace(TOOL, ws.binary, tmp_path / "second", ws.url, "alice", "alice-pw")
    shutil.copytree(ws.dir, other.dir, symlinks=True)
    other.write(SLOW + 'resource "null_resource" "more" { triggers = { v = "more" } }\n')

    # More requests than psycopg's prepare threshold (5) go through each of the server's pooled
    # connections: a prepared statement would fail on the next server connection.
    first = ws.start("apply", "-auto-approve", "-input=false", "-no-color")
    try:
        holder = wait_for_lock_holder(db_url, name, first)
        refused = other.run("apply", "-auto-approve", "-input=false", "-no-color", "-lock-timeout=0s", check=False)
        assert refused.returncode != 0 and f"ID={holder['ID']}" in refused.stderr, refused.stderr
        waited = other.run("apply", "-auto-approve", "-input=false", "-no-color", "-lock-timeout=120s")
        assert "Apply complete" in waited.stdout
        assert first.wait(timeout=120) == 0, first.communicate()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert other.run("plan", "-detailed-exitcode", "-input=false", "-no-color", check=False).returncode == 0

    # The state landed: every version is Terraform's, by alice, and what kl serves (read through the
    # pooler) is what is stored (read straight from PostgreSQL).
    versions = _rows(db_url, "SELECT v.serial, v.source, v.actor FROM state_versions v JOIN states s ON s.id = v.state_id "
                             "WHERE s.name = %s ORDER BY v.serial", name)
    assert versions and all(src == "apply" and actor == "alice" for _, src, actor in versions), versions
    assert _rows(db_url, "SELECT r.address FROM resources r JOIN states s ON s.id = r.state_id WHERE s.name = %s "
                         "AND r.delete_serial IS NULL ORDER BY r.address", name) == [("null_resource.more",), ("null_resource.slow",)]
    pulled = ws.run("state", "pull").stdout
    ours = run_kl("state", "pull", name, env={"KL_DATABASE_URL": db_url}).stdout.decode()
    assert pulled.rstrip("\n") == ours.rstrip("\n")
    # Every lock was released, each lock audited with its unlock; none is left.
    events = [e for (e,) in _rows(db_url, "SELECT e.event FROM lock_events e JOIN states s ON s.id = e.state_id "
                                          "WHERE s.name = %s ORDER BY e.created_at", name)]
    assert events and events.count("lock") == events.count("unlock") and set(events) == {"lock", "unlock"}, events
    assert _rows(db_url, "SELECT count(*) FROM state_locks l JOIN states s ON s.id = l.state_id WHERE s.name = %s",
                 name) == [(0,)]
    text = log.read_text(errors="replace")
    assert "internal error" not in text and "prepared statement" not in text and "Traceback" not in text, text
    assert " 500 " not in text, text


@pytest.fixture
def restartable() -> Iterator[tuple[Any, str]]:
    """A PostgreSQL cluster of this test's own (it restarts it): (cluster, URL of its migrated "fleet")."""
    with own_cluster("kl-srvrs-") as cluster_and_url:
        yield cluster_and_url


def test_a_postgresql_restart_under_an_apply_s_write_is_a_503_and_terraform_retries_through(restartable, tmp_path):
    """PostgreSQL restarts while kl serve holds Terraform's state write open behind PgBouncer (the
    transaction's server connection dies under it): psycopg reports the break on its COMMIT as an
    InternalError without SQLSTATE. kl serve answers 503 with Retry-After (not a 500 with a
    traceback), drops the broken connection, and Terraform 1.8.5 with its default retries
    (TF_HTTP_RETRY_MAX unset: 2) sends the write again and the apply completes; what is stored
    is what Terraform wrote, once."""
    from kilolock.server.auth import hash_password

    cluster, url = restartable
    pgbouncer.require()
    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\n")
    arm, held, go = tmp_path / "arm", tmp_path / "held", tmp_path / "go"
    port = _free_port()
    log = tmp_path / "serve.log"
    name = "pooled/restarted"
    with pgbouncer.pgbouncer(url) as template:
        pooled = template.format(dbname="fleet") + " kl_pooler=transaction"
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "KL_DATABASE_URL": pooled,
               breakcommit.ARM: str(arm), breakcommit.HELD: str(held), breakcommit.GO: str(go)}
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "kit.breakcommit", "serve", "--listen", f"127.0.0.1:{port}",
                                     "--users-file", str(users), "--pool-size", "4"],
                                    env=env, stdout=out, stderr=subprocess.STDOUT)
        apply = None
        try:
            deadline = time.monotonic() + 60
            while "kl serve:" not in log.read_text(errors="replace"):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.1)
            ws = Workspace(TOOL, tool_binary(TOOL), tmp_path / "ws", f"http://127.0.0.1:{port}/states/{name}",
                           "alice", "alice-pw")
            ws.dir.mkdir()
            ws.write('resource "null_resource" "a" { triggers = { v = "a" } }\n')
            ws.run("init", "-input=false", "-no-color")
            tf_env = ws.env()
            del tf_env["TF_HTTP_RETRY_MAX"]  # Terraform's own default
            arm.touch()
            apply = ws.start("apply", "-auto-approve", "-input=false", "-no-color", env=tf_env)
            server_pid = breakcommit.wait_held(held, apply)
            restart(cluster)
            assert q(url, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (server_pid,)) == [(0,)]
            go.touch()
            out, err = apply.communicate(timeout=180)
            assert apply.returncode == 0 and "Apply complete" in out, out + err + log.read_text(errors="replace")
            pulled = ws.run("state", "pull").stdout
        finally:
            if apply is not None and apply.poll() is None:
                apply.kill()
                apply.communicate()
            proc.terminate()
            try:
                assert proc.wait(timeout=30) == 0, log.read_text(errors="replace")
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    text = log.read_text(errors="replace")
    # Access log lines: "kl serve: TIME CLIENT METHOD PATH STATUS TOOK PRINCIPAL".
    writes = [p[6] for p in (line.split() for line in text.splitlines()) if p[4:6] == ["POST", f"/states/{name}"]]
    # The broken write, 503s while PgBouncer refuses new clients (server_login_retry), then a retry lands.
    assert writes[0] == "503" and writes[-1] == "200" and set(writes[:-1]) == {"503"} and len(writes) <= 3, text
    assert "internal error" not in text and "Traceback" not in text and " 500 " not in text, text
    assert "lost the database connection: received 2 results from command 'COMMIT'" in text, text
    # Stored once, as Terraform wrote it; the lock taken for the apply was released.
    assert q(url, "SELECT v.serial, v.source FROM state_versions v JOIN states s ON s.id = v.state_id "
                  "WHERE s.name = %s", (name,)) == [(1, "apply")]
    assert q(url, "SELECT count(*) FROM state_locks") == [(0,)]
    ours = run_kl("state", "pull", name, env={"KL_DATABASE_URL": url}).stdout.decode()
    assert pulled.rstrip("\n") == ours.rstrip("\n")
