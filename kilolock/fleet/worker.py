"""``kl worker``: the fleet's queue (kilolock.store.fleet) worked off by one process.

Each job is refreshed as ``kl refresh STATE`` would (kilolock.refresh.service: its own audit row,
lock and commit rule, the state's stored settings), on a connection of its own, several states at
once, with providers kept warm between runs (kilolock.fleet.warm). The worker fires due schedules,
claims due jobs with a lease it renews from a heartbeat thread, takes over jobs whose lease
expired, and on SIGTERM stops claiming, lets its runs finish, and cancels them after a grace period.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

import psycopg

from kilolock import cron
from kilolock.errors import KlError
from kilolock.fleet.warm import WarmProviders
from kilolock.refresh import slots
from kilolock.refresh.factory import ProviderFactory
from kilolock.refresh.options import FleetSlotSource, RefreshOptions, RefreshOverrides
from kilolock.refresh.orchestrator import Cancellation
from kilolock.refresh.service import refresh_or_fail
from kilolock.store import db, fleet, locks, refresh_runs
from kilolock.store.db import first_line

log = logging.getLogger("kilolock.fleet")

_T = TypeVar("_T")


# ---------------------------------------------------------------- schedules

def next_run(schedule: fleet.Schedule, now: datetime) -> datetime:
    """The first time after NOW the schedule fires again: every-schedules keep their grid (created
    + k * every), cron ones their expression; a missed time is never made up more than once."""
    if schedule.cron:
        found = cron.parse(schedule.cron).next_after(now)
        return found if found is not None else now + timedelta(days=366 * 30)
    every = schedule.every_s or 60.0
    behind = (now - schedule.next_run_at).total_seconds()
    steps = int(behind // every) + 1 if behind >= 0 else 1
    return schedule.next_run_at + timedelta(seconds=steps * every)


# ---------------------------------------------------------------- kl worker

# After the database failed, the worker tries again after its poll interval, doubled at each
# failure in a row up to this: hundreds of workers do not hammer a server (or a pooler refusing
# logins for its server_login_retry) that is coming back, and each goes on at most this long after
# the database answers again.
DB_RETRY_MAX_S = 5.0
# After SIGTERM and the grace period, how long cancelled runs and the worker's own bookkeeping
# (recording its stop, giving back fleet slots) may take: with the database unreachable or hung
# they cannot finish, and the process exits anyway (their leases run out; another worker takes
# their jobs over and records their runs as failed).
EXIT_BUDGET_S = 10.0


@dataclass(frozen=True)
class WorkerConfig:
    """How a fleet worker runs: its name, how many states at once, its lease and polling."""

    name: str | None = None
    parallel_states: int = 1
    once: bool = False
    lease_s: float = 60.0  # a job whose worker stops heartbeating is taken over this long after
    poll_s: float = 2.0  # how often to look for due schedules and jobs
    grace_s: float = 60.0  # after SIGTERM, how long runs may take before they are cancelled
    max_attempts: int = 3  # claims of one job that ended with its worker dead before it fails
    warm_providers: int = 4  # provider processes kept idle for the next run (0: launch one per run, as kl refresh)
    warm_idle_s: float = 300.0  # an idle warm provider is shut down after this long

    @property
    def heartbeat_s(self) -> float:
        return max(0.1, self.lease_s / 6)


@dataclass
class _InFlight:
    """A job a fleet worker is running, and how to cancel it."""

    job: fleet.Job
    cancel: Cancellation = field(default_factory=Cancellation)
    thread: threading.Thread | None = None
    shutdown: bool = False  # cancelled because the worker stops: the job goes back to the queue


class Worker:
    """One ``kl worker`` process. ``stop()`` (SIGTERM) drains; ``run()`` returns an exit code."""

    def __init__(self, conn: psycopg.Connection, config: WorkerConfig, overrides: RefreshOverrides,
                 say: Callable[[str], None] = print) -> None:
        self.conn = conn
        self.config = config
        self.overrides = overrides  # what every run is told on top of its state's stored settings
        self.say = say
        self.worker_id = 0
        self.name = ""
        self._stopping = threading.Event()
        self._wake = threading.Event()  # a run ended, or stop(): look at the queue now
        self._inflight: dict[int, _InFlight] = {}
        self._lock = threading.Lock()
        self.completed = 0
        self.failed = 0
        self.warm = WarmProviders(config.warm_providers, config.warm_idle_s)
        self._slots: FleetSlotSource | None = None  # while claiming: one FleetSlots for all of its runs
        self._stop_at: float | None = None  # time.monotonic() of stop()
        self._stop_requested: str | None = None  # by a signal (request_stop), for run() to act on
        self._db_failures = 0  # database errors in a row in the claiming loop
        self.abandoned = 0  # threads still stuck (on a hung database) when the worker gave up on them

    def request_stop(self, why: str) -> None:
        """stop() as a signal handler may ask for it: the handler runs on the main thread between
        any two bytecodes, also inside an Event.set() of that thread (a first signal's stop()),
        whose lock is not reentrant: a second SIGTERM there deadlocked the worker. So it only
        notes the request, taking no lock, and run()'s supervising loop (back every 0.2 s) stops."""
        if self._stop_requested is None:
            self._stop_requested = why

    def stop(self, why: str = "SIGTERM") -> None:
        if not self._stopping.is_set():
            self._stop_at = time.monotonic()
            self.say(f"kl worker {self.name}: {why}: claiming nothing more; waiting up to "
                     f"{self.config.grace_s:g}s for {len(self._inflight)} run(s)")
        self._stopping.set()
        self._wake.set()

    def run(self) -> int:
        """Claim and run jobs until stop() (or, with --once, until nothing is due). The calling
        (main) thread only supervises: the claiming loop runs on a thread of its own, so that after
        stop() the worker returns within grace + EXIT_BUDGET_S even when a database call hangs (a
        pooler that stopped answering, a network cut without a reset). Threads still stuck then
        are left behind (daemon threads: they end with the process); ``abandoned`` counts them."""
        cfg = self.config
        self.worker_id, self.name = fleet.register_worker(self.conn, cfg.name, cfg.parallel_states, cfg.lease_s)
        self.say(f"kl worker {self.name}: started (id {self.worker_id}, {cfg.parallel_states} state(s) at once, "
                 f"lease {cfg.lease_s:g}s)")
        beats = threading.Thread(target=self._heartbeats, name="kl-heartbeat", daemon=True)
        beats.start()
        errors: list[BaseException] = []
        claiming = threading.Thread(target=self._claiming, args=(errors,), name="kl-claiming", daemon=True)
        claiming.start()
        while claiming.is_alive():
            # A bounded join: the main thread must come back to run the SIGTERM handler.
            claiming.join(min(0.2, self._until_exit(0.2)))
            if self._stop_requested is not None and not self._stopping.is_set():
                self.stop(self._stop_requested)
            if self._stop_at is not None and time.monotonic() >= self._exit_deadline():
                break
        self._stopping.set()
        self.warm.close()
        stuck = [t for t in [claiming, *self._flight_threads()] if t.is_alive()]
        if stuck:
            self.abandoned = len(stuck)
            self.say(f"kl worker {self.name}: the database did not answer: leaving {len(stuck)} thread(s) behind; "
                     "their jobs go to another worker when their leases run out")
        else:
            beats.join(timeout=max(0.1, self._until_exit(5.0)))
            if not self._bounded(lambda: fleet.stop_worker(self.conn, self.worker_id), "recording the worker's stop"):
                self.abandoned += 1
        if errors:
            raise errors[0]
        self.say(f"kl worker {self.name}: stopped ({self.completed} run(s) succeeded, {self.failed} not)")
        return 1 if cfg.once and self.failed else 0

    def _exit_deadline(self) -> float:
        assert self._stop_at is not None
        return self._stop_at + self.config.grace_s + EXIT_BUDGET_S

    def _until_exit(self, before_stop: _T) -> float | _T:
        """Seconds left until the exit deadline once stop() was called; BEFORE_STOP until then."""
        if self._stop_at is None:
            return before_stop
        return max(0.0, self._exit_deadline() - time.monotonic())

    def _flight_threads(self) -> list[threading.Thread]:
        with self._lock:
            return [f.thread for f in self._inflight.values() if f.thread is not None]

    def _bounded(self, call: Callable[[], object], what: str) -> bool:
        """CALL (a database write) on a thread of its own, waited for until the exit deadline (or
        EXIT_BUDGET_S): False when it failed or did not return in time."""
        failed: list[str] = []

        def attempt() -> None:
            try:
                call()
            except (KlError, psycopg.Error) as exc:
                failed.append(first_line(exc))

        t = threading.Thread(target=attempt, name="kl-exit", daemon=True)
        t.start()
        t.join(max(0.1, self._until_exit(EXIT_BUDGET_S)))
        if t.is_alive() or failed:
            log.warning("%s: %s", what, failed[0] if failed else "the database did not answer")
            return False
        return True

    def _claiming(self, errors: list[BaseException]) -> None:
        try:
            # One FleetSlots for all of this worker's runs: the slots it leases serve whichever run needs them.
            with slots.fleet_slots(self.conn, always=True) as self._slots:
                self._loop()
                self._drain()
        except BaseException as exc:  # noqa: BLE001 - handed to run(), on the main thread
            errors.append(exc)
        finally:
            self._slots = None
            self._stopping.set()

    def _retry_delay(self) -> float:
        """How long to wait before the next look at the queue: the poll interval, or after database
        errors in a row, that doubled per error up to DB_RETRY_MAX_S."""
        poll = self.config.poll_s
        if not self._db_failures:
            return poll
        return max(poll, min(DB_RETRY_MAX_S, poll * 2.0 ** (self._db_failures - 1)))

    def _loop(self) -> None:
        cfg = self.config
        while not self._stopping.is_set():
            claimed = 0
            # --once ends only after a claim made with every slot free found nothing: a run that
            # ended after the claim was skipped (no slot then) must not end the loop with work queued.
            looked_with_all_free = False
            try:
                fleet.enqueue_due_schedules(self.conn, next_run)
                for job_id, what in fleet.recover_expired(self.conn, cfg.max_attempts):
                    self.say(f"kl worker {self.name}: took over job {job_id} of a worker that stopped heartbeating ({what})")
                running = self._running()
                looked_with_all_free = running == 0
                free = cfg.parallel_states - running
                if free > 0:
                    for job in fleet.claim(self.conn, self.worker_id, free, cfg.lease_s):
                        self._start(job)
                        claimed += 1
                fleet.prune(self.conn)
                self.warm.reap()
                self._db_failures = 0
            except psycopg.Error as exc:
                if not db.lost(exc, self.conn):
                    raise
                # The database went away: runs in flight report their own; keep trying, backing off.
                self._db_failures += 1
                log.warning("kl worker: database error: %s", first_line(exc))
                self._reconnect()
            if cfg.once and not claimed and looked_with_all_free and self._running() == 0:
                return
            self._wake.wait(self._retry_delay())
            self._wake.clear()

    def _reconnect(self) -> None:
        try:
            fresh = db.reconnect(self.conn)
        except KlError as exc:
            log.warning("kl worker: %s", exc)
            return  # the next look fails fast on the closed connection and tries again
        self.conn.close()
        self.conn = fresh

    def _running(self) -> int:
        with self._lock:
            for job_id in [j for j, f in self._inflight.items() if f.thread is not None and not f.thread.is_alive()]:
                del self._inflight[job_id]
            return len(self._inflight)

    def _start(self, job: fleet.Job) -> None:
        flight = _InFlight(job)
        flight.thread = threading.Thread(target=self._run_job, args=(flight,), name=f"kl-job-{job.id}", daemon=True)
        with self._lock:
            self._inflight[job.id] = flight
        flight.thread.start()

    def _run_job(self, flight: _InFlight) -> None:
        job = flight.job
        try:
            with db.reconnect(self.conn) as conn:
                try:
                    if flight.job.kind == fleet.DISCOVER:
                        self._discovery_job(conn, flight)
                    else:
                        self._refresh_job(conn, flight)
                except psycopg.Error as exc:
                    # Judged while the connection is open: once closed, any connection looks lost,
                    # and a bug (a psycopg error without SQLSTATE) would pass for a lost database.
                    if db.lost(exc, conn):
                        raise db.ConnectionLost(first_line(exc)) from exc
                    raise
        except KlError as exc:  # no connection, or it broke: the lease runs out and another worker takes the job
            self.failed += 1
            self.say(f"kl worker {self.name}: {job.state}: {first_line(exc)}")
        except Exception as exc:  # noqa: BLE001 - a bug: logged and recorded on the job by _internal_error
            self._internal_error(job, exc)
        finally:
            self._wake.set()

    def _refresh_job(self, conn: psycopg.Connection, flight: _InFlight) -> None:
        job = flight.job
        refresh_runs.mark_fleet_job(conn, job.id)  # begin() links the run and refuses an overlap
        try:
            # No wait: the claimed job is the run a plain kl refresh would wait for.
            result = refresh_or_fail(conn, job.state, self.overrides, state_id=job.state_id, factories=self._warm_factory,
                                     provider_slots=self._slots, wait=False, cancel=flight.cancel)
        except locks.StateLocked as busy:  # another run of the state, or an apply: try again shortly
            fleet.requeue(conn, job.id, self.worker_id, max(self.config.poll_s, 5.0), f"{busy}; retried later")
            self.say(f"kl worker {self.name}: {job.state}: {busy}; queued again")
            return
        if flight.shutdown and result.status == "cancelled":
            _on_live(conn, lambda c: fleet.requeue(c, job.id, self.worker_id, 0.0, f"worker {self.name} stopped during the run"))
            self.say(f"kl worker {self.name}: {job.state}: cancelled at shutdown; queued again")
            return
        kept = _on_live(conn, lambda c: fleet.finish_job(c, job.id, self.worker_id, result.status, result.run_id,
                                                         result.error))
        if result.status == "succeeded":
            self.completed += 1
        else:
            self.failed += 1
        lag = f", {_lag(job.due_at)} after due" if result.status == "succeeded" else ""
        self.say(f"kl worker {self.name}: {job.state}: {result.status}"
                 + (f" v{result.from_serial} → v{result.to_serial}" if result.to_serial is not None
                    else f" observed {result.observation}" if result.observation else "")
                 + f" in {result.duration_s:.2f}s{lag}" + (f": {result.error}" if result.error else "")
                 + ("" if kept else " (the job's lease had been taken over)"))

    def _discovery_job(self, conn: psycopg.Connection, flight: _InFlight) -> None:
        """A scheduled discovery, run as `kl discover` runs it (its run recorded and linked to the
        job as it begins, its provider's fleet-wide slot held while it lists)."""
        from kilolock.store.discovery_runs import Scope
        from kilolock.unmanaged import service

        job = flight.job
        d = job.discovery or {}
        scope = Scope(d["source"], d.get("alias") or "", d.get("state"), d["type"], d.get("list_config") or {})
        req = service.Request(scope, limit=d.get("limit"), actor=self.overrides.default_actor,
                              search_paths=tuple(d.get("search_paths") or ()), fleet_job=job.id, cancel=flight.cancel)
        started = time.monotonic()
        status, error, outcome = "succeeded", None, None
        try:
            outcome = service.discover(conn, req)
        except service.DiscoveryCancelled as exc:
            if flight.shutdown:
                _on_live(conn, lambda c: fleet.requeue(c, job.id, self.worker_id, 0.0, f"worker {self.name} stopped during the run"))
                self.say(f"kl worker {self.name}: {job.state}: cancelled at shutdown; queued again")
                return
            status, error = "cancelled", first_line(exc)
        except KlError as exc:
            status, error = "failed", first_line(exc)
        kept = _on_live(conn, lambda c: fleet.finish_job(c, job.id, self.worker_id, status, None, error))
        if status == "succeeded":
            self.completed += 1
        else:
            self.failed += 1
        found = ""
        if outcome is not None:
            found = (f" {len(outcome.found)} listed, {outcome.count('unmanaged')} unmanaged, "
                     f"{outcome.count('managed twice')} managed twice")
        self.say(f"kl worker {self.name}: {job.state}: {status}{found} in {time.monotonic() - started:.2f}s"
                 + (f": {error}" if error else "") + ("" if kept else " (the job's lease had been taken over)"))

    def _warm_factory(self, conn: psycopg.Connection, state_id: str, options: RefreshOptions) -> ProviderFactory:
        return self.warm.factory(conn, state_id, options.search_paths, rpc_timeout=options.rpc_timeout,
                                 workdir=options.workdir)

    def _internal_error(self, job: fleet.Job, exc: Exception) -> None:
        """A bug: the run's audit row is finished; record it on the job, keep working."""
        log.exception("kl worker: refreshing %s", job.state, exc_info=exc)
        self.failed += 1
        self._record_internal_error(job, f"internal error: {type(exc).__name__}: {exc}")

    def _record_internal_error(self, job: fleet.Job, message: str) -> None:
        try:
            with db.reconnected(self.conn) as conn:
                fleet.finish_job(conn, job.id, self.worker_id, "failed", None, message)
        except KlError:  # no new connection, or it broke too
            pass  # the lease runs out; another worker takes the job over
        self.say(f"kl worker {self.name}: {job.state}: {message}")

    def _heartbeats(self) -> None:
        """Renew the leases well inside their length, on a connection of its own; a run whose lease
        was taken over (this worker was cut off longer than the lease) is cancelled."""
        conn: psycopg.Connection | None = None
        while True:
            stopping = self._stopping.is_set()
            with self._lock:
                flights = dict(self._inflight)
            try:
                if conn is None or conn.closed:
                    conn = db.reconnect(self.conn)
                kept = fleet.heartbeat(conn, self.worker_id, self.config.lease_s, list(flights),
                                       "draining" if stopping else "running")
                for job_id, flight in flights.items():
                    if job_id not in kept and flight.thread is not None and flight.thread.is_alive():
                        flight.cancel.cancel(f"worker {self.name} lost the lease of job {job_id}")
            except (KlError, psycopg.Error) as exc:  # whatever it was, this thread must go on beating
                log.warning("kl worker: heartbeat failed: %s", first_line(exc))
                if conn is not None:
                    conn.close()
                conn = None
            if stopping and not flights:
                break
            if stopping:  # draining: beat on until the last run ends, then record the stop promptly
                time.sleep(min(0.2, self.config.heartbeat_s))
            else:
                self._stopping.wait(self.config.heartbeat_s)
        if conn is not None:
            conn.close()

    def _drain(self) -> None:
        """Let runs in flight finish; after the grace period cancel them (their jobs go back to the
        queue, due now, for another worker). The grace period counts from stop()."""
        deadline = (self._stop_at or time.monotonic()) + self.config.grace_s
        while self._running():
            if time.monotonic() >= deadline:
                with self._lock:
                    flights = list(self._inflight.values())
                for f in flights:
                    f.shutdown = True
                    f.cancel.cancel(f"worker {self.name} stopping (grace period of {self.config.grace_s:g}s over)")
                # A cancelled run still records its end; on a hung database it cannot, and run()
                # stops waiting for it at the exit deadline.
                for f in flights:
                    if f.thread is not None:
                        f.thread.join(self._until_exit(None))
                # Forget the runs that ended: the heartbeat thread beats "draining" for as long as
                # it sees one, and the stop run() records after it must be the last word.
                self._running()
                return
            time.sleep(0.05)


def _on_live(conn: psycopg.Connection, write: Callable[[psycopg.Connection], _T]) -> _T:
    """WRITE (one transaction on a job's row, conditioned on its lease) on CONN, or on a new
    connection when CONN was lost: a run goes on on a new connection after a failover during its
    reads, and its job's outcome must follow it there rather than wait for the lease to run out
    (and the job to be run again). The new one waits for a primary (db.reconnected)."""
    if not conn.closed:
        try:
            return write(conn)
        except psycopg.Error as exc:
            if not db.lost(exc, conn):
                raise
    with db.reconnected(conn) as fresh:
        return write(fresh)


def _lag(due: datetime) -> str:
    from datetime import timezone

    return f"{(datetime.now(timezone.utc) - due).total_seconds():.1f}s"
