"""Refresh one state: the chain ``kl refresh STATE``, each state of ``kl refresh --all`` and each
job of a fleet worker go through alike.

The state's id → its stored settings (read once) → the run's options (RefreshOptions.resolve: what
the caller was told, else the stored setting, else kl's default) → wait while another run of the
state is running → the run's provider factory → the process's fleet-wide provider slots →
orchestrator.run, handed the id so that it does not look it up again.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

import psycopg

from kilolock.errors import KlError
from kilolock.redact import Redactor
from kilolock.refresh.client import ClientFactory
from kilolock.refresh.factory import ProviderFactory
from kilolock.refresh.lockwait import LockWaitFn, wait_for_lock
from kilolock.refresh.options import FleetSlotSource, RefreshOptions, RefreshOverrides
from kilolock.refresh.orchestrator import Cancellation, ProgressFn, Result
from kilolock.refresh.orchestrator import run as run_refresh
from kilolock.refresh.policy import refuse_if_locked
from kilolock.refresh.slots import fleet_slots
from kilolock.refresh.sources import Launch, Prelaunch
from kilolock.store import db, fleet, locks, refresh_runs, settings, states
from kilolock.store.db import first_line
from kilolock.store.refresh_runs import StateBusy

if TYPE_CHECKING:
    from kilolock.refresh.prelaunch import Prelaunched


class FactorySource(Protocol):
    """Where a run gets its providers, once its options are known: launched for it (Launching), a
    fleet worker's warm pool, or a test's fakes."""

    def __call__(self, conn: psycopg.Connection, state_id: str, options: RefreshOptions) -> ClientFactory: ...


class Launching:
    """Providers launched for the run, taking those started early when given
    (kilolock.refresh.prelaunch). ``factory``: the last one made, from which ``kl refresh`` learns
    which binaries ran and whether providers can start in this process at all."""

    def __init__(self, early: Prelaunched | None = None) -> None:
        self.early = early
        self.factory: ProviderFactory | None = None

    def __call__(self, conn: psycopg.Connection, state_id: str, options: RefreshOptions) -> ProviderFactory:
        self.factory = ProviderFactory(conn, state_id, options.search_paths, rpc_timeout=options.rpc_timeout,
                                       workdir=options.workdir,
                                       source=Prelaunch(self.early) if self.early is not None else Launch())
        return self.factory


class _Slots(enum.Enum):
    OWN = "own"


# The run leases fleet-wide provider slots (kl provider limit) for itself, as a lone kl refresh
# does; a process running many states at once passes the FleetSlots they share instead (or None
# when the fleet limits no provider).
OWN_SLOTS = _Slots.OWN


def check_not_running(conn: psycopg.Connection, sid: str, name: str) -> None:
    """Refuse (StateBusy) while a fleet worker or another live ``kl refresh`` refreshes the state:
    two runs of one state never overlap, so ``kl refresh`` waits for it (--lock-timeout) or says
    who runs it."""
    job = fleet.running_job(conn, sid)
    if job is not None:
        raise StateBusy(name, {"Who": f"worker {job['worker']} (fleet job {job['id']})", "Created": job["claimed_at"],
                               "Operation": "kl worker", "ID": job["run_id"] or f"job {job['id']}"},
                        "--lock-timeout DURATION waits for it")
    busy = refresh_runs.live_run(conn, sid)
    if busy is not None:
        raise busy


def wait_until_not_running(conn: psycopg.Connection, sid: str, name: str, lock_timeout: float,
                           cancel: Cancellation) -> None:
    wait_for_lock(lambda: check_not_running(conn, sid, name), lock_timeout, sleep=cancel.wait)


def refresh_one(
    conn: psycopg.Connection,
    name: str,
    overrides: RefreshOverrides,
    *,
    state_id: str | None = None,
    factories: FactorySource | None = None,
    provider_slots: FleetSlotSource | None | _Slots = OWN_SLOTS,
    wait: bool = True,
    cancel: Cancellation | None = None,
    progress: ProgressFn | None = None,
    secrets: Redactor | None = None,
    on_lock_wait: LockWaitFn | None = None,
    on_loaded: Callable[[], None] | None = None,
) -> Result:
    """Refresh state NAME as ``kl refresh NAME`` does. ``state_id``: its id, when the caller has it;
    ``factories``: where its providers come from (launched for it unless given); ``wait``: for
    another run of the state to end first (False for a fleet worker, whose claimed job counts as
    one; such a caller also hears of an apply's lock held at the start as StateLocked, and no run
    begins). An error before the run began is raised: StateNotFound, StateBusy, a bad stored setting."""
    cancel = cancel or Cancellation()
    sid = state_id or states.state_id(conn, name)
    options = RefreshOptions.resolve(overrides, settings.get(conn, sid))
    if wait:
        wait_until_not_running(conn, sid, name, options.lock_timeout, cancel)
    elif not options.dry_run:
        # A fleet job that meets an apply's lock came early rather than failed: no run begins, and
        # the worker queues it again, instead of a failed run that channels hear of at every apply.
        refuse_if_locked(conn, sid, name, options.commit, hint=None)
    factory = (factories or Launching())(conn, sid, options)
    with _leased(conn, provider_slots) as slots:
        if slots is not None:
            options = dataclasses.replace(options, provider_slots=slots)
        return run_refresh(conn, name, factory, options, state_id=sid, progress=progress, cancel=cancel,
                           secrets=secrets, on_lock_wait=on_lock_wait, on_loaded=on_loaded)


@contextmanager
def _leased(conn: psycopg.Connection, given: FleetSlotSource | None | _Slots) -> Iterator[FleetSlotSource | None]:
    if given is not OWN_SLOTS:
        yield given
        return
    with fleet_slots(conn) as own:  # kl provider limit counts a lone kl refresh too
        yield own


def failed(name: str, message: str) -> Result:
    """A run that could not begin, as a Result: one state's failure among many."""
    return Result(state=name, status="failed", error=message)


def refresh_or_fail(conn: psycopg.Connection, name: str, overrides: RefreshOverrides, *, state_id: str | None = None,
                    factories: FactorySource | None = None,
                    provider_slots: FleetSlotSource | None | _Slots = OWN_SLOTS, wait: bool = True,
                    cancel: Cancellation | None = None) -> Result:
    """refresh_one, for callers that report state by state: an error before the run began (or a
    lost database) is a failed Result. StateLocked (StateBusy among them) is still raised: no run
    began, and the caller waits, retries or reports it."""
    try:
        return refresh_one(conn, name, overrides, state_id=state_id, factories=factories,
                           provider_slots=provider_slots, wait=wait, cancel=cancel)
    except locks.StateLocked:
        raise
    except KlError as exc:
        return failed(name, str(exc))
    except psycopg.Error as exc:
        if not db.lost(exc, conn):
            raise
        return failed(name, f"lost the database connection ({first_line(exc)}); nothing was refreshed")
