"""The refresh orchestrator: what to refresh, in what order, and whether to commit.

run() loads the state's current version, groups managed instances by (provider source, alias),
opens one client per group through the factory, reads every instance, and commits a new version
with source='refresh' only when commit_decision() says so (kilolock.refresh.commit writes it). The
refresh_runs row is begun before any work and finished on every path.

Each run has its own secrets (a kilolock.redact.Redactor): what it learns is secret is masked in
its providers' logs and in its failure messages, and never in another run's.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import dataclasses
import json
import logging
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from kilolock import drift as attribute_drift
from kilolock import tfstate
from kilolock.durations import parse_duration
from kilolock.errors import KlError, env_choice
from kilolock.provider import transport
from kilolock.redact import Redactor
from kilolock.refresh import inflight, whyfailed
from kilolock.refresh.client import AsyncReader, ClientFactory, ReadOutcome, ResourceClient, ResourceError, ThrottledError
from kilolock.refresh.commit import commit_refresh, finish_audit, record_observation
from kilolock.refresh.lockwait import LockWaitCancelled, LockWaitFn, wait_for_lock
from kilolock.refresh.options import RefreshOptions
from kilolock.refresh.result import Failure as Failure  # noqa: PLC0414 - run() returns them: its callers know them from here
from kilolock.refresh.result import Result as Result  # noqa: PLC0414
from kilolock.refresh.splice import InstanceUpdate, build_refreshed_state
from kilolock.schema import AttributePath, path_to_state_json
from kilolock.sensitive import marked_paths, values_at
from kilolock.store import db, drift_records, history, ignore_rules, locks, refresh_runs, states, versions
from kilolock.store.db import first_line

if TYPE_CHECKING:
    from kilolock.encryption import Keys

log = logging.getLogger("kilolock.refresh")

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


# After StopProvider, how long calls in flight get to end on their own before their providers are
# shut down (go-plugin's Shutdown, then SIGKILL), which fails the calls still waiting. Stop cannot
# reach every call (a provider blocked reading a FIFO, an API client that ignores its context),
# and such a call must not hold a cancelled run until --rpc-timeout. KL_STOP_GRACE overrides it:
# the tests' way to show that a second signal does not wait for it.
STOP_GRACE_S = 3.0


def stop_grace() -> float:
    text = os.environ.get("KL_STOP_GRACE", "").strip()
    if not text:
        return STOP_GRACE_S
    try:
        return parse_duration(text, allow_zero=True)
    except KlError as exc:
        raise KlError(f"KL_STOP_GRACE: {exc}") from None


class Cancellation:
    """One reason to stop, set once by whoever notices first (signal, timeout, fail-fast).
    ``at_once``: the providers are killed without waiting out the grace (a second Ctrl-C)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None
        self.at_once = False
        self._lock = threading.Lock()

    def cancel(self, reason: str, *, at_once: bool = False) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            self.at_once = self.at_once or at_once
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


@dataclass
class _Entry:
    """One instance of the state through a run: what was stored, what the read made of it."""

    inst: tfstate.Instance
    prior_json: bytes | None = None  # the stored attributes as JSON, when the store has them
    update: InstanceUpdate | None = None
    error: str | None = None
    read: bool = False  # its provider was started and asked: it counts as checked


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


def commit_decision(result: Result, options: RefreshOptions, mass_removal: str | None, cancelled: bool,
                    unplaced_removal: str | None = None) -> tuple[bool, str | None]:
    """The commit policy, in one place. Returns (commit, why not)."""
    if cancelled:
        return False, "cancelled"
    if result.failed:
        return False, whyfailed.failed_resources(result, options)
    if mass_removal and not options.allow_mass_removal:
        return False, mass_removal + "; nothing committed (use --allow-mass-removal if this is real)"
    if unplaced_removal:
        return False, unplaced_removal
    if options.dry_run:
        return False, None
    # Zero failures: commit, also when nothing changed: the versions then show when a refresh confirmed the state.
    return True, None


def _mass_removal(groups: dict[GroupKey, list[_Entry]], options: RefreshOptions) -> str | None:
    for (source, alias), entries in groups.items():
        gone = sum(1 for e in entries if e.update is not None and e.update.removed)
        if gone >= options.mass_removal_min and gone > options.mass_removal_share * len(entries):
            label = source + (f" (alias {alias})" if alias else "")
            return (f"{gone} of {len(entries)} instances of {label} came back deleted, more than "
                    f"{options.mass_removal_share:.0%}: this looks like bad credentials or the wrong account")
    return None


def _unplaced_removal(name: str, entries: list[_Entry], options: RefreshOptions) -> str | None:
    """Deletions found with no workdir set: providers ran in kl's own directory, which nobody said
    is the Terraform configuration's, and a relative path read from the wrong one looks gone (even
    a single one, which the mass-removal guard lets through). Such a run commits nothing."""
    if options.workdir is not None:
        return None
    gone = sorted(e.inst.address for e in entries if e.update is not None and e.update.removed)
    if not gone:
        return None
    return (f"{len(gone)} instance(s) came back deleted (first: {gone[0]}) and state {name!r} has no workdir, so "
            f"providers ran in {os.getcwd()}, where relative paths may not resolve; nothing committed: "
            f"set one with `kl state set {name} --workdir DIR` (or give --workdir DIR for this run)")


def _check_workdir(name: str, options: RefreshOptions) -> None:
    if options.workdir is not None and not os.path.isdir(options.workdir):
        raise KlError(f"workdir {options.workdir} of state {name!r} does not exist on this host; nothing was refreshed "
                      f"(`kl state set {name} --workdir DIR` changes it, --workdir DIR overrides it for one run)")


@dataclass(slots=True)
class _Prior:
    """An instance's prior object, as far as kl gets it without calling the provider."""

    recorded: int  # the schema version in the state
    live: int  # the provider's
    marks: list[AttributePath]
    raw_prior: bytes  # the stored JSON; a flatmap object's first JSON form once upgraded
    canonical_prior: bytes | None  # None: does not fit the live schema (or a flatmap object, until upgraded)
    upgrade: bool  # UpgradeResourceState must give the prior first


def _prior_of(client: ResourceClient, inst: tfstate.Instance, options: RefreshOptions, secrets: Redactor,
              prior_json: bytes | None) -> _Prior:
    schema = client.resource_schema(inst.type)
    recorded, live = inst.schema_version, schema.version
    if recorded > live:
        raise ResourceError(
            f"resource instance managed by a newer provider version (state has schema version {recorded}, "
            f"{client.info.source} {client.info.version} has {live})"
        )
    marks_json = inst.obj.get("sensitive_attributes")
    marks = marked_paths(marks_json) if marks_json else []  # nearly always none: skip the call
    flatmap = inst.flatmap
    if flatmap is not None:
        # The pre-0.12 form: only the provider can turn it into an object, as Terraform has it do.
        # Before it sees them, mask the values under the schema's sensitive top-level attributes.
        sensitive_names = {a.name for a in schema.block.attributes if a.sensitive}
        for key, value in flatmap.items():
            if key.split(".", 1)[0] in sensitive_names:
                secrets.add(value)
        return _Prior(recorded, live, marks, b"", None, upgrade=True)
    raw_prior = prior_json if prior_json is not None else tfstate.dumps_compact(inst.obj.get("attributes", {})).encode()
    _remember_secrets(client, inst.type, raw_prior, marks, secrets)
    canonical_prior = client.canonicalize(inst.type, raw_prior)
    # Upgrade gate: Terraform calls UpgradeResourceState before every read; kl does it when the
    # schema version moved or the stored JSON does not fit the live schema (or when asked to).
    upgrade = options.always_upgrade or live > recorded or canonical_prior is None
    return _Prior(recorded, live, marks, raw_prior, canonical_prior, upgrade)


def _upgraded(client: ResourceClient, inst: tfstate.Instance, p: _Prior, secrets: Redactor) -> bytes:
    """UpgradeResourceState: the prior object as the live schema has it (canonical JSON)."""
    if inst.flatmap is None:
        return client.upgrade_resource_state(inst.type, p.recorded, p.raw_prior)
    p.raw_prior = p.canonical_prior = client.upgrade_flatmap(inst.type, p.recorded, inst.flatmap)
    _remember_secrets(client, inst.type, p.raw_prior, p.marks, secrets)
    return p.raw_prior


def _refresh_one(client: ResourceClient, inst: tfstate.Instance, options: RefreshOptions, secrets: Redactor,
                 prior_json: bytes | None = None) -> InstanceUpdate:
    p = _prior_of(client, inst, options, secrets, prior_json)
    prior = _upgraded(client, inst, p, secrets) if p.upgrade else p.canonical_prior
    assert prior is not None
    identity, identity_version, upgrade_from = _identity_of(client, inst)
    if upgrade_from is not None and identity is not None:
        identity = client.upgrade_resource_identity(inst.type, upgrade_from, identity)
    outcome = client.read_resource(inst.type, prior, tfstate.private_bytes(inst.obj), identity)
    return _update_of(client, inst, p, outcome, identity_version, secrets)


async def _refresh_one_async(client: ResourceClient, reader: AsyncReader, inst: tfstate.Instance, options: RefreshOptions,
                             secrets: Redactor, prior_json: bytes | None = None) -> InstanceUpdate:
    """_refresh_one from the event loop: the read through ``reader``; the upgrades, rare and
    local to the provider, through the blocking client on a thread (they must not stall the loop)."""
    p = _prior_of(client, inst, options, secrets, prior_json)
    prior = await asyncio.to_thread(_upgraded, client, inst, p, secrets) if p.upgrade else p.canonical_prior
    assert prior is not None
    identity, identity_version, upgrade_from = _identity_of(client, inst)
    if upgrade_from is not None and identity is not None:
        identity = await asyncio.to_thread(client.upgrade_resource_identity, inst.type, upgrade_from, identity)
    outcome = await reader.read_resource(inst.type, prior, tfstate.private_bytes(inst.obj), identity)
    return _update_of(client, inst, p, outcome, identity_version, secrets)


def _update_of(client: ResourceClient, inst: tfstate.Instance, p: _Prior, outcome: ReadOutcome,
               identity_version: int | None, secrets: Redactor) -> InstanceUpdate:
    """What a read found, as the splice takes it."""
    if outcome.new_state is None:
        return InstanceUpdate(removed=True, changed=True)
    sensitive = list(outcome.sensitive_paths) + client.sensitive_paths(inst.type, outcome.new_state)
    if sensitive:
        for value in values_at(json.loads(outcome.new_state), sensitive):
            secrets.add_value(value)
    flatmap = inst.flatmap is not None
    changed = not flatmap and outcome.new_state != (p.canonical_prior if p.canonical_prior is not None else p.raw_prior)
    return InstanceUpdate(
        removed=False,
        # A flatmap object's first structured form is its baseline (the lifecycle index keeps it
        # as the same object), so what the read found is compared with nothing before it.
        changed=changed,
        reshaped=flatmap,
        # The splice keeps an unchanged object's stored value; a flatmap one gets its first object form.
        attributes=outcome.new_state if changed or flatmap else b"",
        private=outcome.private,
        identity=outcome.identity,
        identity_schema_version=identity_version if outcome.identity is not None else None,
        schema_version=p.live if p.upgrade else p.recorded,
        sensitive_paths=sensitive,
    )


def _identity_of(client: ResourceClient, inst: tfstate.Instance) -> tuple[bytes | None, int | None, int | None]:
    """The stored identity (JSON), the provider's identity schema version, and the stored identity's
    version when UpgradeResourceIdentity must bring it to the provider's first (else None).

    As Terraform 1.12: a stored identity_schema_version newer than the provider's is an error, an
    older one is upgraded with UpgradeResourceIdentity before the read. Unlike Terraform, an
    instance with no identity stored (a state from before 1.12) is not sent to the upgrade with an
    empty identity, which providers built on terraform-plugin-framework refuse: the read fills it in."""
    stored = inst.obj.get("identity")
    identity = tfstate.dumps_compact(stored).encode() if stored is not None else None
    live = client.identity_schema_version(inst.type)
    if live is None:
        return identity, None, None
    recorded = inst.obj.get("identity_schema_version", 0)
    if not isinstance(recorded, int) or isinstance(recorded, bool) or recorded < 0:
        raise ResourceError(f"identity_schema_version {recorded!r} is not a whole number")
    if recorded > live:
        raise ResourceError(
            f"resource instance identity managed by a newer provider version (state has identity schema version "
            f"{recorded}, {client.info.source} {client.info.version} has {live})"
        )
    return identity, live, recorded if recorded < live and identity is not None else None


def _remember_secrets(client: ResourceClient, type_name: str, raw_prior: bytes, marks: list[AttributePath],
                      secrets: Redactor) -> None:
    """Feed the prior object's sensitive values (marked, or sensitive in the live schema) to the
    redactor before the provider sees them: its logs and errors about them then come out masked."""
    try:
        paths = marks + client.sensitive_paths(type_name, raw_prior)
        if paths:
            for value in values_at(json.loads(raw_prior), paths):
                secrets.add_value(value)
    except (KlError, ValueError, TypeError):
        pass  # a prior that does not parse or fit is the read's to report; masking is best effort


def _drift_of(entry: _Entry, schemas: attribute_drift.Schemas) -> dict[str, Any]:
    """What a changed instance's read found, as kl drift prints it (SCHEMAS shape its paths)."""
    update = entry.update
    assert update is not None
    deposed = entry.inst.deposed or None
    if update.removed:  # every attribute "-> null" would say nothing more than "deleted"
        return {"address": entry.inst.address, "deposed": deposed, "kind": "deleted", "changes": []}
    try:
        before = json.loads(entry.prior_json) if entry.prior_json is not None else entry.inst.obj.get("attributes")
        after = json.loads(update.attributes)
    except ValueError:
        before = after = None
    key = attribute_drift.schema_key({"provider": entry.inst.provider, "mode": entry.inst.mode, "type": entry.inst.type})
    block = attribute_drift.choose_block(attribute_drift.schema_blocks(schemas, key), after, before)
    changes = attribute_drift.changes(before if isinstance(before, dict) else None, after if isinstance(after, dict) else None,
                                      entry.inst.obj.get("sensitive_attributes"),
                                      [path_to_state_json(p) for p in update.sensitive_paths], block=block)
    return {"address": entry.inst.address, "deposed": deposed, "kind": "changed",
            "changes": [{"path": c.path, "before": c.before, "after": c.after} for c in changes]}


def _judge_drift(conn: psycopg.Connection, name: str, sid: str, drifted: list[_Entry], items: list[dict[str, Any]]) -> None:
    """Each item's status as the drift records will have it once committed (asked before the
    commit, so a dry run gets the same answer): what kl drift, kl status and the exit codes say."""
    findings = []
    for e in drifted:
        update = e.update
        assert update is not None
        before = e.prior_json.decode() if e.prior_json is not None else tfstate.dumps_compact(e.inst.obj.get("attributes"))
        after = None if update.removed or update.attributes is None else update.attributes.decode()
        findings.append(ignore_rules.Finding(e.inst.address, e.inst.deposed, "deleted" if update.removed else "changed",
                                             before, after))
    for item, verdict in zip(items, ignore_rules.classify(conn, name, sid, findings), strict=True):
        item["status"] = "resolved" if verdict.read_back else "ignored" if verdict.rules else "open"
        item["ignored_by"] = None if not verdict.rules else {
            "rule": verdict.rules[0]["rule"], "reason": verdict.rules[0]["reason"], "rules": verdict.rules}


def _with_read_back(conn: psycopg.Connection, sid: str, entries: list[_Entry], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ITEMS and, in address order among them, the open drift this run resolves: objects read back
    exactly as Terraform's version holds them where a record says they differed."""
    found = {(i["address"], i["deposed"] or "") for i in items}
    read = {(e.inst.address, e.inst.deposed) for e in entries if e.read and not e.error}
    back: list[dict[str, Any]] = [{"address": a, "deposed": d or None, "kind": k, "changes": [], "status": "resolved", "ignored_by": None}
            for a, d, k in drift_records.on_terraforms_baseline(conn, sid) if (a, d) in read and (a, d) not in found]
    return sorted(items + back, key=lambda i: (i["address"], i["deposed"] or "")) if back else items


class _Run:
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

    def record_failure(self, entry: _Entry, message: str) -> None:
        # Failure messages are printed, stored in refresh_runs and quoted in cancel reasons;
        # providers' diagnostics and stderr may quote secret values in them.
        message = self.secrets.redact(message)
        entry.error = message
        if self.options.fail_fast:
            self.cancel.cancel(f"fail-fast: {entry.inst.address}: {message}")

    def read_with_retries(self, client: ResourceClient, entry: _Entry, gate: inflight.Gate, rng: random.Random) -> None:
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
                entry.update = _refresh_one(client, entry.inst, self.options, self.secrets, entry.prior_json)
            except Exception as exc:  # noqa: BLE001 - _settle fails the instance: a bug must never drop it
                error = exc
            attempt += isinstance(error, ThrottledError)
            pause = self._settle(entry, gate, epoch, error, sent, started, attempt, rng)
            if pause is None or self.cancel.wait(pause):
                return

    async def read_with_retries_async(self, client: ResourceClient, reader: AsyncReader, entry: _Entry,
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
                entry.update = await _refresh_one_async(client, reader, entry.inst, self.options, self.secrets, entry.prior_json)
            except Exception as exc:  # noqa: BLE001 - _settle fails the instance: a bug must never drop it
                error = exc
            attempt += isinstance(error, ThrottledError)
            pause = self._settle(entry, gate, epoch, error, sent, started, attempt, rng)
            if pause is None or await self._cancelled_within(pause):
                return

    def _settle(self, entry: _Entry, gate: inflight.Gate, epoch: int, error: Exception | None, sent: float,
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

    def run_group(self, key: GroupKey, entries: list[_Entry], opened: list[str]) -> None:
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

    def _read_group_threads(self, client: ResourceClient, label: str, entries: list[_Entry], gate: inflight.Gate,
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

    def _read_group_async(self, client: ResourceClient, label: str, entries: list[_Entry], gate: inflight.Gate,
                          rng: random.Random) -> str | None:
        """Every instance of the group, read from one event loop in this thread; the transport
        that carried the reads, or None (nothing read) when the client has no async reads."""
        return asyncio.run(self._read_all(client, label, entries, gate, rng))

    async def _read_all(self, client: ResourceClient, label: str, entries: list[_Entry], gate: inflight.Gate,
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


def run(
    conn: psycopg.Connection,
    name: str,
    factory: ClientFactory,
    options: RefreshOptions,
    *,
    state_id: str | None = None,
    progress: ProgressFn | None = None,
    cancel: Cancellation | None = None,
    secrets: Redactor | None = None,
    on_lock_wait: LockWaitFn | None = None,
    on_loaded: Callable[[], None] | None = None,
) -> Result:
    """Refresh state NAME; ``state_id``: its id, when the caller looked it up already. ``secrets``:
    the run's redactor (a new, empty one unless given); ``on_lock_wait`` hears about every retry
    while waiting for someone else's lock; ``on_loaded`` is called once the state is loaded and
    indexed, before any read (kilolock.gcpolicy)."""
    started = time.monotonic()
    cancel = cancel or Cancellation()
    secrets = Redactor() if secrets is None else secrets
    result = Result(state=name, dry_run=options.dry_run)
    # A mistyped environment variable is the user's mistake, not a failed run: refused before the
    # audit row (which `kl runs` would list and a channel would be notified of).
    read_path()
    transport.chosen()  # KL_PROVIDER_TRANSPORT
    grace = stop_grace()

    try:
        sid = state_id or states.state_id(conn, name)
        current = versions.current_version(conn, sid)
        if current is None:
            raise KlError(f"state {name!r} has no versions to refresh")
        parser = tfstate.ExactJSON()
        # Parsed a piece at a time: the whole text is never built next to the document.
        doc = versions.load_document(conn, name, current.serial, parser.loads)
        result.from_serial = current.serial
        result.run_id = refresh_runs.begin(conn, sid, current.id, options.actor)
    except psycopg.Error as exc:
        if not db.lost(exc, conn):
            raise
        # Before the audit row exists (or while it is being written: `kl runs --stale` finishes it).
        raise KlError(f"lost the database connection ({first_line(exc)}); nothing was refreshed") from None

    to_version_id: str | None = None
    keys: Keys | None = None
    try:
        if isinstance(doc, dict) and tfstate.is_encrypted_envelope(doc):
            doc, keys = _decrypted(name, current, doc, parser, options, secrets)
        state = tfstate.parse_state(doc, origin=f"state {name!r} v{current.serial}")
        _check_workdir(name, options)  # before any provider starts
        if not options.dry_run:  # a dry run writes nothing, so no lock concerns it
            wait_for_lock(lambda: _refuse_if_locked(conn, sid, name, options.commit), options.lock_timeout,
                          sleep=cancel.wait, on_wait=on_lock_wait)

        # An encrypted state's index may hold its sensitive values masked: its document is the prior.
        stored = versions.open_attributes(conn, sid) if keys is None else {}
        groups = {k: [_Entry(i, stored.get((i.address, i.deposed))) for i in insts] for k, insts in group_instances(state).items()}
        del stored
        if on_loaded is not None:
            on_loaded()
        shared = _Run(factory, options, progress, cancel, secrets)
        timer = None
        if options.timeout:
            timer = threading.Timer(options.timeout, cancel.cancel, args=(f"timed out after {options.timeout:g}s",))
            timer.daemon = True
            timer.start()
        try:
            with cf.ThreadPoolExecutor(options.concurrency, thread_name_prefix="kl-group") as pool:
                futures = [pool.submit(shared.run_group, k, entries, result.providers) for k, entries in groups.items()]
                stopped_at: float | None = None
                pending = set(futures)
                while pending:
                    # Returns the moment the last group ends (a poll of the cancel flag alone
                    # would add up to its interval to every run); a cancel is seen within it.
                    _, pending = cf.wait(pending, timeout=0.05)
                    if not cancel.cancelled or not pending:
                        continue
                    if stopped_at is None:
                        stopped_at = time.monotonic()
                        log.info("run cancelled (%s): StopProvider to its providers; those still busy %gs later are "
                                 "shut down", cancel.reason, grace)
                        shared.stop_all(stopped_at + grace)  # StopProvider first; each group then closes its process
                    if cancel.at_once or time.monotonic() - stopped_at >= grace:
                        shared.shut_down_all(at_once=cancel.at_once)  # what Stop did not end
                for f in futures:
                    f.result()
        finally:
            if timer:
                timer.cancel()

        entries = [e for es in groups.values() for e in es]
        result.checked = sum(1 for e in entries if e.read)
        result.failures = sorted(shared.group_failures, key=lambda f: f.provider or "") + sorted(
            (Failure(e.inst.address, e.error) for e in entries if e.error and e.read), key=lambda f: f.address or "")
        result.failed = sum(1 for e in entries if e.error)
        result.concurrency = sorted(shared.concurrency, key=lambda c: (c["provider"], c["alias"] or ""))
        for e in entries:  # what an unchanged object was and read back is needed no more
            if e.update is None or not e.update.changed:
                e.prior_json = None
        changed = sorted({e.inst.address for e in entries if e.update is not None and e.update.changed})
        result.changed_addresses, result.changed = changed, len(changed)
        drifted = [e for e in sorted(entries, key=lambda e: (e.inst.address, e.inst.deposed))
                   if e.update is not None and e.update.changed]
        schemas = history.cached_schemas(conn, attribute_drift.schema_keys(  # cached by the run's providers
            {"provider": e.inst.provider, "mode": e.inst.mode, "type": e.inst.type} for e in drifted))
        result.drift = [_drift_of(e, schemas) for e in drifted]
        _judge_drift(conn, name, sid, drifted, result.drift)
        result.drift = _with_read_back(conn, sid, entries, result.drift)
        result.reshaped = sorted({e.inst.address for e in entries
                                  if e.update is not None and e.update.reshaped and not e.update.removed})
        modern_doc, result.provider_addresses, rewritten = tfstate.modern_provider_addresses(doc)

        mass_removal = _mass_removal(groups, options)
        commit, why_not = commit_decision(result, options, mass_removal, cancel.cancelled,
                                          _unplaced_removal(name, entries, options))
        # The guard's refusal, as commit_decision orders its reasons: not a cancelled or failed
        # run, and not a dry run (which commits nothing anyway).
        result.guarded = bool(mass_removal and not options.allow_mass_removal and not cancel.cancelled
                              and not result.failed and not options.dry_run)
        if cancel.cancelled:
            result.status, result.error = "cancelled", cancel.reason
        elif why_not:
            result.status, result.error = "failed", why_not
        else:
            result.status = "succeeded"
        if commit:
            updates = {(e.inst.resource_index, e.inst.instance_index): e.update for e in entries if e.update is not None}
            if result.provider_addresses:
                # Terraform 0.13+ writes the modern address: the rewritten resources hold the same
                # objects, so the index only changes its provider.
                state = tfstate.State(raw=modern_doc, instances=[
                    dataclasses.replace(i, provider=result.provider_addresses.get(i.provider, i.provider))
                    for i in state.instances])
            # In place: drift is computed, and nothing reads the prior document after the commit.
            # An observation keeps its base's serial: Terraform's serial moves only with a version of its own.
            spliced = build_refreshed_state(state, updates, serial=current.serial + 1 if options.commit else current.serial,
                                            parser=parser, in_place=True)
            new_state = spliced.state
            by_position = {(i.resource_index, i.instance_index): (i.address, i.deposed) for i in state.instances}
            touched = {by_position[p] for p in spliced.touched | rewritten}
            same_resources = spliced.same_resources and not result.provider_addresses  # a rewrite may touch no object
            # The reads' bookkeeping is done with: free it before the commit serialises the document.
            del updates, by_position, entries, groups, state, doc, modern_doc, spliced
            if options.commit:
                to_version_id, result.to_serial = commit_refresh(
                    conn, name, sid, new_state, parser, current, options.actor, result.run_id, touched,
                    same_resources=same_resources, lock_timeout=options.lock_timeout, sleep=cancel.wait,
                    on_lock_wait=on_lock_wait, keys=keys)
            else:
                observed = record_observation(conn, name, sid, new_state, parser, current, options.actor, result.run_id,
                                              touched, same_as_base=same_resources, keys=keys)
                to_version_id, result.observation = observed.version.id, observed.version.label
                if observed.locked_by is not None:
                    result.base_locked = True
                    log.info("%s: the state is locked by %s (%s) since this refresh began; what it read may be that "
                             "operation's work, so %s opens no drift", name, observed.locked_by.get("Who") or "someone",
                             observed.locked_by.get("Operation") or "?", observed.version.label)
                elif not observed.on_current:
                    result.base_moved = True
                    log.info("%s: Terraform wrote a newer version while this refresh read %s; its observation is kept "
                             "against %s and opens no drift", name, observed.version.label, f"v{current.serial}")
    except KeyboardInterrupt:
        result.status, result.error = "cancelled", "interrupted"
        raise
    except LockWaitCancelled:
        result.status, result.error = "cancelled", cancel.reason
    except KlError as exc:
        result.status, result.error = "failed", secrets.redact(str(exc))
    except Exception as exc:
        if db.lost(exc, conn):
            # The database went away (restart, a cut connection; behind PgBouncer also an
            # InternalError on a broken connection): a fault to report, not a bug. Only
            # commit_refresh writes a version, and it settles its own outcome, so nothing was committed.
            result.status, result.error = "failed", f"lost the database connection ({first_line(exc)}); nothing committed"
        else:  # a bug: still finish the audit row, then let the CLI report it
            result.status, result.error = "failed", secrets.redact(f"internal error: {type(exc).__name__}: {exc}")
            raise
    finally:
        result.duration_s = round(time.monotonic() - started, 3)
        _finish(conn, result, to_version_id)
    return result


def _decrypted(name: str, current: versions.VersionRow, doc: dict[str, Any], parser: tfstate.ExactJSON,
               options: RefreshOptions, secrets: Redactor) -> tuple[Any, Keys]:
    """The state inside envelope DOC, and the keys that opened it (the commit seals with them):
    from the state's stored encryption configuration, its passphrases made secrets of the run."""
    if options.encryption is None:
        raise KlError(f"state {name!r} is OpenTofu-encrypted and has no encryption configured, so kl cannot read it: "
                      f"`kl state set {name} --encryption-config FILE` (OpenTofu's encryption block as JSON)")
    from kilolock import encryption

    keys = encryption.keys_for(dict(options.encryption), options.store_decrypted_attributes, f"state {name!r}", secrets)
    opened = encryption.open_envelope(doc, keys, f"state {name!r} v{current.serial}")
    return parser.loads(opened.plaintext), keys


def _refuse_if_locked(conn: psycopg.Connection, sid: str, name: str, commit: bool) -> None:
    """An observation writes nothing Terraform reads, so a plan's lock does not stop it; any other
    operation (an apply, an import) may be changing what it would read. A commit needs the state."""
    holder = locks.current(conn, sid)
    if holder is not None and (commit or locks.may_change_objects(holder)):
        raise locks.StateLocked(name, holder, "--lock-timeout DURATION waits for it; --dry-run does not need it")


def _finish(conn: psycopg.Connection, result: Result, to_version_id: str | None) -> None:
    if result.run_id is None:
        return
    summary = whyfailed.audit_summary(result)
    finish_audit(conn, result.run_id, result.state, f"refresh {result.status}: {result.error or summary}",
                 status=result.status if result.status != "running" else "failed", checked=result.checked,
                 changed=result.changed, failed=result.failed, error_summary=summary, to_version_id=to_version_id,
                 concurrency=result.concurrency or None, guarded=result.guarded)
