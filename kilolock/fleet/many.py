"""``kl refresh --all``: many states in one process, each as ``kl refresh STATE`` runs it.

Every state goes through the refresh service (kilolock.refresh.service) with its own stored
settings, on a connection of its own, several at once; the states refreshed at once share the
process's fleet-wide provider slots. One state's failure is its Result, not the end of the others.
"""
from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable

import psycopg

from kilolock.errors import KlError
from kilolock.refresh import slots
from kilolock.refresh.options import FleetSlotSource, RefreshOverrides
from kilolock.refresh.orchestrator import Cancellation, Result
from kilolock.refresh.service import failed, refresh_or_fail
from kilolock.store import db


def refresh_many(conn: psycopg.Connection, names: list[str], overrides: RefreshOverrides, parallel: int,
                 cancel: Cancellation, on_done: Callable[[Result], None] | None = None) -> list[Result]:
    """Refresh NAMES, PARALLEL at a time, each on its own connection; results in NAMES' order.
    A state a worker is refreshing is waited for (the lock timeout) or reported failed."""
    def one(name: str, shared: FleetSlotSource | None) -> Result:
        if cancel.cancelled:
            return Result(state=name, status="cancelled", error=cancel.reason)
        try:
            with db.reconnect(conn) as own:
                result = refresh_or_fail(own, name, overrides, provider_slots=shared, cancel=cancel)
        except KlError as exc:  # StateBusy too: the wait ran out, or a worker took the state after it
            result = failed(name, str(exc))
        if on_done is not None:
            on_done(result)
        return result

    # The states refreshed at once share this process's slots.
    with slots.fleet_slots(conn) as shared, \
            cf.ThreadPoolExecutor(max(1, parallel), thread_name_prefix="kl-state") as pool:
        return list(pool.map(lambda name: one(name, shared), names))
