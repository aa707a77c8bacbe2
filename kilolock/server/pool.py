"""A small pool of database connections: each request thread borrows one for the length of the
request, so no psycopg connection is ever used by two threads at once."""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from kilolock.store import db


class PoolExhausted(Exception):
    """Every connection stayed busy for the whole wait: the server is overloaded."""


class ConnectionPool:
    def __init__(self, connect: Callable[[], psycopg.Connection], size: int, wait: float) -> None:
        self._connect = connect
        self._idle: queue.LifoQueue[psycopg.Connection] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._wait = wait
        self._closed = False

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        if not self._slots.acquire(timeout=self._wait):
            raise PoolExhausted()
        conn = None
        try:
            conn = self._take_idle()
            if conn is None:
                conn = self._connect()
            try:
                yield conn
            except psycopg.Error as exc:
                # Behind PgBouncer a connection that broke inside a transaction surfaces on psycopg's
                # own COMMIT/SAVEPOINT as an InternalError without SQLSTATE: a lost connection (503,
                # retry), not a bug. The broken connection is dropped below; the next request opens one.
                if isinstance(exc, psycopg.OperationalError) or not db.lost(exc, conn):
                    raise
                raise db.ConnectionLost(f"lost the database connection: {db.first_line(exc)}") from exc
        finally:
            if conn is not None:
                # A connection left inside a transaction (or broken) by an error is not reused.
                if conn.broken:
                    # Its server connection died: a restart or a pooler's reconnect ended the idle
                    # ones with it, and each would cost a request its 503 (Terraform waits
                    # Retry-After between only two retries), so none of them is reused.
                    conn.close()
                    self._close_idle()
                elif self._closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.close()
                else:
                    self._idle.put(conn)
            self._slots.release()

    def _take_idle(self) -> psycopg.Connection | None:
        """An idle connection not already found dead, or None. A connection the server dropped while
        idle in the pool (a PostgreSQL or PgBouncer restart, pg_terminate_backend) is closed here
        and never used: the request goes on on a live or a new one instead of failing (a 503, which
        costs Terraform a 10 s wait) before anything of it was sent."""
        while True:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                return None
            if not db.dropped_while_idle(conn):
                return conn
            conn.close()

    def close(self) -> None:
        self._closed = True
        self._close_idle()

    def _close_idle(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
