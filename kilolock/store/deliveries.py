"""Deliveries of notification events: the cheap check for due ones, leasing them to a sender (FOR
UPDATE SKIP LOCKED), each attempt recorded with the next one scheduled, and the log of them.
The events and their deliveries are written by store/notify.py, in the transaction of what caused
them; kilolock.notify.deliver does the sending."""
from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

import psycopg
from psycopg.rows import class_row

from kilolock.store import notify


class ClaimedDelivery(TypedDict):
    """What sending one leased delivery needs: its event, and the channel it goes to."""

    delivery_id: int
    attempts: int
    event_id: str
    kind: str
    state_name: str | None
    serial: int | None
    discovery_run_id: str | None
    version_id: str | None
    run_id: str | None
    version_source: str | None
    observation: str | None  # "v42.3" for an event of an observation
    detail: Any  # the event's JSON
    created_at: datetime
    channel: str
    format: str
    webhook: Any  # a URL string, or {"env": "NAME"}
    secret: Any  # None, a string, or {"env": "NAME"}
    ui_url: str | None


class EventResource(TypedDict):
    """A lifecycle row a drift event names, with what masking it needs."""

    id: str
    mode: str
    type: str
    provider: str
    attributes: Any  # the instance's attributes (JSON)
    sensitive_attributes: Any  # Terraform's sensitivity paths (JSON)


class LoggedDelivery(TypedDict):
    """A row of `kl notify log`: a delivery with every attempt of it."""

    id: int
    channel: str
    event: str
    state: str | None
    serial: int | None
    idempotency_key: str
    status: str
    attempts: int
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    next_attempt_at: datetime
    attempt_log: list[dict[str, Any]]  # JSON: attempt, at, http_status, error, duration_ms


_DUE = """
SELECT EXISTS (SELECT 1 FROM notify_deliveries
               WHERE status = 'pending' AND next_attempt_at <= now() AND (lease_until IS NULL OR lease_until < now()))
"""
# _DUE, whether any channel's staleness is due for evaluation (notify's _STALE_EVENTS, its first CTE), and
# whether duplicates are (its _DUPLICATE_EVENTS's).
_DUE_AND_STALE_DUE = """
SELECT EXISTS (SELECT 1 FROM notify_deliveries
               WHERE status = 'pending' AND next_attempt_at <= now() AND (lease_until IS NULL OR lease_until < now())),
       EXISTS (SELECT 1 FROM notify_channels
               WHERE stale_after_s IS NOT NULL AND 'refresh.stale' = ANY(events)
                 AND (stale_checked_at IS NULL
                      OR stale_checked_at <= now() - make_interval(secs => LEAST(stale_after_s / 10, %(max_period)s)))),
       EXISTS (SELECT 1 FROM notify_channels
               WHERE 'resource.duplicate' = ANY(events)
                 AND (duplicates_checked_at IS NULL
                      OR duplicates_checked_at <= now() - make_interval(secs => %(duplicate_period)s)))
"""
# Seconds until the next pending delivery may be claimed (its retry time, or its lease's end).
_NEXT_DUE = """
SELECT EXTRACT(EPOCH FROM min(GREATEST(next_attempt_at, COALESCE(lease_until, next_attempt_at))) - now())::float8
FROM notify_deliveries WHERE status = 'pending'
"""
_CLAIM = """
UPDATE notify_deliveries d SET lease_owner = %(owner)s, lease_until = now() + make_interval(secs => %(lease)s)
WHERE d.id IN (
    SELECT id FROM notify_deliveries
    WHERE status = 'pending' AND next_attempt_at <= now() AND (lease_until IS NULL OR lease_until < now())
    ORDER BY next_attempt_at, id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING d.id
"""
_CLAIMED = """
SELECT d.id AS delivery_id, d.attempts, e.id::text AS event_id, e.kind, e.state_name, e.serial,
       e.discovery_run_id::text AS discovery_run_id,
       e.version_id::text AS version_id,
       COALESCE(e.run_id, (SELECT rr.id FROM refresh_runs rr WHERE rr.to_version_id = e.version_id LIMIT 1))::text AS run_id,
       (SELECT v.source FROM state_versions v WHERE v.id = e.version_id) AS version_source,
       (SELECT 'v' || v.serial || '.' || v.observation_number FROM state_versions v
        WHERE v.id = e.version_id AND v.kind = 'observation') AS observation,
       e.detail, e.created_at, c.name AS channel, c.format, c.webhook, c.secret, c.ui_url
FROM notify_deliveries d JOIN notify_events e ON e.id = d.event_id JOIN notify_channels c ON c.id = d.channel_id
WHERE d.id = ANY(%s) ORDER BY d.id
"""
_RESOURCES = "SELECT id::text AS id, mode, type, provider, attributes, sensitive_attributes FROM resources WHERE id = ANY(%s::uuid[])"

# One attempt: its row, then the delivery's next step, both only while this owner holds the lease.
# A failed attempt is retried after 2^(attempts-1) seconds (at most max_delay), until the delivery
# is older than retry_for: then it is `failed` for good.
_FINISH_ATTEMPT = """
WITH mine AS (
    SELECT id, attempts + 1 AS attempt, created_at FROM notify_deliveries WHERE id = %(id)s AND lease_owner = %(owner)s
    FOR UPDATE
),
logged AS (
    INSERT INTO notify_attempts (delivery_id, attempt, owner, http_status, error, duration_ms)
    SELECT id, attempt, %(owner)s, %(http_status)s, %(error)s, %(ms)s FROM mine
    RETURNING 1
)
UPDATE notify_deliveries d SET
    attempts = m.attempt,
    status = CASE WHEN %(ok)s THEN 'delivered'
                  WHEN now() + make_interval(secs => LEAST(power(2, m.attempt - 1), %(max_delay)s)) > m.created_at + make_interval(secs => %(retry_for)s)
                  THEN 'failed' ELSE 'pending' END,
    next_attempt_at = now() + make_interval(secs => LEAST(power(2, m.attempt - 1), %(max_delay)s)),
    lease_owner = NULL, lease_until = NULL,
    last_error = CASE WHEN %(ok)s THEN NULL ELSE %(error)s END,
    delivered_at = CASE WHEN %(ok)s THEN now() END
FROM mine m WHERE d.id = m.id
RETURNING d.status
"""


def check_due(conn: psycopg.Connection) -> bool:
    """The cheap check of every kl process that opens the store and of the sender threads: record
    what staleness and duplicates are due (notify.record_stale_events, record_duplicate_events), then is any delivery waiting? One round trip when
    no channel's staleness is due for evaluation, the usual case."""
    row = conn.execute(_DUE_AND_STALE_DUE, {"max_period": notify.STALE_CHECK_MAX_PERIOD_S,
                                            "duplicate_period": notify.DUPLICATE_CHECK_PERIOD_S}).fetchone()
    due = bool(row and row[0])
    if row and (row[1] or row[2]):
        if row[1]:
            notify.record_stale_events(conn)
        if row[2]:
            notify.record_duplicate_events(conn)
        row = conn.execute(_DUE).fetchone()
        due = bool(row and row[0])
    if due:
        notify.note_due()
    return due


def seconds_to_next(conn: psycopg.Connection) -> float | None:
    row = conn.execute(_NEXT_DUE).fetchone()
    return None if row is None or row[0] is None else max(0.0, float(row[0]))


def claim(conn: psycopg.Connection, owner: str, *, lease_s: float, limit: int = 20) -> list[ClaimedDelivery]:
    """Lease up to LIMIT due deliveries to OWNER (committed at once: the lease is what keeps another
    process from sending them) and return what sending them needs."""
    with conn.transaction():
        ids = [r[0] for r in conn.execute(_CLAIM, {"owner": owner, "lease": lease_s, "limit": limit}).fetchall()]
    if not ids:
        return []
    return conn.cursor(row_factory=class_row(ClaimedDelivery)).execute(_CLAIMED, (ids,)).fetchall()


_RELEASE = "UPDATE notify_deliveries SET lease_owner = NULL, lease_until = NULL WHERE id = ANY(%s) AND lease_owner = %s"


def release(conn: psycopg.Connection, delivery_ids: list[int], owner: str) -> None:
    """Give back leases not used (out of time): the next sender need not wait for them to expire."""
    conn.execute(_RELEASE, (delivery_ids, owner))


def resources(conn: psycopg.Connection, ids: list[str]) -> dict[str, EventResource]:
    """Attributes and sensitivity marks of lifecycle rows (what a drift event names), by id."""
    if not ids:
        return {}
    return {r["id"]: r for r in conn.cursor(row_factory=class_row(EventResource)).execute(_RESOURCES, (ids,)).fetchall()}


def finish_attempt(conn: psycopg.Connection, delivery_id: int, owner: str, *, ok: bool, http_status: int | None,
                   error: str | None, duration_ms: int, retry_for_s: float, max_delay_s: float) -> str | None:
    """Record one attempt; returns the delivery's status after it (None: the lease was lost)."""
    with conn.transaction():
        row = conn.execute(_FINISH_ATTEMPT, {
            "id": delivery_id, "owner": owner, "ok": ok, "http_status": http_status, "error": error,
            "ms": duration_ms, "retry_for": retry_for_s, "max_delay": max_delay_s}).fetchone()
    return None if row is None else str(row[0])


# --- the log -----------------------------------------------------------------------------------

_LOG = """
SELECT d.id, c.name AS channel, e.kind AS event, e.state_name AS state, e.serial, e.id::text AS idempotency_key,
       d.status, d.attempts, d.last_error, d.created_at, d.delivered_at, d.next_attempt_at,
       COALESCE((SELECT jsonb_agg(jsonb_build_object('attempt', a.attempt, 'at', a.at, 'http_status', a.http_status,
                                                     'error', a.error, 'duration_ms', a.duration_ms) ORDER BY a.attempt)
                 FROM notify_attempts a WHERE a.delivery_id = d.id), '[]'::jsonb) AS attempt_log
FROM notify_deliveries d JOIN notify_events e ON e.id = d.event_id JOIN notify_channels c ON c.id = d.channel_id
WHERE (NOT %(failed)s OR d.status = 'failed' OR d.last_error IS NOT NULL)
  AND (%(channel)s::text IS NULL OR c.name = %(channel)s)
ORDER BY d.created_at DESC, d.id DESC
LIMIT %(limit)s
"""


def delivery_log(conn: psycopg.Connection, *, failed: bool, channel: str | None, limit: int) -> list[LoggedDelivery]:
    """Newest deliveries first, each with its attempts. ``failed``: those whose last attempt failed
    (given up, or waiting for a retry)."""
    if channel is not None:
        notify.get_channel(conn, channel)
    return conn.cursor(row_factory=class_row(LoggedDelivery)).execute(
        _LOG, {"failed": failed, "channel": channel, "limit": limit}).fetchall()
