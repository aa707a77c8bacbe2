"""kl tokens (and OIDC trusts) made while ``kl serve`` runs. A server that does not accept the
store's credentials yet (no usable token nor trust existed at its start) asks the store every few
seconds whether one does now; from the first one on it accepts them, for the rest of its life, and
the check stops.

A check every few seconds rather than a query per request: without kl tokens a request needs no
database round trip to be authenticated. Once they are accepted, every request that carries one
looks it up (kilolock.server.access), so revocations, expiries and grant changes need no watching.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import psycopg

from kilolock.errors import KlError
from kilolock.server.auth import Authenticator
from kilolock.server.pool import PoolExhausted
from kilolock.store import access as access_store
from kilolock.store import db, oidc_trusts

log = logging.getLogger("kilolock.server")

# Seconds between two checks: how long a new first token may go unnoticed.
CHECK_EVERY = 2.0


class TokenWatch:
    """Turns AUTH's kl tokens (and OIDC tokens) on once the store holds a usable token or a trust,
    then calls ON_ACCEPTED once, with "token" or "trust"."""

    def __init__(self, auth: Authenticator, connection: Callable[[], AbstractContextManager[psycopg.Connection]],
                 on_accepted: Callable[[str], None], interval: float = CHECK_EVERY) -> None:
        self._auth = auth
        self._connection = connection
        self._on_accepted = on_accepted
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kl-token-watch", daemon=True)

    def start(self) -> None:
        if not self._auth.accepts_kl_tokens:
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                with self._connection() as conn:
                    found = "token" if access_store.any_usable_token(conn) else "trust" if oidc_trusts.any_trust(conn) else None
            except (PoolExhausted, KlError, psycopg.Error) as exc:
                # The requests of the same outage log it; the next check retries.
                log.debug("checking for kl tokens: %s", db.first_line(exc))
                continue
            if found:
                self._auth.accept_kl_tokens()
                self._on_accepted(found)
                return
