"""A real PgBouncer (the Debian package, /usr/sbin/pgbouncer) in front of the test server, in
transaction pooling mode with few server connections, so that consecutive transactions of one
client land on different server connections: what breaks anything that relies on a session."""
from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


# PgBouncer's own default: how long it refuses every client after a server login failed.
DEFAULT_SERVER_LOGIN_RETRY = 15.0


MISSING = "these tests need PgBouncer: install it (Debian: apt-get install pgbouncer; scripts/setup-dev.sh does as root)"


def available() -> bool:
    return os.access(PGBOUNCER, os.X_OK)


def require() -> None:
    """Fail the calling test, naming what to install, when PgBouncer is missing: a test that
    needs it must not pass by being skipped."""
    if not available():
        import pytest

        pytest.fail(MISSING, pytrace=False)


def pid(template: str) -> int:
    """The process id of the PgBouncer that TEMPLATE (what pgbouncer() yields) connects to."""
    import psycopg.conninfo

    base = Path(str(psycopg.conninfo.conninfo_to_dict(template.format(dbname="x"))["host"]))
    return int((base / "pgbouncer.pid").read_text().split()[0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def pgbouncer(server_url: str, pool_mode: str = "transaction", pool_size: int = 3, server_login_retry: float = DEFAULT_SERVER_LOGIN_RETRY) -> Iterator[str]:
    """Start PgBouncer in front of SERVER_URL's server; yields a libpq URL template
    ("host=DIR port=PORT user=U dbname={dbname}") to format with a database name.
    SERVER_LOGIN_RETRY: how long PgBouncer refuses every client after a failed server login
    (its default is 15s), what a restarting server causes."""
    import psycopg.conninfo

    params = psycopg.conninfo.conninfo_to_dict(server_url)
    base = Path(tempfile.mkdtemp(prefix="kl-pgbouncer-"))
    os.chmod(base, 0o777)  # as root it runs as the cluster's unprivileged account, which writes here
    port = _free_port()
    user = str(params.get("user") or "kilolock")
    server = f"host={params.get('host', '/tmp')} port={params.get('port', 5432)} user={user}"
    run_as = ""
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        for name in ("postgres", "nobody"):
            try:
                run_as = pwd.getpwnam(name).pw_name
                break
            except KeyError:
                continue
    (base / "pgbouncer.ini").write_text(f"""[databases]
* = {server}

[pgbouncer]
listen_addr =
listen_port = {port}
unix_socket_dir = {base}
auth_type = any
pool_mode = {pool_mode}
default_pool_size = {pool_size}
min_pool_size = 0
max_client_conn = 500
server_reset_query =
server_login_retry = {server_login_retry:g}
ignore_startup_parameters = extra_float_digits,options
logfile = {base}/pgbouncer.log
pidfile = {base}/pgbouncer.pid
{f"user = {run_as}" if run_as else ""}
""")
    # Its console output goes to a file, never to a pipe nobody reads: PgBouncer logs every refused
    # client there too, and once 64 KiB of that filled a pipe it blocked in write() and stopped
    # answering anyone (what made a restart behind it look like kl never recovering).
    console = open(base / "console.log", "wb")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen([PGBOUNCER, str(base / "pgbouncer.ini")], stdout=console, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not (base / f".s.PGSQL.{port}").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (base / "pgbouncer.log").read_text() if (base / "pgbouncer.log").exists() else ""
                raise RuntimeError(f"pgbouncer did not start: {(base / 'console.log').read_text()}{log}")
            time.sleep(0.05)
        yield f"host={base} port={port} user={user} dbname={{dbname}}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        console.close()
        shutil.rmtree(base, ignore_errors=True)
