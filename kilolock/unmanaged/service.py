"""One discovery run: open the provider as a refresh does (kilolock.refresh.factory, configured as
`kl provider configure` stores it, or as state S uses it), list the type's objects (ListResource,
holding one of the provider's fleet-wide slots where `kl provider limit` caps it),
match each against the open instances (kilolock.unmanaged.matching), record the run and what it
found (store/discovery_runs), the run's failure too.

Ctrl-C (or SIGTERM, raised as Terminated) while the provider streams ends the listing: the call is
cancelled, the provider ended as a refresh ends it (Shutdown, then SIGKILL), and the run recorded as
cancelled. A run on another thread (a fleet worker's) is cancelled through its Cancellation instead:
the provider is shut down under the listing, which then ends.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg

from kilolock.errors import KlError
from kilolock.redact import Redactor
from kilolock.refresh.cancel import Cancellation
from kilolock.refresh.client import ListedObject, ListingError, OpenedProvider
from kilolock.refresh.encoding import EncodingClient
from kilolock.refresh.factory import ProviderFactory
from kilolock.refresh.slots import fleet_slots
from kilolock.store import discovery_runs, settings, states
from kilolock.store.discovery_runs import Found, Scope
from kilolock.unmanaged import matching


class DiscoveryCancelled(KlError):
    """Ctrl-C or SIGTERM ended the run: recorded as cancelled, and kl exits as an interrupted
    refresh does (128 + the signal's number)."""

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt (by kl discover's handler): the run
    ends as Ctrl-C ends it, and says it was terminated."""


@dataclass(frozen=True)
class Request:
    scope: Scope
    limit: int | None = None  # the most objects the provider is asked for (None: all)
    actor: str | None = None
    search_paths: tuple[str, ...] = ()  # where provider binaries are looked for first (a state's own after them)
    rpc_timeout: float | None = None
    fleet_job: int | None = None  # the fleet job this run is (linked to it as the run begins)
    cancel: Cancellation | None = None  # set from another thread: the listing ends, the run is cancelled


@dataclass
class Outcome:
    run_id: str
    provider: OpenedProvider
    found: list[Found] = field(default_factory=list)

    def count(self, match: str) -> int:
        return sum(1 for f in self.found if f.match == match)


@contextmanager
def _slot(conn: psycopg.Connection, scope: Scope) -> Iterator[None]:
    """One of the provider's fleet-wide slots (kl provider limit) for as long as the listing streams:
    a listing is a call in flight like a read, and counts against the same cap."""
    with fleet_slots(conn) as fleet:
        slots = fleet.for_provider(scope.source, scope.alias) if fleet is not None else None
        if slots is None:
            yield
            return
        slots.acquire()
        try:
            yield
        finally:
            slots.release()


@contextmanager
def _cancelled_by(cancel: Cancellation | None, client: EncodingClient) -> Iterator[None]:
    """While the block runs, CANCEL shuts the provider down (killed at once when it says so): the
    listing the block reads fails, and discover() records the run as cancelled."""
    if cancel is None:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if cancel.wait(0.2):
                if not done.is_set():
                    client.shut_down(at_once=cancel.at_once)
                return

    watcher = threading.Thread(target=watch, name="kl-discover-cancel", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def _classify(claims: list[matching.Claim]) -> str:
    return "unmanaged" if not claims else "managed" if len(claims) == 1 else "managed twice"


def discover(conn: psycopg.Connection, req: Request) -> Outcome:
    """Runs one discovery and records it; raises the KlError that ended it (recorded as the run's
    failure), DiscoveryCancelled for a KeyboardInterrupt (recorded as cancelled)."""
    scope = req.scope
    sid = states.state_id(conn, scope.state) if scope.state is not None else None
    search_paths, workdir = req.search_paths, None
    if sid is not None:
        stored = settings.get(conn, sid)
        search_paths += stored.provider_search_paths or ()
        workdir = stored.workdir
    run_id = discovery_runs.begin(conn, scope, req.limit, req.actor, fleet_job=req.fleet_job)
    found: list[Found] = []
    try:
        factory = ProviderFactory(conn, sid, search_paths, rpc_timeout=req.rpc_timeout, workdir=workdir, list_schemas=True)
        client = factory.open(scope.source, scope.alias, Redactor())
        try:
            if not isinstance(client, EncodingClient):
                raise ListingError(f"provider {scope.source}: this source of processes cannot list")
            config = json.dumps(scope.list_config).encode()
            with _slot(conn, scope), _cancelled_by(req.cancel, client):
                listed: list[ListedObject] = list(client.list_objects(scope.type, config, req.limit or 0))
            version = client.identity_schema_version(scope.type) or 0
        finally:
            client.close()
        identities = [json.loads(obj.identity) for obj in listed]
        claimed = matching.claims(conn, scope.source, scope.type, identities, version)
        found = [Found(identity, obj.display_name, _classify(c), [x.as_json() for x in c])
                 for identity, obj, c in zip(identities, listed, claimed, strict=True)]
    except KlError as exc:
        if req.cancel is not None and req.cancel.cancelled:  # the listing failed because it was cancelled
            why = req.cancel.reason or "cancelled"
            discovery_runs.finish(conn, run_id, found, status="cancelled", error=why)
            raise DiscoveryCancelled(f"discovery cancelled: {why}; recorded as run {run_id}") from None
        discovery_runs.finish(conn, run_id, found, status="failed", error=str(exc))
        raise
    except KeyboardInterrupt as exc:
        why, code = ("terminated (SIGTERM)", 143) if isinstance(exc, Terminated) else ("interrupted (SIGINT)", 130)
        discovery_runs.finish(conn, run_id, found, status="cancelled", error=why)
        raise DiscoveryCancelled(f"discovery cancelled: {why}; recorded as run {run_id}", code) from None
    discovery_runs.finish(conn, run_id, found, status="succeeded")
    return Outcome(run_id, client.info, found)
