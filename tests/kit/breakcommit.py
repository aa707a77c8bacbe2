"""Fault injection for a kl process (`python -m kit.breakcommit ARGS...` runs kl with it): the
database connection breaks inside a write's transaction, after its last statement and before its
COMMIT. The write is $KL_TEST_BREAK_AT, a function of kilolock.store ("locks.acquire",
"refresh_runs.finish", ...), or several separated by commas; by default WRITES, every write of a
version (whichever one the command makes). Behind PgBouncer that is the break psycopg reports on
its own COMMIT as InternalError("received 2 results from command 'COMMIT'"), without SQLSTATE.

Armed by the file $KL_TEST_BREAK_ARM (removed when it fires: one break per arming). The write then
creates $KL_TEST_BREAK_HELD (holding the server pid of its transaction) and holds the transaction
open until $KL_TEST_BREAK_GO exists, while the test breaks the server connection under it (a
PostgreSQL restart, pg_terminate_backend). The hold removes $KL_TEST_BREAK_GO as it goes on, so a
test that arms again (and removes $KL_TEST_BREAK_HELD) breaks the recovery's write as well.
In-process, breaking(function) is the armed version of one function, to monkeypatch in."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ARM, HELD, GO, AT = "KL_TEST_BREAK_ARM", "KL_TEST_BREAK_HELD", "KL_TEST_BREAK_GO", "KL_TEST_BREAK_AT"
WRITES = "writes.store_document,writes.store_envelope,writes.commit_delta"


def _hold(conn: Any) -> None:
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    Path(os.environ[HELD]).write_text(str(pid))
    go = Path(os.environ[GO])
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    go.unlink(missing_ok=True)


def install() -> None:
    import importlib

    for at in os.environ.get(AT, WRITES).split(","):
        module_name, function = at.strip().rsplit(".", 1)
        module = importlib.import_module(f"kilolock.store.{module_name}")
        setattr(module, function, breaking(getattr(module, function)))


def breaking(original: Callable[..., Any]) -> Callable[..., Any]:
    """ORIGINAL (a write of kilolock.store taking the connection first), held before its COMMIT
    when armed."""
    import psycopg

    def write(conn: Any, *args: Any, **kwargs: Any) -> Any:
        arm = Path(os.environ.get(ARM, "/nonexistent"))
        if not arm.exists():
            return original(conn, *args, **kwargs)
        arm.unlink()
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            # Inside its caller's transaction (kl serve's state write): the caller's COMMIT is the one.
            written = original(conn, *args, **kwargs)
            _hold(conn)
            return written
        # Its own transaction (an import, a refresh's commit or audit row): the same statements,
        # committed by this one COMMIT, the write's own becoming a savepoint inside it.
        with conn.transaction():
            written = original(conn, *args, **kwargs)
            _hold(conn)
        return written

    return write


def wait_held(held: Path, proc: Any, timeout: float = 120) -> int:
    """The server pid of the held transaction, once the kl process PROC holds it."""
    deadline = time.monotonic() + timeout
    while not (held.exists() and held.read_text()):
        assert proc.poll() is None, f"the kl process exited ({proc.returncode}) before the armed write"
        assert time.monotonic() < deadline, "the armed write never came"
        time.sleep(0.05)
    return int(held.read_text())


if __name__ == "__main__":
    install()
    from kilolock.cli import exit_process, main

    exit_process(main(sys.argv[1:]))
