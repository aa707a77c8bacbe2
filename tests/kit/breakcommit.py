"""Fault injection for a kl process (`python -m kit.breakcommit ARGS...` runs kl with it): the
database connection breaks inside a version write's transaction, after its last statement and
before its COMMIT. Behind PgBouncer that is the break psycopg reports on its own COMMIT as
InternalError("received 2 results from command 'COMMIT'"), without SQLSTATE.

Armed by the file $KL_TEST_BREAK_ARM (removed when it fires: one break per arming). The write then
creates $KL_TEST_BREAK_HELD and holds its transaction open until $KL_TEST_BREAK_GO exists, while
the test breaks the server connection under it (a PostgreSQL restart, pg_terminate_backend)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

ARM, HELD, GO = "KL_TEST_BREAK_ARM", "KL_TEST_BREAK_HELD", "KL_TEST_BREAK_GO"


def install() -> None:
    from kilolock.store import versions

    original = versions.write_version

    def write_version(conn: Any, *args: Any, **kwargs: Any) -> Any:
        written = original(conn, *args, **kwargs)
        arm = Path(os.environ.get(ARM, "/nonexistent"))
        if arm.exists():
            arm.unlink()
            # The server backend serving this transaction, for the test to see it die.
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            Path(os.environ[HELD]).write_text(str(pid))
            go = Path(os.environ[GO])
            deadline = time.monotonic() + 120
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return written

    versions.write_version = write_version


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
