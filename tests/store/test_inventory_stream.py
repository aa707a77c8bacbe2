"""`kl resources` streams its rows: read through a server-side cursor a batch at a time and printed
as they come, so a million-instance fleet is never held at once (benches/test_inventory.py measures
the peak RSS). Here: the cursor is a server-side one, kl writes while it is open, and a listing
longer than a batch comes out whole and in order, as JSON and CSV."""
from __future__ import annotations

import csv
import io
import json
import subprocess
from typing import Any

import psycopg

from kilolock.store import inventory as store
from kit.fleet import add_states, q, wait_for
from kit.kl import kl_cmd, kl_env


def test_rows_come_through_a_server_side_cursor_a_batch_at_a_time(db_url: str, conn: psycopg.Connection) -> None:
    add_states(db_url, ["big/a"], instances=store.STREAM_BATCH + 7)
    rows = store.stream_instances(conn, store.Filters())
    first = next(rows)
    # The query is a cursor of the server's while the first row is read, not a result held here.
    assert conn.execute("SELECT name FROM pg_cursors").fetchall() == [("kl_resources",)]
    everything = [first, *rows]
    assert conn.execute("SELECT count(*) FROM pg_cursors").fetchone() == (0,)  # closed with its transaction
    assert everything == store.instances(conn, store.Filters())
    assert len(everything) == store.STREAM_BATCH + 7


def test_kl_resources_prints_a_listing_longer_than_a_batch_whole_and_in_order(run_kl: Any, db_url: str) -> None:
    add_states(db_url, ["big/a", "big/b"], instances=store.STREAM_BATCH // 2 + 3)
    expected = [dict(r) for r in _all(db_url)]
    assert len(expected) > store.STREAM_BATCH

    r = run_kl("resources", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads(json.dumps(expected))
    assert r.stdout.decode() == json.dumps(json.loads(r.stdout), indent=2) + "\n"  # emit_json's layout, streamed

    r = run_kl("resources", "--format", "csv")
    assert r.returncode == 0, r.stderr
    lines = list(csv.reader(io.StringIO(r.stdout.decode())))
    assert lines[0] == list(store.COLUMNS)
    assert [(x[0], x[1]) for x in lines[1:]] == [(e["state"], e["address"]) for e in expected]

    r = run_kl("resources", "--states", "big/b")
    assert r.returncode == 0 and r.stdout.decode().splitlines()[-1] == f"{len(expected) // 2} instance(s)"

    r = run_kl("resources", "--format", "json", "--states", "none/*")
    assert r.returncode == 1 and "none/*" in r.stderr.decode()


def test_kl_resources_writes_while_its_cursor_is_open(db_url: str) -> None:
    # A reader that does not read: kl blocks writing the first batch (far more than a pipe holds),
    # and the database shows its connection in the middle of the cursor, not after a whole result.
    add_states(db_url, ["big/a"], instances=store.STREAM_BATCH * 2)
    proc = subprocess.Popen(kl_cmd("resources", "--format", "json"), env=kl_env(KL_DATABASE_URL=db_url),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # Between two fetches of the cursor, blocked on the pipe (a fetch may be seen in flight first).
        wait_for("kl paused mid-cursor", lambda: q(
            db_url, "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state = 'idle in transaction' AND query LIKE 'FETCH FORWARD %%kl_resources%%'"), timeout=60)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert len(json.loads(out)) == store.STREAM_BATCH * 2


def _all(db_url: str) -> list[store.InventoryRow]:
    with psycopg.connect(db_url, autocommit=True) as c:
        return store.instances(c, store.Filters())
