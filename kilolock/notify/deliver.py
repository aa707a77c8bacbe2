"""Sending notifications: after commit, by whichever kl process gets there first, once.

Who sends: the process that committed the event, before it exits (``after_command``: it waits a
short bounded time for retries); else the next kl process that opens the store (it found them due
in open_store's cheap check); `kl serve`'s background thread (``Background``); any later process.
A delivery is leased to one process at a time (store.deliveries.claim: FOR UPDATE SKIP LOCKED and a
lease longer than one attempt can take), every attempt is recorded, and every retry of an event
carries its idempotency key: a receiver that dedupes on it sees each event once.
"""
from __future__ import annotations

import http.client
import logging
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

import psycopg

import kilolock
from kilolock import drift, redact
from kilolock.errors import KlError
from kilolock.notify import payload
from kilolock.redact import Redactor
from kilolock.store import db, deliveries, history
from kilolock.store import notify as outbox
from kilolock.store.db import first_line

log = logging.getLogger("kilolock.notify")

LEASE_S = 120.0  # well above HTTP_TIMEOUT_S: a live sender never loses its lease mid-attempt
HTTP_TIMEOUT_S = 10.0
RETRY_FOR_S = 3600.0  # a delivery is retried for an hour after its event, then marked failed
MAX_DELAY_S = 300.0  # backoff 1 s, 2 s, 4 s, … at most 5 min between attempts
WAIT_AFTER_COMMIT_S = 10.0  # the committing process waits this long at most (KL_NOTIFY_WAIT)
NEXT_PROCESS_BUDGET_S = 5.0  # another process's leftovers: one pass, no waiting for retries
BATCH = 5
# Test-only fault point: `kill-before-delivery` kills the process (SIGKILL) after its commit,
# before it sends anything, as a crash there would.
FAULT_ENV = "KL_TEST_NOTIFY_FAULT"
USER_AGENT = f"kilolock/{kilolock.__version__}"


class NotifyError(KlError):
    pass


PostFn = Callable[[str, bytes, Mapping[str, str], float], tuple[int | None, str | None]]


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook that answers with a redirect has not taken the event: no POST is replayed elsewhere."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> tuple[int | None, str | None]:
    """POST BODY to URL; (HTTP status or None, what went wrong or None)."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return None, "the webhook URL is not http(s)"
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with _opener.open(request, timeout=timeout) as response:
            response.read(65536)
            return int(response.status), None
    except urllib.error.HTTPError as exc:
        return int(exc.code), f"HTTP {exc.code} {exc.reason}"
    except urllib.error.URLError as exc:
        return None, f"cannot reach the webhook: {exc.reason}"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def resolve(value: Any, secrets: Redactor, where: str) -> str | None:
    """A stored URL or secret (a string or {"env": "NAME"}) as sent; every form is a secret."""
    if value is None:
        return None
    resolved = redact.resolve_env_refs(value, secrets, where, NotifyError)
    if not isinstance(resolved, str) or not resolved:
        raise NotifyError(f"{where}: not a string")
    secrets.add(resolved)
    return resolved


def _attempt(conn: psycopg.Connection, d: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]], owner: str,
             post_fn: PostFn, schemas: drift.Schemas | None = None) -> str | None:
    secrets = Redactor()
    started = time.monotonic()
    status: int | None = None
    try:
        url = resolve(d["webhook"], secrets, f"channel {d['channel']} webhook")
        secret = resolve(d["secret"], secrets, f"channel {d['channel']} secret")
        assert url is not None
        doc = payload.document(d, payload.addresses(d["detail"], rows, schemas) if d["kind"].startswith("drift.") else [])
        body = payload.body_bytes(d["format"], doc)
        status, error = post_fn(url, body, payload.headers(d, body, secret, USER_AGENT), HTTP_TIMEOUT_S)
    except KlError as exc:
        error = str(exc)
    ok = status is not None and 200 <= status < 300
    error = None if ok else secrets.redact(error or f"HTTP {status}")
    outcome = deliveries.finish_attempt(conn, d["delivery_id"], owner, ok=ok, http_status=status, error=error,
                                    duration_ms=int((time.monotonic() - started) * 1000),
                                    retry_for_s=RETRY_FOR_S, max_delay_s=MAX_DELAY_S)
    if not ok:
        log.warning("notification %s to channel %s: %s (%s)", d["kind"], d["channel"], error,
                    "gave up" if outcome == "failed" else "will retry")
    return outcome


def deliver_due(conn: psycopg.Connection, *, budget_s: float, wait_for_retries: bool, owner: str | None = None,
                post_fn: PostFn = post) -> int:
    """Send what is due (one attempt at least, whatever the budget), for at most about BUDGET_S
    seconds plus one attempt's timeout; ``wait_for_retries``: also wait for retries due within the
    budget. Returns deliveries made."""
    owner = owner or owner_id()
    deadline = time.monotonic() + budget_s
    delivered = 0
    first = True
    while first or time.monotonic() < deadline:
        batch = deliveries.claim(conn, owner, lease_s=LEASE_S, limit=BATCH)
        in_budget = first or time.monotonic() < deadline
        first = False
        if not batch:
            wait = deliveries.seconds_to_next(conn) if wait_for_retries else None
            if wait is None or time.monotonic() + wait >= deadline:
                break
            time.sleep(wait + 0.05)
            continue
        rows = deliveries.resources(conn, sorted({i for d in batch for i in payload.resource_ids(d["detail"])}))
        schemas = history.cached_schemas(conn, drift.schema_keys(rows.values()))  # paths as kl drift shows them
        for i, d in enumerate(batch):
            if not in_budget:
                deliveries.release(conn, [x["delivery_id"] for x in batch[i:]], owner)
                break
            if _attempt(conn, d, rows, owner, post_fn, schemas) == "delivered":
                delivered += 1
            in_budget = time.monotonic() < deadline
    return delivered


def _wait_budget() -> float:
    from kilolock.durations import from_env

    return from_env("KL_NOTIFY_WAIT", WAIT_AFTER_COMMIT_S)


def after_command(url: str) -> None:
    """The CLI's last step, for a command that opened the store of URL: a process that committed
    events sends them (waiting a bounded time for retries); one that found deliveries due when it
    opened the store sends those. A process that did neither returns at once."""
    wrote, due = outbox.work_hint()
    if not (wrote or due):
        return
    if wrote and os.environ.get(FAULT_ENV) == "kill-before-delivery":
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        with db.connect(url) as conn:
            deliver_due(conn, budget_s=_wait_budget() if wrote else NEXT_PROCESS_BUDGET_S, wait_for_retries=wrote)
    except (KlError, psycopg.Error) as exc:
        # Nothing is lost: the deliveries stay pending for the next process or kl serve.
        log.warning("notifications not sent now (%s); the next kl process or kl serve sends them", first_line(exc))


class Background:
    """`kl serve`'s sender: every INTERVAL seconds, the cheap check, then what is due."""

    def __init__(self, connect: Callable[[], psycopg.Connection], interval: float = 2.0) -> None:
        self._connect = connect
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kl-notify", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        conn: psycopg.Connection | None = None
        while not self._stop.wait(self._interval):
            try:
                if conn is None or conn.closed:
                    conn = self._connect()
                if deliveries.check_due(conn):
                    deliver_due(conn, budget_s=self._interval * 5, wait_for_retries=False)
            except (KlError, psycopg.Error) as exc:
                log.warning("notification sender: %s; retrying", first_line(exc))
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()


def send_test(channel: outbox.Channel, post_fn: PostFn = post) -> tuple[bool, str]:
    """`kl notify test`: one sample event straight to the channel (not through the outbox)."""
    secrets = Redactor()
    url = resolve(channel.webhook, secrets, f"channel {channel.name} webhook")
    secret = resolve(channel.secret, secrets, f"channel {channel.name} secret")
    assert url is not None
    import uuid
    from datetime import datetime, timezone

    event = {"kind": "drift.new", "event_id": f"test-{uuid.uuid4()}", "delivery_id": "test",
             "created_at": datetime.now(timezone.utc), "state_name": "kl-notify-test", "serial": None,
             "observation": None, "version_source": None, "run_id": None, "channel": channel.name, "ui_url": channel.ui_url,
             "detail": {}}
    doc = payload.document(event, [{"address": "null_resource.example", "deposed": None, "kind": "changed",
                                    "paths": ["triggers"], "resolved_how": None,
                                    "changes": [{"path": 'triggers["note"]', "before": "a", "after": "b"}]}])
    doc["test"] = True
    body = payload.body_bytes(channel.format, doc)
    status, error = post_fn(url, body, payload.headers(event, body, secret, USER_AGENT), HTTP_TIMEOUT_S)
    if status is not None and 200 <= status < 300:
        return True, f"HTTP {status}"
    return False, secrets.redact(error or f"HTTP {status}")
