"""A PostgreSQL primary with a synchronous streaming standby, both on loopback TCP, for failover
tests: the primary can be killed as a crashed host would die (SIGKILL to every one of its
processes) and the standby promoted (pg_ctl promote), as an operator or a failover manager does.

Built from Debian's binaries as kl's embedded cluster is (kilolock.store.embedded finds them and
runs them under an unprivileged account when the tests run as root); `pg_basebackup -R` makes the
standby. The standby is synchronous (synchronous_standby_names, synchronous_commit=on): a commit
the primary acknowledged is on the standby, which is what a test of "nothing acknowledged is lost"
needs. fsync is off and the buffers small: the primary's own disk is never read again after it is
killed, so its durability is not what these tests prove, and the cluster starts in a few seconds.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kit.klserve import free_port

if TYPE_CHECKING:
    from kilolock.store.embedded import EmbeddedCluster

USER = "kilolock"
_FAST = ("fsync = off\nfull_page_writes = off\nshared_buffers = 16MB\nmax_connections = 100\n"
         "wal_level = replica\nmax_wal_senders = 4\nwal_sender_timeout = 5s\nwal_receiver_status_interval = 1s\n")


@dataclass
class Node:
    """One server of the pair: its data directory and TCP port on 127.0.0.1."""

    data_dir: Path
    port: int

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def pids(self) -> list[int]:
        """The postmaster and every process it started (backends, WAL sender, checkpointer...)."""
        try:
            postmaster = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return []
        found = [postmaster]
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                found.append(int(entry.name))
        return found


@dataclass
class Replicated:
    """The pair: ``url(db)`` is the multi-host URL a failover-aware client uses."""

    base: Path
    primary: Node
    standby: Node

    def url(self, dbname: str) -> str:
        """libpq's multi-host URL: both servers, the one accepting writes chosen at each connect."""
        return (f"postgresql://{USER}@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}/{dbname}"
                "?target_session_attrs=read-write")

    def kill_primary(self) -> None:
        """SIGKILL every process of the primary at once, as a host that died: no shutdown, no
        goodbye to clients beyond what the kernel does for a closed socket."""
        pids = self.primary.pids()
        assert pids, "the primary is not running"
        # Stopped first, all of them: a backend that outlived its postmaster by a moment would
        # still say goodbye to its client, which a dead host never does.
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids):
            assert time.monotonic() < deadline, f"the primary's processes outlived SIGKILL: {pids}"
            time.sleep(0.05)

    def promote(self) -> None:
        """Make the standby the primary, waiting until it accepts writes."""
        _cluster(self.standby)._run([str(_bin("pg_ctl")), "-D", str(self.standby.data_dir), "-w", "-t", "60", "promote"],
                                    "promote")

    def wait_synchronous(self, timeout: float = 60.0) -> None:
        """Until the primary reports its standby streaming as a synchronous one."""
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            with psycopg.connect(self.primary.url(), autocommit=True) as conn:
                row = conn.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' "
                                   "AND sync_state = 'sync'").fetchone()
            if row is not None and row[0] == 1:
                return
            assert time.monotonic() < deadline, "the standby never became a synchronous one"
            time.sleep(0.1)

    def stop(self) -> None:
        for node in (self.standby, self.primary):
            if node.pids() and _alive(node.pids()[0]):
                _cluster(node)._run([str(_bin("pg_ctl")), "-D", str(node.data_dir), "-m", "immediate", "-w", "stop"],
                                    "stop")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _bin(name: str) -> Path:
    from kilolock.store.embedded import find_pg_bin

    return find_pg_bin() / name


def _cluster(node: Node) -> EmbeddedCluster:
    from kilolock.store.embedded import EmbeddedCluster

    return EmbeddedCluster(node.data_dir)


def _start(node: Node) -> None:
    _cluster(node)._run([str(_bin("pg_ctl")), "-D", str(node.data_dir), "-l", str(node.data_dir / "server.log"),
                         "-w", "-t", "60", "start"], "start")


@contextmanager
def replicated(prefix: str = "kl-repl-", databases: tuple[str, ...] = ()) -> Iterator[Replicated]:
    """A primary and its synchronous standby, with DATABASES created (before the standby is made,
    so it has them too); stopped and removed at the end."""
    import psycopg

    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(base, 0o755)  # as root the servers run unprivileged and must reach their directories
    pair = Replicated(base, Node(base / "primary", free_port()), Node(base / "standby", free_port()))
    try:
        primary = _cluster(pair.primary)
        primary._prepare_dir()
        primary._run([str(_bin("initdb")), "-D", str(pair.primary.data_dir), "-U", USER, "--auth=trust",
                      "--encoding=UTF8", "--locale=C", "--no-instructions"], "initdb")
        with open(pair.primary.data_dir / "postgresql.auto.conf", "a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {pair.primary.port}\n"
                       f"unix_socket_directories = '{pair.primary.data_dir}'\n{_FAST}")
        _start(pair.primary)
        with psycopg.connect(pair.primary.url(), autocommit=True) as admin:
            for name in databases:
                admin.execute(f'CREATE DATABASE "{name}"')
        _cluster(pair.standby)._prepare_dir()
        _cluster(pair.standby)._run([str(_bin("pg_basebackup")), "-D", str(pair.standby.data_dir), "-R",
                                     "-h", "127.0.0.1", "-p", str(pair.primary.port), "-U", USER,
                                     "--checkpoint=fast", "--wal-method=stream"], "pg_basebackup")
        with open(pair.standby.data_dir / "postgresql.auto.conf", "a") as conf:
            # The promoted standby has no standby of its own: it must not wait for one.
            conf.write(f"port = {pair.standby.port}\nunix_socket_directories = '{pair.standby.data_dir}'\n"
                       "synchronous_standby_names = ''\nhot_standby = on\n")
        _start(pair.standby)
        with psycopg.connect(pair.primary.url(), autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            admin.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
            admin.execute("SELECT pg_reload_conf()")
        pair.wait_synchronous()
        yield pair
    finally:
        pair.stop()
        shutil.rmtree(base, ignore_errors=True)
