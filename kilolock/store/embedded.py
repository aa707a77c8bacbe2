"""The embedded default database: a private PostgreSQL cluster that kl creates and starts itself.

Used when ``KL_DATABASE_URL`` is unset, so that ``kl state import`` works on a fresh machine, and
by the test suite for its throwaway cluster. The server listens on a unix socket inside its own
0700 data directory and nowhere else, so only its owner (and root) can reach it; authentication
is therefore ``trust``.

PostgreSQL refuses to run as root. When kl runs as root the cluster belongs to an unprivileged
system account (``postgres`` if it exists, else ``nobody``) and lives under /var/lib/kilolock, whose
parents that account can traverse; root still connects through the socket.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilolock.errors import KlError

DB_NAME = "kilolock"
SUPERUSER = "kilolock"
# unix sockets have a 107-byte path limit; ".s.PGSQL.5432" needs 13 of them.
_MAX_SOCKET_DIR = 90


class EmbeddedError(KlError):
    pass


def find_pg_bin() -> Path:
    """The directory holding initdb, pg_ctl and postgres: $KL_PG_BIN, PATH, then Debian's layout."""
    candidates: list[Path] = []
    if os.environ.get("KL_PG_BIN"):
        candidates.append(Path(os.environ["KL_PG_BIN"]))
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(os.path.realpath(on_path)).parent)
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0)
    candidates.extend(Path(p) for p in reversed(versions))
    for c in candidates:
        if all((c / exe).exists() for exe in ("initdb", "pg_ctl", "postgres")):
            return c
    raise EmbeddedError(
        "no PostgreSQL server binaries found (looked in $KL_PG_BIN, PATH, /usr/lib/postgresql/*/bin); "
        "install them (Debian: apt-get install postgresql) or set KL_DATABASE_URL to an existing server"
    )


def _service_account() -> pwd.struct_passwd | None:
    """None when we are not root; otherwise the unprivileged account that runs the server."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise EmbeddedError("running as root and no unprivileged 'postgres' or 'nobody' account exists to run PostgreSQL")


def default_data_dir() -> Path:
    if os.environ.get("KL_DATA_DIR"):
        return Path(os.environ["KL_DATA_DIR"]) / "pg"
    if os.geteuid() == 0:
        return Path("/var/lib/kilolock/pg")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kilolock" / "pg"


@dataclass
class EmbeddedCluster:
    """A PostgreSQL cluster in ``data_dir`` that serves only on a unix socket inside it."""

    data_dir: Path

    @property
    def socket_dir(self) -> Path:
        return self.data_dir

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    def url(self, dbname: str = DB_NAME) -> str:
        return f"postgresql://{SUPERUSER}@/{dbname}?host={self.socket_dir}"

    # --- process control ------------------------------------------------------------------------

    def _run(self, args: list[str], what: str, timeout: float = 120) -> str:
        account = _service_account()
        kwargs: dict[str, Any] = {}
        if account is not None:
            kwargs = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        try:
            proc = subprocess.run(args, check=False, capture_output=True, text=True, timeout=timeout, env=env, cwd="/", **kwargs)
        except subprocess.TimeoutExpired:
            raise EmbeddedError(f"embedded PostgreSQL: {what} did not finish within {timeout:.0f}s (see {self.log_file})") from None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise EmbeddedError(f"embedded PostgreSQL: {what} failed: {' / '.join(tail) or 'exit ' + str(proc.returncode)}")
        return str(proc.stdout)

    def _prepare_dir(self) -> None:
        account = _service_account()
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.data_dir, 0o700)
        if account is not None:
            os.chown(self.data_dir, account.pw_uid, account.pw_gid)
            # The account must be able to reach its directory: every parent needs o+x.
            for parent in self.data_dir.parents:
                if parent.stat().st_mode & 0o001 == 0:
                    raise EmbeddedError(
                        f"embedded PostgreSQL runs as '{account.pw_name}' (PostgreSQL refuses root), "
                        f"which cannot enter {parent}; choose another place with KL_DATA_DIR"
                    )

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        # Two kl processes starting at once must not both run initdb or pg_ctl start.
        lock_path = self.data_dir.parent / (self.data_dir.name + ".lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def running(self) -> bool:
        """Whether the cluster's server is up. Its socket and postmaster.pid outlive a server that
        did not stop cleanly (a host or container restart, an OOM kill), so the pid they name must
        be alive and a postgres process: stale files alone would leave every command refused."""
        if not (self.socket_dir / ".s.PGSQL.5432").exists():
            return False
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # alive, under the server's own account
        try:
            with open(f"/proc/{pid}/comm") as fh:
                return fh.read().startswith("postgres")
        except OSError:
            return True  # no /proc: trust the live pid

    def ensure_running(self) -> str:
        """Initialise and start the cluster if needed; return a libpq URL for its database."""
        if len(str(self.socket_dir)) > _MAX_SOCKET_DIR:
            raise EmbeddedError(f"data directory path {self.socket_dir} is too long for a unix socket; set KL_DATA_DIR to a shorter path")
        if self.running():
            return self.url()
        bin_dir = find_pg_bin()
        with self._lock():
            if not self.initialised():
                self._prepare_dir()
                self._run(
                    [str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
                     "--encoding=UTF8", "--locale=C", "--no-instructions"],
                    "initdb",
                )
                with open(self.data_dir / "postgresql.auto.conf", "a") as conf:
                    conf.write(
                        "# written by kl: unix socket in the private data dir only\n"
                        "listen_addresses = ''\n"
                        f"unix_socket_directories = '{self.socket_dir}'\n"
                        "unix_socket_permissions = 0700\n"
                        "fsync = on\n"
                    )
            if not self.running():
                self._run(
                    [str(bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60", "start"],
                    "start",
                )
            self._create_database(DB_NAME)
        return self.url()

    def _create_database(self, name: str) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
                    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
                    if not exists:
                        conn.execute(f'CREATE DATABASE "{name}"')
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> bool:
        """Stop the server; False when it was not running."""
        if not self.initialised() or not self.running():
            return False
        self._run([str(find_pg_bin() / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"], "stop")
        return True
