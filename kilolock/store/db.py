"""Which database kl talks to, and opening connections to it."""
from __future__ import annotations

import os
import re
import select
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import psycopg.conninfo

from kilolock.errors import KlError


class DatabaseError(KlError):
    pass


class ConnectionLost(DatabaseError):
    """The database connection broke under a command (a fault of the environment, to retry)."""


@dataclass(frozen=True)
class Target:
    """The database kl uses: its URL, and whether it is kl's embedded cluster."""

    url: str
    embedded: bool

    def describe(self) -> str:
        return f"embedded ({self.url})" if self.embedded else _redact(self.url)


# password=… in a keyword string (quoted or not) or a URL query parameter.
_PASSWORD_PARAM = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)


def _redact(url: str) -> str:
    # postgresql://user:secret@host/db -> postgresql://user:***@host/db; host=h password=secret ->
    # host=h password=***; postgresql:///db?password=secret -> postgresql:///db?password=***
    url = _PASSWORD_PARAM.sub(r"\1***", url)
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    if ":" in creds:
        creds = creds.split(":", 1)[0] + ":***"
    return f"{scheme}://{creds}@{host}"


def _without_quoted_fragments(message: str) -> str:
    # libpq quotes the part of a malformed connection string it stumbled on, which may be (part
    # of) the password: keep the message, drop the fragments.
    return re.sub(r'"([^"]*)"', lambda m: m.group(0) if len(m.group(1)) <= 1 else '"…"', message)


def resolve_target(start_embedded: bool = True) -> Target:
    """KL_DATABASE_URL when set; otherwise the embedded cluster, started on demand."""
    url = os.environ.get("KL_DATABASE_URL")
    if url:
        return Target(url=url, embedded=False)
    from kilolock.store.embedded import EmbeddedCluster, default_data_dir

    cluster = EmbeddedCluster(default_data_dir())
    return Target(url=cluster.ensure_running() if start_embedded else cluster.url(), embedded=True)


# PgBouncer in transaction pooling mode hands each transaction to any server connection, so
# nothing a session holds survives: prepared statements (psycopg prepares a query run 5 times),
# session advisory locks, session settings, LISTEN. kl cannot tell PgBouncer from PostgreSQL on the
# wire, so it is told: `kl_pooler=transaction` in the connection string (stripped before libpq
# sees it) or KL_DATABASE_POOLER=transaction. Then no statement is prepared and a refresh run's
# liveness is a heartbeat on its row instead of a session lock (kilolock.store.refresh_runs).
POOLER_PARAM = "kl_pooler"
POOLER_ENV = "KL_DATABASE_POOLER"
_POOLER_MODES = ("transaction", "none")
_POOLER_IN_URI = re.compile(r"([?&])kl_pooler=([^&#]*)&?")
_POOLER_IN_KEYWORDS = re.compile(r"(?:^|\s)kl_pooler\s*=\s*('[^']*'|\S*)")
_pooler = {"transaction": False}


def split_pooler(url: str) -> tuple[str, str | None]:
    """(URL without kl_pooler, its value or None)."""
    m = _POOLER_IN_URI.search(url)
    if m is not None:
        rest = url[:m.start()] + (m.group(1) if m.group(0).endswith("&") else "") + url[m.end():]
        return rest.rstrip("?&"), m.group(2)
    if "://" not in url:
        k = _POOLER_IN_KEYWORDS.search(url)
        if k is not None:
            return (url[:k.start()] + url[k.end():]).strip(), k.group(1).strip("'")
    return url, None


def transaction_pooled() -> bool:
    """Whether this process talks to the database through a transaction-pooling PgBouncer."""
    return _pooler["transaction"] or os.environ.get(POOLER_ENV, "") == "transaction"


def connect(url: str) -> psycopg.Connection:
    url, pooler = split_pooler(url)
    env = os.environ.get(POOLER_ENV, "")
    for where, value in ((f"{POOLER_PARAM}= in the connection string", pooler), (f"${POOLER_ENV}", env or None)):
        if value is not None and value not in _POOLER_MODES:
            raise DatabaseError(f"{where}: {value!r} is not one of {', '.join(_POOLER_MODES)}")
    if pooler == "transaction":
        _pooler["transaction"] = True  # every connection of this process goes through it (reconnects too)
    try:
        if transaction_pooled():
            conn = psycopg.connect(_with_liveness(url), application_name="kilolock", autocommit=True,
                                   prepare_threshold=None)
        else:
            conn = psycopg.connect(_with_liveness(url), application_name="kilolock", autocommit=True)
        _opened_connections.add(conn)
        _urls[conn] = url
        return conn
    except psycopg.OperationalError as exc:
        raise DatabaseError(f"cannot connect to the database {_redact(url)}: {first_line(exc)}") from None
    except psycopg.ProgrammingError as exc:  # a malformed connection string: the user's to fix
        raise DatabaseError(f"the database connection string (KL_DATABASE_URL) is malformed: {_without_quoted_fragments(first_line(exc))}") from None


# ---------------------------------------------------------------- liveness
# A database that is gone must cost a bounded wait, never a hang: a long-lived process (kl worker,
# kl serve) retries, and must still obey SIGTERM. libpq waits for a connection as long as
# connect_timeout says (psycopg's default is 130 s) and, on TCP, notices a peer that vanished
# without a word (a host lost, a network cut) only through keepalives. Both are set unless the
# connection string (or libpq's environment) says otherwise.
CONNECT_TIMEOUT_S = 10
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 15, "keepalives_interval": 5, "keepalives_count": 3}


def _with_liveness(url: str) -> str:
    try:
        given = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return url  # malformed: connect reports it
    extra: dict[str, int] = {}
    if "connect_timeout" not in given and not os.environ.get("PGCONNECT_TIMEOUT"):
        extra["connect_timeout"] = CONNECT_TIMEOUT_S
    if not any(k.startswith("keepalives") for k in given):
        extra.update(_KEEPALIVES)
    return psycopg.conninfo.make_conninfo(url, **extra) if extra else url


def lost(exc: BaseException, conn: psycopg.Connection | None = None) -> bool:
    """Whether EXC means the connection is gone (a fault of the environment, to retry on a new
    one) rather than a query that failed. Beside OperationalError: a connection that broke inside
    a transaction behind PgBouncer answers psycopg's own BEGIN/SAVEPOINT/COMMIT with the pooler's
    error and the end of the stream at once, which psycopg reports as an InternalError ("received
    2 results from command ...") with no SQLSTATE, on a connection it has marked broken."""
    if isinstance(exc, psycopg.OperationalError):
        return True
    return (isinstance(exc, psycopg.Error) and exc.sqlstate is None and conn is not None
            and (conn.broken or conn.closed))


# Every connection this process opened, for an error that reaches the CLI's last resort without
# the connection it came from (lost_in_process).
_opened_connections: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()


def lost_in_process(exc: BaseException) -> bool:
    """lost() for an error caught far from its connection: an error without SQLSTATE counts as a
    lost connection when a connection this process opened is broken (a query's own error never
    breaks one). For the CLI's last resort only: a server's threads share the process."""
    if isinstance(exc, psycopg.OperationalError):
        return True
    return (isinstance(exc, psycopg.Error) and exc.sqlstate is None
            and any(c.broken for c in list(_opened_connections)))


def commit_outcome_unknown(exc: BaseException) -> bool:
    """Whether EXC was raised by psycopg's COMMIT: the connection may have broken after the server
    committed, so the write may have landed although its answer was lost."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "_commit_gen" and f"{os.sep}psycopg{os.sep}" in code.co_filename:
            return True
        tb = tb.tb_next
    return False


# The connection string each connection was opened with. libpq's account of a connection
# (conn.info.dsn) names the one server it reached, so a reconnect from it would go back to a
# primary that died rather than on to the next host of a multi-host URL (`host=a,b` with
# target_session_attrs=read-write): after a failover that is the promoted standby.
_urls: weakref.WeakKeyDictionary[psycopg.Connection, str] = weakref.WeakKeyDictionary()

# How long recovery after a lost connection (settling a cut commit, finishing an audit row or a
# fleet job) keeps trying to connect again: a failover leaves no primary until the standby is
# promoted, and giving up at once would leave an outcome unknown that a minute later can be known.
RECONNECT_WAIT_ENV = "KL_DATABASE_RECONNECT_WAIT"
RECONNECT_WAIT_S = 60.0
_RECONNECT_BACKOFF_MAX_S = 2.0


def url_of(conn: psycopg.Connection) -> str:
    """The connection string to open another connection to CONN's database (CONN may be dead): the
    one it was opened with, every host of it; for a connection kl did not open, psycopg's dsn with
    the password it leaves out put back (a server that asks for one would refuse otherwise)."""
    known = _urls.get(conn)
    if known is not None:
        return known
    dsn, password = conn.info.dsn, conn.info.password
    if password:
        dsn = psycopg.conninfo.make_conninfo(dsn, password=password)
    return dsn


def reconnect_wait() -> float:
    """Seconds recovery keeps trying to connect (RECONNECT_WAIT_ENV, a duration; 0: one attempt)."""
    from kilolock.durations import from_env

    return from_env(RECONNECT_WAIT_ENV, RECONNECT_WAIT_S)


def reconnect(conn: psycopg.Connection, wait: float = 0.0) -> psycopg.Connection:
    """A new connection to the database CONN was connected to (CONN may be dead), trying again
    with backoff for up to WAIT seconds while none can be had (a primary down, its standby not yet
    promoted); the last failure is raised after that."""
    url = url_of(conn)
    deadline = time.monotonic() + wait
    pause = 0.2
    while True:
        try:
            return connect(url)
        except DatabaseError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(pause, left))
            pause = min(pause * 2, _RECONNECT_BACKOFF_MAX_S)


@contextmanager
def reconnected(conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """reconnect(CONN) for recovering from its break, closed after the block, trying to connect
    for up to reconnect_wait() (a failover may have no primary for a while). When the new
    connection breaks too, in whatever shape psycopg reports it (lost(): an InternalError without
    SQLSTATE behind PgBouncer as well as an OperationalError), the block raises ConnectionLost: a
    KlError like failing to connect, so recovery code catches KlError alone and says one line.
    Judged inside the block: once closed, any connection looks lost."""
    with reconnect(conn, reconnect_wait()) as fresh:
        try:
            yield fresh
        except psycopg.Error as exc:
            if not lost(exc, fresh):
                raise
            raise ConnectionLost(first_line(exc)) from exc


def open_store(migrate: bool | None = None, target: Target | None = None) -> psycopg.Connection:
    """A connection ready for use: the schema must be current.

    The embedded database is migrated automatically (it is kl's own); an external one must be
    migrated explicitly with `kl db migrate`, unless `migrate=True`. ``target``: the database, when
    the caller resolved it already (resolve_target otherwise).
    """
    from kilolock.store import deliveries
    from kilolock.store.migrate import apply_migrations, pending_migrations

    target = target or resolve_target()
    reconnect_wait()  # a mistyped setting is said now, not first in the middle of a recovery
    conn = connect(target.url)
    try:
        if migrate or (migrate is None and target.embedded):
            apply_migrations(conn)
        else:
            pending = pending_migrations(conn)
            if pending:
                conn.close()
                raise DatabaseError(
                    f"the database schema is not current ({len(pending)} pending migration(s), first {pending[0]}); run `kl db migrate`"
                )
        # One indexed EXISTS: any notification a crashed or impatient process left to deliver?
        deliveries.check_due(conn)
    except psycopg.OperationalError as exc:
        # The server went away between connecting and the schema check (a restart, a terminated
        # backend): a fault to name in one line, not an internal error with the query quoted.
        conn.close()
        raise DatabaseError(f"lost the database connection to {target.describe()} ({first_line(exc)})") from None
    return conn


def dropped_while_idle(conn: psycopg.Connection) -> bool:
    """Whether an idle connection is gone, without a round trip: nothing is sent to an idle
    connection unasked (kl LISTENs on none), so a readable socket is the server's goodbye (the FATAL
    of a shutdown or pg_terminate_backend) or the end of the stream (PgBouncer restarted, a server
    killed). A rare unasked message (a NOTICE, a changed reported setting) only costs a new
    connection. A host lost without a word is not seen here: the next query finds it."""
    if conn.closed or conn.broken:
        return True
    fd = conn.fileno()
    if hasattr(select, "poll"):  # select() cannot watch a descriptor past 1023, which a busy server has
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def ping(conn: psycopg.Connection) -> None:
    """A round trip to the server: raises psycopg.OperationalError when the connection is dead."""
    conn.execute("SELECT 1").fetchone()


def first_line(exc: BaseException) -> str:
    """The first line of a driver error: psycopg appends the query and a caret on later lines."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
