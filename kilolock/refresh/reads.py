"""A run's reads, per provider group: from reader threads or one event loop, with requests in
flight adapted per provider, retries of throttled reads, and StopProvider / shutdown when the run is
cancelled."""
from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kilolock import tfstate
from kilolock.errors import KlError, env_choice
from kilolock.redact import Redactor
from kilolock.refresh import inflight
from kilolock.refresh.client import AsyncReader, ClientFactory, ResourceClient, ThrottledError
from kilolock.refresh.options import RefreshOptions
from kilolock.refresh.result import Failure as Failure  # noqa: PLC0414 - run() returns them: its callers know them from here
from kilolock.refresh.result import Result as Result  # noqa: PLC0414

log = logging.getLogger("kilolock.refresh")

from kilolock.refresh.cancel import Cancellation
from kilolock.refresh.instance import Entry, refresh_instance, refresh_instance_async

GroupKey = tuple[str, str]  # (provider source, alias)

# How a group's reads are made. From one asyncio event loop through the native HTTP/2 client, a read
# costs about a third of the CPU it costs from reader threads on grpc's blocking API (benches/
# test_refresh_per_instance.py), and the loop shares the connection the threads would use, so it
# costs only its own start: on the quiet machine, with null 2.1.2's AutoMTLS, a dry-run refresh took
# 11.0 ms from threads against 11.2 ms from the loop at 1 instance, 12.2 against 12.7 at 3, 15.8
# against 14.4 at 10 (process CPU 9.4 against 6.9 ms) and 26.8 against 20.1 at 30 (medians of 15).
# Through grpcio the loop needs a grpc.aio channel of its own, which pays for itself only from
# ~500 reads. Below ASYNC_MIN_INSTANCES[transport] the threads finish first. Reads
# limited by a fleet-wide provider limit (kl provider limit) stay on threads too: those may wait for
# the fleet's slots, which the loop must never do. KL_READ_PATH=threads|async forces one way (the
# tests run both).
ASYNC_MIN_INSTANCES = {"native": 5, "grpcio": 500}
READ_PATHS = ("auto", "async", "threads")


def read_path() -> str:
    return env_choice("KL_READ_PATH", READ_PATHS)


def _async_reads(instances: int, transport: str) -> bool:
    path = read_path()
    return path == "async" or (path == "auto" and instances >= ASYNC_MIN_INSTANCES.get(transport, 500))
ProgressFn = Callable[[str, int, int], None]  # (group label, done, total)


def group_instances(state: tfstate.State) -> dict[GroupKey, list[tfstate.Instance]]:
    """Managed instances (current and deposed) by provider configuration; data sources are skipped."""
    groups: dict[GroupKey, list[tfstate.Instance]] = defaultdict(list)
    keys: dict[str, GroupKey] = {}  # a state names few providers: parse each address once, not per instance
    for inst in state.managed():
        key = keys.get(inst.provider)
        if key is None:
            ref = tfstate.parse_provider(inst.provider)
            key = keys[inst.provider] = (ref.source, ref.alias)
        groups[key].append(inst)
    return dict(sorted(groups.items()))



class GroupReads:
    """State shared by the threads of one run."""

    def __init__(self, factory: ClientFactory, options: RefreshOptions, progress: ProgressFn | None, cancel: Cancellation,
                 secrets: Redactor) -> None:
        self.factory = factory
        self.secrets = secrets
        self.options = options
        self.progress = progress
        self.cancel = cancel
        self.clients: list[ResourceClient] = []
        self.shut: dict[int, bool] = {}  # id(client) of those shut down: whether at once
        self.group_failures: list[Failure] = []
        self.concurrency: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.backoff = inflight.Backoff()

    def record_failure(self, entry: Entry, message: str) -> None:
        # Failure messages are printed, stored in refresh_runs and quoted in cancel reasons;
        # providers' diagnostics and stderr may quote secret values in them.
        message = self.secrets.redact(message)
        entry.error = message
        if self.options.fail_fast:
            self.cancel.cancel(f"fail-fast: {entry.inst.address}: {message}")

    def read_with_retries(self, client: ResourceClient, entry: Entry, gate: inflight.Gate, rng: random.Random) -> None:
        """Refresh one instance through the gate. An answer that says the API throttled the call
        is retried after a pause (Backoff) until the instance has used up --rpc-timeout, counted from
        its first call (time spent waiting for a slot before it is not the provider's)."""
        started: float | None = None
        attempt = 0
        while True:
            epoch = gate.acquire(lambda: self.cancel.cancelled)
            if epoch is None:
                return  # cancelled while waiting for a slot: never sent
            entry.read = True
            sent = time.monotonic()
            started = sent if started is None else started
            error: Exception | None = None
            try:
                entry.update = refresh_instance(client, entry.inst, self.options, self.secrets, entry.prior_json)
            except Exception as exc:  # noqa: BLE001 - _settle fails the instance: a bug must never drop it
                error = exc
            attempt += isinstance(error, ThrottledError)
            pause = self._settle(entry, gate, epoch, error, sent, started, attempt, rng)
            if pause is None or self.cancel.wait(pause):
                return

    async def read_with_retries_async(self, client: ResourceClient, reader: AsyncReader, entry: Entry,
                                      gate: inflight.Gate, rng: random.Random) -> None:
        """read_with_retries from the event loop (the same rules, the read through ``reader``)."""
        started: float | None = None
        attempt = 0
        while True:
            epoch = gate.try_acquire()
            while epoch is None:  # only a retry, after a throttled answer cut the limit, waits here
                if self.cancel.cancelled:
                    return
                await asyncio.sleep(inflight.Gate.POLL)
                epoch = gate.try_acquire()
            entry.read = True
            sent = time.monotonic()
            started = sent if started is None else started
            error: Exception | None = None
            try:
                entry.update = await refresh_instance_async(client, reader, entry.inst, self.options, self.secrets, entry.prior_json)
            except Exception as exc:  # noqa: BLE001 - _settle fails the instance: a bug must never drop it
                error = exc
            attempt += isinstance(error, ThrottledError)
            pause = self._settle(entry, gate, epoch, error, sent, started, attempt, rng)
            if pause is None or await self._cancelled_within(pause):
                return

    def _settle(self, entry: Entry, gate: inflight.Gate, epoch: int, error: Exception | None, sent: float,
                started: float, attempt: int, rng: random.Random) -> float | None:
        """Give the call's slot back with what its answer says; the pause before the next try of a
        throttled instance, or None when the instance is done (read, or failed and recorded)."""
        if error is None:
            gate.release(epoch, latency=time.monotonic() - sent)
            return None
        if isinstance(error, ThrottledError):
            gate.release(epoch, throttled=True)
            pause = self.backoff.delay(attempt, rng)
            if time.monotonic() + pause - started < self.options.rpc_timeout:
                return pause
            if not self.cancel.cancelled:
                self.record_failure(entry, f"{error} (throttled {attempt} time(s); gave up after "
                                           f"{time.monotonic() - started:.0f}s, the --rpc-timeout per instance)")
            return None
        gate.release(epoch)
        if isinstance(error, KlError):
            if not self.cancel.cancelled:
                self.record_failure(entry, str(error))
        else:  # a bug must still fail this instance, never drop it
            log.error("refreshing %s", entry.inst.address, exc_info=error)
            self.record_failure(entry, f"internal error: {type(error).__name__}: {error}")
        return None

    async def _cancelled_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self.cancel.cancelled:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(left, inflight.Gate.POLL))
        return True

    def run_group(self, key: GroupKey, entries: list[Entry], opened: list[str]) -> None:
        source, alias = key
        label = source + (f".{alias}" if alias else "")
        if self.cancel.cancelled:
            return
        try:
            client = self.factory.open(source, alias, self.secrets)
        except KlError as exc:
            message = self.secrets.redact(f"provider {label}: {exc}")
            for e in entries:
                e.error = message  # failed, but not read: not checked, and reported once below
            with self.lock:
                self.group_failures.append(Failure(None, message, provider=label,
                                                   addresses=sorted(e.inst.address for e in entries)))
            if self.options.fail_fast:
                self.cancel.cancel(f"fail-fast: {message}")
            return
        with self.lock:
            self.clients.append(client)
            opened.append(f"{client.info.source} {client.info.version} (protocol {client.info.protocol_version}, {client.info.binary})")
        # The provider never sees more calls than the gate's limit, fixed or adaptive (inflight).
        fleet = self.options.provider_slots.for_provider(source, alias) if self.options.provider_slots else None
        cap = self.options.provider_caps.get(source)
        if fleet is not None:  # no one run needs more threads than the whole fleet may send
            cap = min(cap, fleet.limit) if cap else fleet.limit
        gate = inflight.Gate(inflight.controller_for(self.options.provider_parallelism, cap), label, fleet)
        rng = random.Random()
        reads, transport = "threads", client.info.transport
        try:
            async_transport = None
            if fleet is None and _async_reads(len(entries), client.info.transport):
                async_transport = self._read_group_async(client, label, entries, gate, rng)
            if async_transport is not None:
                reads, transport = "async", async_transport
            else:
                self._read_group_threads(client, label, entries, gate, rng)
        finally:
            with self.lock:
                self.clients.remove(client)
                self.shut.pop(id(client), None)
                self.concurrency.append({"provider": source, "alias": alias or None, **gate.report(), "reads": reads,
                                         "transport": transport})
            client.close()

    def _read_group_threads(self, client: ResourceClient, label: str, entries: list[Entry], gate: inflight.Gate,
                            rng: random.Random) -> None:
        """Every instance of the group, read by a thread per slot."""
        total = len(entries)
        pending = iter(entries)
        counter = {"done": 0}
        lock = threading.Lock()
        threads: list[threading.Thread] = []
        live = [0]  # workers started and not yet retired (threads holds every one ever started, to join)
        prefix = f"kl-read-{client.info.source.rsplit('/', 1)[-1]}"

        def add_workers() -> None:
            # A thread per slot, started when the limit reaches it (auto grows from 10).
            with lock:
                while live[0] < min(gate.limit, total - counter["done"]):
                    t = threading.Thread(target=worker, name=f"{prefix}-{len(threads)}", daemon=True)
                    threads.append(t)
                    live[0] += 1
                    t.start()

        def worker() -> None:
            # Workers pull the next instance until none is left: cheaper per instance than a Future each.
            while not self.cancel.cancelled:
                with lock:
                    # More workers than the limit allows in flight (auto shrank, or levelled off
                    # below where a probe took it): this one retires. Kept, the extra threads would
                    # queue at the gate and every answer would hand the slot to another thread,
                    # a wake-up and a context switch per read that a fixed limit never pays.
                    if live[0] > gate.limit:
                        live[0] -= 1
                        return
                    entry = next(pending, None)
                    if entry is None:
                        live[0] -= 1
                        return
                self.read_with_retries(client, entry, gate, rng)
                with lock:
                    counter["done"] += 1
                    done = counter["done"]
                if self.progress:
                    self.progress(label, done, total)
                if live[0] < gate.limit:
                    add_workers()
            with lock:
                live[0] -= 1

        add_workers()
        joined = 0
        while True:  # workers may add workers: join until every started one is done
            with lock:
                if joined == len(threads):
                    break
                t = threads[joined]
            t.join()
            joined += 1

    def _read_group_async(self, client: ResourceClient, label: str, entries: list[Entry], gate: inflight.Gate,
                          rng: random.Random) -> str | None:
        """Every instance of the group, read from one event loop in this thread; the transport
        that carried the reads, or None (nothing read) when the client has no async reads."""
        return asyncio.run(self._read_all(client, label, entries, gate, rng))

    async def _read_all(self, client: ResourceClient, label: str, entries: list[Entry], gate: inflight.Gate,
                        rng: random.Random) -> str | None:
        reader = client.async_reader()
        if reader is None:
            return None
        total = len(entries)
        pending = iter(entries)
        done = live = 0
        tasks: list[asyncio.Task[None]] = []

        async def worker() -> None:
            # As the threads do: a worker per slot pulls the next instance until none is left, and
            # retires when the limit dropped below the workers.
            nonlocal done, live
            try:
                while not self.cancel.cancelled and live <= gate.limit:
                    entry = next(pending, None)
                    if entry is None:
                        return
                    await self.read_with_retries_async(client, reader, entry, gate, rng)
                    done += 1
                    if self.progress:
                        self.progress(label, done, total)
                    add_workers()
            finally:
                live -= 1

        def add_workers() -> None:
            nonlocal live
            while live < min(gate.limit, total - done):
                live += 1
                tasks.append(asyncio.create_task(worker()))

        try:
            add_workers()
            waited = 0
            while waited < len(tasks):  # workers add workers: wait until every started one is done
                await tasks[waited]
                waited += 1
        finally:
            for t in tasks:
                t.cancel()
            await reader.aclose()
        return reader.transport

    def stop_all(self, deadline: float) -> None:
        """StopProvider to every open client, each from a thread of its own, waited for until they
        answered, DEADLINE (the end of the grace) or a cancel at once: a provider slow to answer
        Stop must neither delay the others' nor hold the run past its grace."""
        with self.lock:
            clients = list(self.clients)
        threads = [threading.Thread(target=self._stop, args=(c,), name="kl-stop", daemon=True) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive() and not self.cancel.at_once and (left := deadline - time.monotonic()) > 0:
                t.join(min(left, 0.05))

    @staticmethod
    def _stop(client: ResourceClient) -> None:
        try:
            client.stop()
        except Exception as exc:  # noqa: BLE001 - best effort: the process is shut down after the grace anyway
            log.debug("StopProvider failed: %s", exc)

    def shut_down_all(self, *, at_once: bool) -> None:
        """Shut down the providers of the groups still running once Stop's grace is over (AT_ONCE:
        SIGKILL without waiting for Shutdown): their calls in flight fail and the groups end.
        Called at every poll from then on, so a client opened meanwhile is shut down too; each
        client once (once more when AT_ONCE comes after a Shutdown began)."""
        with self.lock:
            clients = [c for c in self.clients if self.shut.get(id(c)) not in (True, at_once)]
            for c in clients:
                self.shut[id(c)] = at_once
        for c in clients:
            threading.Thread(target=self._shut_down, args=(c, at_once), name="kl-shut-down", daemon=True).start()

    @staticmethod
    def _shut_down(client: ResourceClient, at_once: bool) -> None:
        log.info("provider %s: still busy after StopProvider; shutting it down", client.info.source)
        try:
            client.shut_down(at_once=at_once)
        except Exception as exc:  # noqa: BLE001 - best effort: close() and the process registry kill it too
            log.debug("shutting down a provider: %s", exc)


