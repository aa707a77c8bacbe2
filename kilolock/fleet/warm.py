"""Warm providers inside a worker: a provider process reused across the states it refreshes.

``kl refresh`` launches, handshakes, fetches the schema and configures every provider once per run
(one factory per run, so that no provider state is shared between runs). A worker refreshing hundreds of small
states would pay that for each of them, so it keeps a ``WarmProviders`` pool instead: a process is
reused by a later run when it is the same binary (path and mtime), the same resolved config and
the same workdir and rpc timeout. One run holds a process at a time; when the run's provider group
ends (the orchestrator's ``close``) it goes back to the pool instead of being shut down. The run's
factory is the refresh factory itself: the pool is its source of processes (``WarmSource``), and
the client a run holds is the codec's, wrapped (``_WarmClient``).

Never reused: a process that crashed (no longer alive), hung or failed at the transport level
(ProviderCallError, which a deadline also raises), broke the protocol (an answer that does not
decode), was sent StopProvider (a cancelled run: providers do not come back from Stop), or whose
run raised anything kl did not expect. An error diagnostic or a throttled answer is the provider
working as it should: the process stays warm.

Secrets stay per run: a process logs through a ``RunRedactor`` that masks what its own config holds
(learnt at launch) plus the current run's secrets, swapped at every checkout; a run's redactor
learns the config's secrets again on reuse, and never what another run learnt.

The pool keeps at most ``max_idle`` idle processes (the oldest idle goes first) and closes any idle
for longer than ``idle_s`` (``reap``, called from the worker's loop).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from kilolock.provider.errors import ProviderDiagnosticsError, ProviderError
from kilolock.redact import Redactor
from kilolock.refresh.client import AsyncReader, OpenedProvider, ReadOutcome, ResourceClient, ResourceError
from kilolock.refresh.encoding import EncodingClient, MalformedAnswer
from kilolock.refresh.factory import ProviderFactory
from kilolock.refresh.sources import Lease, Wanted, launch, resolve_env_refs
from kilolock.schema import AttributePath, ProviderSchema, Schema

if TYPE_CHECKING:
    from kilolock.provider import ProviderClient

log = logging.getLogger("kilolock.fleet.warm")

MAX_IDLE = 4  # warm processes a worker keeps idle (a cloud provider's process is 100-300 MB)
IDLE_S = 300.0


class RunRedactor(Redactor):
    """What a warm process's log lines and errors pass through: its own config secrets, then the
    secrets of the run holding it now (none while idle)."""

    def __init__(self) -> None:
        super().__init__()
        self.run: Redactor | None = None

    def __bool__(self) -> bool:
        run = self.run
        return super().__bool__() or bool(run)

    def redact(self, text: str) -> str:
        text = super().redact(text)
        run = self.run
        return run.redact(text) if run is not None else text


@dataclass
class _Process:
    """A provider process a fleet worker keeps open between runs."""

    key: tuple[str, ...]
    raw: ProviderClient
    schema: ProviderSchema
    version: str
    binary: str
    redactor: RunRedactor
    broken: bool = False
    idle_since: float = 0.0
    uses: int = 0

    def alive(self) -> bool:
        conn = getattr(self.raw, "connection", None)
        process = getattr(conn, "process", None)
        return bool(process.alive()) if process is not None else True


class WarmProviders:
    """A worker's pool of configured provider processes. Thread-safe."""

    def __init__(self, max_idle: int = MAX_IDLE, idle_s: float = IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_idle = max_idle
        self.idle_s = idle_s
        self._clock = clock
        self._idle: list[_Process] = []
        self._lock = threading.Lock()
        self._closed = False
        self.launched = 0
        self.reused = 0
        self.dropped = 0  # processes never reused because they broke

    def factory(self, conn: psycopg.Connection, state_id: str | None, search_paths: tuple[str, ...] = (),
                rpc_timeout: float | None = None, workdir: str | None = None) -> ProviderFactory:
        """The factory of one run of a worker: it opens from this pool and launches only what it lacks."""
        return ProviderFactory(conn, state_id, search_paths, rpc_timeout=rpc_timeout, workdir=workdir,
                               source=WarmSource(self))

    def checkout(self, key: tuple[str, ...]) -> _Process | None:
        dead: list[_Process] = []
        found = None
        with self._lock:
            for p in reversed(self._idle):  # the most recently used: the least likely to have timed out anywhere
                if p.key == key:
                    self._idle.remove(p)
                    if p.alive():
                        found = p
                        break
                    dead.append(p)
        for p in dead:
            log.info("warm provider %s exited while idle; launching another", p.binary)
            self._close(p)
        if found is not None:
            self.reused += 1
            found.uses += 1
        return found

    def checkin(self, p: _Process) -> None:
        p.redactor.run = None
        if p.broken or not p.alive():
            self.dropped += 1
            self._close(p)
            return
        evicted: list[_Process] = []
        with self._lock:
            if self._closed or self.max_idle <= 0:
                evicted.append(p)
            else:
                p.idle_since = self._clock()
                self._idle.append(p)
                while len(self._idle) > self.max_idle:
                    evicted.append(self._idle.pop(0))
        for e in evicted:
            self._close(e)

    def reap(self) -> int:
        """Close the processes idle for longer than idle_s; returns how many."""
        now = self._clock()
        with self._lock:
            old = [p for p in self._idle if now - p.idle_since >= self.idle_s]
            self._idle = [p for p in self._idle if p not in old]
        for p in old:
            self._close(p)
        return len(old)

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for p in idle:
            self._close(p)

    @staticmethod
    def _close(p: _Process) -> None:
        try:
            p.raw.close()
        except Exception as exc:  # noqa: BLE001 - best effort: close() kills what does not shut down
            log.debug("closing a warm provider: %s", exc)


def _config_key(binary: str, workdir: str | None, rpc_timeout: float | None, config: dict[str, Any]) -> tuple[str, ...]:
    try:
        mtime = str(os.stat(binary).st_mtime_ns)  # a binary replaced in place is another provider
    except OSError:
        mtime = "?"
    # The resolved config may hold secrets: only its digest is kept in the key.
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return (binary, mtime, workdir or "", repr(rpc_timeout), digest)


class WarmSource:
    """The pool as the factory's source of processes: a warm one configured with this very config
    when it has one, else a new launch, which joins the pool when the run is done with it."""

    def __init__(self, pool: WarmProviders) -> None:
        self.pool = pool

    def lease(self, want: Wanted) -> Lease:
        found = want.found
        key = _config_key(found.binary, want.workdir, want.rpc_timeout, want.config())
        warm = self.pool.checkout(key)
        if warm is not None:
            log.info("provider %s: reusing a warm %s (use %d)", want.source, found.describe(), warm.uses + 1)
            warm.redactor.run = want.secrets
            return _WarmLease(self.pool, warm.raw, key, warm.redactor, warm)
        log.info("provider %s: using %s (launching a warm process)", want.source, found.describe())
        own = RunRedactor()
        own.run = want.secrets
        resolve_env_refs(want.stored_config, own, want.where)  # the process's own: masked while idle too
        return _WarmLease(self.pool, launch(want, own), key, own)


class _WarmLease:
    """A process from the pool (configured already), or launched to join it."""

    def __init__(self, pool: WarmProviders, raw: ProviderClient, key: tuple[str, ...], redactor: RunRedactor,
                 reused: _Process | None = None) -> None:
        self._pool, self._key, self._redactor, self._reused = pool, key, redactor, reused
        self.raw = raw
        self.schema = reused.schema if reused is not None else None
        self.keepers: tuple[Redactor, ...] = (redactor,) if reused is None else ()

    def wrap(self, client: EncodingClient, schema: ProviderSchema) -> ResourceClient:
        warm = self._reused
        if warm is None:
            self._pool.launched += 1
            warm = _Process(self._key, self.raw, schema, client.info.version, client.info.binary, self._redactor, uses=1)
        return _WarmClient(client, warm, self._pool)


class _WarmClient:
    """The client of a pooled process for one run: the EncodingClient's calls, with anything that
    says the process is no longer sound marking it broken first; ``close`` hands it back."""

    def __init__(self, client: EncodingClient, warm: _Process, pool: WarmProviders) -> None:
        self._client = client
        self._warm = warm
        self._pool = pool
        self._returned = False
        self.info: OpenedProvider = client.info

    def _guard(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except BaseException as exc:
            self.judge_failure(exc)
            raise

    def judge_failure(self, exc: BaseException) -> None:
        """Mark the process broken unless ``exc`` is the provider working (a diagnostic)."""
        if isinstance(exc, MalformedAnswer):
            self._warm.broken = True  # an answer that does not decode: the protocol is broken
        elif isinstance(exc, ResourceError):
            # EncodingClient raises ResourceError from the provider's error: a diagnostic is the
            # provider working; any other provider error is a transport failure, a deadline or a
            # malformed answer.
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ProviderError) and not isinstance(cause, ProviderDiagnosticsError):
                self._warm.broken = True
        else:  # KlError, or anything else: the process is not known to be sound
            self._warm.broken = True

    def resource_schema(self, type_name: str) -> Schema:
        return self._client.resource_schema(type_name)

    def canonicalize(self, type_name: str, attributes: bytes) -> bytes | None:
        return self._client.canonicalize(type_name, attributes)

    def identity_schema_version(self, type_name: str) -> int | None:
        return self._client.identity_schema_version(type_name)

    def upgrade_resource_identity(self, type_name: str, version: int, raw_identity: bytes) -> bytes:
        return self._client.upgrade_resource_identity(type_name, version, raw_identity)

    def sensitive_paths(self, type_name: str, value: bytes) -> list[AttributePath]:
        return self._client.sensitive_paths(type_name, value)

    def async_reader(self) -> AsyncReader | None:
        reader = self._client.async_reader()
        return _GuardedAsyncReader(reader, self) if reader is not None else None

    def upgrade_resource_state(self, type_name: str, version: int, raw_attributes: bytes) -> bytes:
        result: bytes = self._guard(lambda: self._client.upgrade_resource_state(type_name, version, raw_attributes))
        return result

    def upgrade_flatmap(self, type_name: str, version: int, flatmap: dict[str, str]) -> bytes:
        result: bytes = self._guard(lambda: self._client.upgrade_flatmap(type_name, version, flatmap))
        return result

    def read_resource(self, type_name: str, prior: bytes, private: bytes, identity: bytes | None) -> ReadOutcome:
        result: ReadOutcome = self._guard(lambda: self._client.read_resource(type_name, prior, private, identity))
        return result

    def stop(self) -> None:
        self._warm.broken = True  # providers do not come back from StopProvider
        self._client.stop()

    def shut_down(self, *, at_once: bool = False) -> None:
        self._warm.broken = True  # close() then hands back a process the pool only closes
        self._client.shut_down(at_once=at_once)

    def close(self) -> None:
        if self._returned:
            return
        self._returned = True
        self._pool.checkin(self._warm)


class _GuardedAsyncReader:
    """The async read path of a _WarmClient: failures judged as its blocking reads are."""

    def __init__(self, reader: AsyncReader, client: _WarmClient) -> None:
        self._reader = reader
        self._client = client
        self.transport = reader.transport

    async def read_resource(self, type_name: str, prior: bytes, private: bytes, identity: bytes | None) -> ReadOutcome:
        try:
            return await self._reader.read_resource(type_name, prior, private, identity)
        except BaseException as exc:
            self._client.judge_failure(exc)
            raise

    async def aclose(self) -> None:
        await self._reader.aclose()
