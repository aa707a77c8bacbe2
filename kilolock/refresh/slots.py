"""Fleet-wide provider limits, enforced in one process: slots leased in batches from the database.

``kl provider limit SOURCE --max-in-flight N`` caps the calls in flight to a provider across every
kl process that shares the database. Each process keeps a ``FleetSlots``: per limited provider a
``ProviderSlots`` that reader threads take a slot from before each call (through the in-flight
Gate, kilolock.refresh.inflight) and give back after it; no database round trip per call. One
background thread per process syncs the batch with the database (kilolock.store.provider_limits):
it asks for what its threads want now (calls in flight plus those waiting), gets what is free of
the limit (a fair share when another process is starved), and renews the lease. Syncs happen when
threads wait for a slot the process does not hold (at most every MIN_SYNC_S) and every
RENEW_S otherwise, so idle slots go back to the fleet within a few seconds.

Safety does not depend on anyone noticing a death: a process starts a call only while its lease
is valid on its own monotonic clock (counted from before the sync was sent, with a margin), and the
database counts a lease until a time no earlier than that. A process cut off from the database stops
starting calls before its slots can be handed to anyone else.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from kilolock.errors import KlError
from kilolock.store import db, provider_limits
from kilolock.store.db import first_line

log = logging.getLogger("kilolock.refresh.slots")

LEASE_S = 15.0  # a dead process's slots come back to the fleet this long after its last sync
MIN_SYNC_S = 0.2  # waiting threads ask again at most this often (per provider)
RENEW_S = 2.0  # a held lease is renewed (and surplus returned) this often
LIMITS_EVERY_S = 5.0  # how often a long-lived process re-reads the limits (kl provider limit changed them)
SAFETY = 0.8  # the share of the lease this process trusts on its own clock


class ProviderSlots:
    """One limited provider (source, alias) in this process: a counting semaphore whose size is the
    batch the process leases. Thread-safe."""

    def __init__(self, source: str, alias: str, limit: int, wake: Callable[[], None]) -> None:
        self.source = source
        self.alias = alias
        self.limit = limit  # the fleet-wide max_in_flight: no one run needs more threads than this
        self.in_use = 0
        self.waiting = 0
        self.granted = 0  # what this process may have in flight while the lease is valid
        self.valid_until = 0.0  # time.monotonic()
        self.synced_at = 0.0
        self.max_in_use = 0
        self._wake = wake
        self._cond = threading.Condition()

    def _allowed(self) -> int:
        return self.granted if time.monotonic() < self.valid_until else 0

    def acquire(self, should_stop: Callable[[], bool] | None = None) -> bool:
        """Block until this process holds a free slot; False when should_stop says so first."""
        with self._cond:
            self.waiting += 1
            try:
                while self.in_use >= self._allowed():
                    if should_stop is not None and should_stop():
                        return False
                    self._wake()
                    self._cond.wait(0.05)
                self.in_use += 1
                self.max_in_use = max(self.max_in_use, self.in_use)
                return True
            finally:
                self.waiting -= 1

    def release(self) -> None:
        with self._cond:
            self.in_use -= 1
            self._cond.notify()

    def demand(self) -> tuple[int, int]:
        """(wanted, in use) now: what the next sync asks for."""
        with self._cond:
            return self.in_use + self.waiting, self.in_use

    def granted_until(self, granted: int, valid_until: float) -> None:
        with self._cond:
            self.granted, self.valid_until = granted, valid_until
            self._cond.notify_all()

    def hungry(self) -> bool:
        with self._cond:
            return self.waiting > 0 and self.in_use >= self._allowed()


class FleetSlots:
    """A process's leases of every limited provider, and the thread that keeps them in sync.

    ``for_provider`` is what a run asks (RefreshOptions.provider_slots); ``close`` gives every slot
    back. Its database connection is its own (a reconnect of the one it was given)."""

    def __init__(self, conn: psycopg.Connection, limits: dict[tuple[str, str], int], lease_s: float = LEASE_S,
                 renew_s: float = RENEW_S) -> None:
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"  # not uuid: it imports platform
        self.lease_s = lease_s
        self.renew_s = min(renew_s, lease_s / 4)
        # Kept as text: the connection it came from may be closed and replaced (a worker reconnects).
        self._dsn = db.url_of(conn)
        self._conn: psycopg.Connection | None = None
        self._limits = dict(limits)
        self._limits_at = time.monotonic()
        self._slots: dict[tuple[str, str], ProviderSlots] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def for_provider(self, source: str, alias: str) -> ProviderSlots | None:
        """The slots of (SOURCE, ALIAS) when the fleet limits it; None: no limit, no waiting."""
        with self._lock:
            if self._thread is None:  # also for a provider without a limit: it re-reads them now and then
                self._thread = threading.Thread(target=self._run, name="kl-fleet-slots", daemon=True)
                self._thread.start()
            limit = self._limits.get((source, alias))
            if limit is None:
                return None
            slots = self._slots.get((source, alias))
            if slots is None:
                slots = self._slots[(source, alias)] = ProviderSlots(source, alias, limit, self._wake.set)
            return slots

    def close(self) -> None:
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._conn is not None and not self._conn.closed:
            try:
                provider_limits.release(self._conn, self.holder)
            except psycopg.Error as exc:
                log.debug("giving back fleet slots: %s", first_line(exc))
            self._conn.close()

    def _db(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = db.connect(self._dsn)
        return self._conn

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                self._sync_all()
            except (KlError, psycopg.Error) as exc:
                # No database: the leases run out on their own (valid_until); keep trying.
                log.warning("fleet provider limits: %s", first_line(exc))
                if self._conn is not None:
                    self._conn.close()
                self._conn = None
                self._closing.wait(MIN_SYNC_S * 5)
                continue
            self._wake.wait(self.renew_s)
            self._wake.clear()
            if not self._closing.is_set():
                self._closing.wait(MIN_SYNC_S)  # batch the waiters that arrive together into one sync

    def _sync_all(self) -> None:
        now = time.monotonic()
        if now - self._limits_at >= LIMITS_EVERY_S:
            self._refresh_limits()
        with self._lock:
            slots = list(self._slots.values())
        for s in slots:
            wanted, in_use = s.demand()
            due = now - s.synced_at >= self.renew_s or (s.hungry() and now - s.synced_at >= MIN_SYNC_S)
            if not due or (wanted == 0 and s.granted == 0 and s.synced_at > 0):
                continue
            sent = time.monotonic()
            granted = provider_limits.sync(self._db(), s.source, s.alias, self.holder, wanted, in_use, self.lease_s)
            s.synced_at = sent
            if granted is None:  # the limit was removed: nothing to wait for any more
                s.granted_until(1 << 30, float("inf"))
                continue
            # The database counts the lease from its commit, after SENT: trusting less of it on this
            # clock keeps this process inside the lease whatever the round trip took.
            s.granted_until(granted, sent + self.lease_s * SAFETY)

    def _refresh_limits(self) -> None:
        limits = provider_limits.all_limits(self._db())
        with self._lock:
            self._limits = limits
            self._limits_at = time.monotonic()
            for key, s in self._slots.items():
                if key in limits:
                    s.limit = limits[key]


@contextmanager
def fleet_slots(conn: psycopg.Connection, always: bool = False) -> Iterator[FleetSlots | None]:
    """The process's FleetSlots when any provider limit exists (None otherwise: one query, no thread).
    ALWAYS (a long-lived worker): a FleetSlots even without limits yet, so one set later applies."""
    limits = provider_limits.all_limits(conn)
    if not limits and not always:
        yield None
        return
    slots = FleetSlots(conn, limits)
    try:
        yield slots
    finally:
        slots.close()
