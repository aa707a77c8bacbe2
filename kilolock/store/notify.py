"""Notifications in the database: channels, the outbox of events, deliveries and their attempts.

Events are written in the transaction of what caused them (migration 0013): drift events by the
one write path (store/writes.py → drift_records.record → ``record_drift_events``), refresh
events by the refresh_runs finish (``record_run_events``), resource.unmanaged by the
discovery_runs finish (``record_discovery_events``). Both are single set-based statements
that also create the deliveries, one per matching channel, so an event is never committed without
them nor sent without having been committed.

Sending happens after commit (kilolock.notify.deliver, through store/deliveries.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from kilolock.errors import KlError
from kilolock.store import inventory

EVENTS = ("drift.new", "drift.updated", "drift.resolved", "refresh.failed", "refresh.guarded", "refresh.stale",
          "resource.duplicate", "resource.unmanaged")
FORMATS = ("json", "slack")

# Set when this process wrote a delivery (so it should deliver before it exits), or found one due
# when it opened the store. Read by kilolock.notify.deliver.after_command; a rolled-back write
# leaves it set, which costs one more cheap check, never a wrong send.
_hint = {"wrote": False, "due": False}


def work_hint() -> tuple[bool, bool]:
    """(this process wrote deliveries, some were due when it opened the store)."""
    return _hint["wrote"], _hint["due"]


def note_due() -> None:
    """Deliveries were found due: this process sends them before it exits (deliver.after_command)."""
    _hint["due"] = True


def hand_over() -> None:
    """Leave what is pending to the next process (`kl serve` on shutdown: its own sender thread
    did the sending, and a stop must not wait for a receiver's retries)."""
    _hint["wrote"] = _hint["due"] = False


class ChannelError(KlError):
    pass


@dataclass(frozen=True)
class Channel:
    """A notification channel as stored."""

    id: int
    name: str
    format: str
    webhook: Any  # a URL string, or {"env": "NAME"}
    secret: Any  # None, a string, or {"env": "NAME"}
    states_glob: str
    events: list[str]
    failed_after: int
    ui_url: str | None
    stale_after_s: float | None = None
    created_at: datetime | None = None
    created_by: str | None = None


# --- channels ----------------------------------------------------------------------------------

_CHANNEL_COLS = ("id, name, format, webhook, secret, states_glob, events, failed_after, ui_url, stale_after_s, "
                 "created_at, created_by")
_ADD_CHANNEL = f"""
INSERT INTO notify_channels (name, format, webhook, secret, states_glob, states_regex, events, failed_after, ui_url,
                             stale_after_s, created_by)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING RETURNING {_CHANNEL_COLS}
"""
_LIST_CHANNELS = f"SELECT {_CHANNEL_COLS} FROM notify_channels ORDER BY name"
_GET_CHANNEL = f"SELECT {_CHANNEL_COLS} FROM notify_channels WHERE name = %s"
_REMOVE_CHANNEL = "DELETE FROM notify_channels WHERE name = %s"


def add_channel(conn: psycopg.Connection, *, name: str, format: str, webhook: Any, secret: Any, states_glob: str,
                states_regex: str, events: list[str], failed_after: int, ui_url: str | None,
                created_by: str | None, stale_after_s: float | None = None) -> Channel:
    row = conn.cursor(row_factory=class_row(Channel)).execute(_ADD_CHANNEL, (
        name, format, Jsonb(webhook), None if secret is None else Jsonb(secret), states_glob, states_regex, events,
        failed_after, ui_url, stale_after_s, created_by)).fetchone()
    if row is None:
        raise ChannelError(f"a notification channel named {name!r} exists already (see `kl notify list`)")
    return row


# The replay a channel asks for when it is added (--replay-open-drift): one drift.new per state
# whose name the channel's glob matches, naming that state's open drift as current_resource_drift
# shows it (ignore rules applied), delivered to that channel only. The records become announced
# (if no earlier channel heard of them), so their growth and end are sent as for live drift.
_REPLAY_OPEN_DRIFT = """
WITH channel AS (SELECT id, states_regex FROM notify_channels WHERE id = %(channel)s),
open AS MATERIALIZED (
    SELECT d.id, d.state_id, s.name AS state_name, d.address, d.deposed, d.kind, d.changed_attributes,
           d.baseline_resource_id, COALESCE(d.current_observed_id, d.current_resource_id) AS current_resource_id,
           d.detected_version_id
    FROM drift_records d JOIN states s ON s.id = d.state_id, channel c
    WHERE d.resolved_version_id IS NULL AND s.name ~ c.states_regex
      AND EXISTS (SELECT 1 FROM current_resource_drift v WHERE v.drift_id = d.id)
),
noted AS (
    INSERT INTO notify_drift_notices (drift_id, kind, paths)
    SELECT id, kind, COALESCE(changed_attributes, '{}') FROM open
    ON CONFLICT (drift_id) DO NOTHING
    RETURNING 1
),
per_state AS MATERIALIZED (
    SELECT gen_random_uuid() AS event_id, o.state_id, o.state_name,
           (SELECT v.id FROM state_versions v WHERE v.state_id = o.state_id AND v.kind = 'terraform'
            ORDER BY v.serial DESC LIMIT 1) AS version_id,
           jsonb_build_object('replayed', true, 'addresses', jsonb_agg(jsonb_build_object(
               'drift_id', o.id, 'address', o.address, 'deposed', o.deposed, 'kind', o.kind,
               'paths', COALESCE(to_jsonb(o.changed_attributes), '[]'::jsonb),
               'baseline', o.baseline_resource_id, 'current', o.current_resource_id, 'resolved_how', NULL)
               ORDER BY o.address, o.deposed)) AS detail
    FROM open o GROUP BY o.state_id, o.state_name
),
events AS (
    INSERT INTO notify_events (id, kind, state_id, state_name, version_id, serial, detail)
    SELECT p.event_id, 'drift.new', p.state_id, p.state_name, p.version_id,
           (SELECT v.serial FROM state_versions v WHERE v.id = p.version_id), p.detail
    FROM per_state p
    RETURNING id
)
INSERT INTO notify_deliveries (event_id, channel_id)
SELECT e.id, c.id FROM events e, channel c
"""


def replay_open_drift(conn: psycopg.Connection, channel_id: int) -> int:
    """drift.new of the open drift the channel's states have now, to that channel only (in the
    transaction that adds it); returns the events (one per state) created."""
    created = conn.execute(_REPLAY_OPEN_DRIFT, {"channel": channel_id}).rowcount
    if created:
        _hint["wrote"] = True
    return created


def list_channels(conn: psycopg.Connection) -> list[Channel]:
    return conn.cursor(row_factory=class_row(Channel)).execute(_LIST_CHANNELS).fetchall()


def get_channel(conn: psycopg.Connection, name: str) -> Channel:
    row = conn.cursor(row_factory=class_row(Channel)).execute(_GET_CHANNEL, (name,)).fetchone()
    if row is None:
        raise ChannelError(f"no notification channel named {name!r} (see `kl notify list`)")
    return row


def remove_channel(conn: psycopg.Connection, name: str) -> None:
    """The channel and its deliveries (pending ones are never sent)."""
    if conn.execute(_REMOVE_CHANNEL, (name,)).rowcount == 0:
        raise ChannelError(f"no notification channel named {name!r} (see `kl notify list`)")


# --- the outbox: drift events ------------------------------------------------------------------

# The records this version opened, updated or resolved (their ids: drift_records.record), against
# what was announced of them. Open drift is what current_resource_drift shows (ignore rules
# applied there, in one place): a record it hides is not announced, and neither is its end.
_DRIFT_EVENTS = """
WITH touched AS MATERIALIZED (
    SELECT d.id, d.address, d.deposed, d.kind, d.changed_attributes, d.baseline_resource_id,
           COALESCE(d.current_observed_id, d.current_resource_id) AS current_resource_id,
           d.resolved_version_id IS NOT NULL AS resolved, d.resolved_how,
           EXISTS (SELECT 1 FROM current_resource_drift c WHERE c.drift_id = d.id) AS visible,
           n.drift_id IS NOT NULL AS announced, n.kind AS announced_kind, n.paths AS announced_paths
    FROM drift_records d LEFT JOIN notify_drift_notices n ON n.drift_id = d.id
    WHERE d.id = ANY(%(ids)s::uuid[])
),
classified AS MATERIALIZED (
    SELECT t.*, CASE
        WHEN t.resolved THEN CASE WHEN t.announced THEN 'drift.resolved' END
        WHEN NOT t.visible THEN NULL
        WHEN NOT t.announced THEN 'drift.new'
        WHEN t.kind <> t.announced_kind OR NOT (COALESCE(t.changed_attributes, '{}') <@ t.announced_paths) THEN 'drift.updated'
    END AS event
    FROM touched t
),
forgotten AS (
    DELETE FROM notify_drift_notices n USING classified c WHERE n.drift_id = c.id AND c.resolved RETURNING 1
),
noted AS (
    INSERT INTO notify_drift_notices (drift_id, kind, paths)
    SELECT id, kind, COALESCE(changed_attributes, '{}') FROM classified WHERE event IN ('drift.new', 'drift.updated')
    ON CONFLICT (drift_id) DO UPDATE SET kind = EXCLUDED.kind,
        paths = ARRAY(SELECT DISTINCT p FROM unnest(notify_drift_notices.paths || EXCLUDED.paths) AS u(p) ORDER BY p)
    RETURNING 1
),
state AS (SELECT name FROM states WHERE id = %(sid)s),
matching AS (SELECT c.id, c.events FROM notify_channels c, state s WHERE s.name ~ c.states_regex),
events AS (
    INSERT INTO notify_events (kind, state_id, state_name, version_id, serial, detail)
    SELECT c.event, %(sid)s, s.name, %(vid)s, %(serial)s,
           jsonb_build_object('addresses', jsonb_agg(jsonb_build_object(
               'drift_id', c.id, 'address', c.address, 'deposed', c.deposed, 'kind', c.kind,
               'paths', COALESCE(to_jsonb(c.changed_attributes), '[]'::jsonb),
               'baseline', c.baseline_resource_id, 'current', c.current_resource_id, 'resolved_how', c.resolved_how)
               ORDER BY c.address, c.deposed))
    FROM classified c, state s
    WHERE c.event IS NOT NULL AND EXISTS (SELECT 1 FROM matching m WHERE c.event = ANY(m.events))
    GROUP BY c.event, s.name
    RETURNING id, kind
)
INSERT INTO notify_deliveries (event_id, channel_id)
SELECT e.id, m.id FROM events e JOIN matching m ON e.kind = ANY(m.events)
"""


def record_drift_events(conn: psycopg.Connection, sid: str, vid: str, serial: int, drift_ids: list[str]) -> int:
    """Derive this version's drift events from the records it touched (inside its transaction);
    returns the deliveries created."""
    if not drift_ids:
        return 0
    created = conn.execute(_DRIFT_EVENTS, {"ids": drift_ids, "sid": sid, "vid": vid, "serial": serial}).rowcount
    if created:
        _hint["wrote"] = True
    return created


# --- the outbox: refresh events ----------------------------------------------------------------

# A failure streak is the failed runs since the state's last successful one (cancelled runs are
# neither). A channel hears of it once per streak, when it reaches the channel's failed_after.
_RUN_EVENTS = """
WITH run AS (
    SELECT rr.id, rr.state_id, s.name, rr.error_summary, f.serial
    FROM refresh_runs rr JOIN states s ON s.id = rr.state_id JOIN state_versions f ON f.id = rr.from_version_id
    WHERE rr.id = %(run)s
),
last_ok AS (
    SELECT COALESCE(max(x.finished_at), '-infinity'::timestamptz) AS at
    FROM refresh_runs x, run WHERE x.state_id = run.state_id AND x.status = 'succeeded'
),
streak AS (
    SELECT count(*) AS n FROM refresh_runs x, run, last_ok
    WHERE x.state_id = run.state_id AND x.status = 'failed' AND x.finished_at > last_ok.at
),
kinds AS (SELECT k FROM unnest(%(kinds)s::text[]) AS u(k)),
matching AS (
    SELECT c.id, k.k AS kind FROM notify_channels c, run, kinds k, streak, last_ok
    WHERE run.name ~ c.states_regex AND k.k = ANY(c.events)
      AND (k.k <> 'refresh.failed' OR (streak.n >= c.failed_after AND NOT EXISTS (
          SELECT 1 FROM notify_deliveries d JOIN notify_events e ON e.id = d.event_id
          WHERE d.channel_id = c.id AND e.state_id = run.state_id AND e.kind = 'refresh.failed' AND e.created_at > last_ok.at)))
),
events AS (
    INSERT INTO notify_events (kind, state_id, state_name, serial, run_id, detail)
    SELECT k.k, run.state_id, run.name, run.serial, run.id,
           jsonb_build_object('error', run.error_summary, 'failures_in_a_row', streak.n)
    FROM kinds k, run, streak
    WHERE EXISTS (SELECT 1 FROM matching m WHERE m.kind = k.k)
    RETURNING id, kind
)
INSERT INTO notify_deliveries (event_id, channel_id)
SELECT e.id, m.id FROM events e JOIN matching m ON m.kind = e.kind
"""


def record_run_events(conn: psycopg.Connection, run_id: str, *, failed: bool, guarded: bool) -> int:
    """refresh.failed / refresh.guarded for a run just finished (inside the finish's transaction)."""
    kinds = (["refresh.failed"] if failed else []) + (["refresh.guarded"] if guarded else [])
    if not kinds:
        return 0
    created = conn.execute(_RUN_EVENTS, {"run": run_id, "kinds": kinds}).rowcount
    if created:
        _hint["wrote"] = True
    return created


# --- the outbox: resource.unmanaged ------------------------------------------------------------

# The objects a discovery run found unmanaged that the previous run of its scope did not (is_new).
# A run that used a state's provider config (--state) is heard by the channels whose glob matches
# that state; one that used the config for all states by every channel that asks for the event.
# The identities are copied into the event: they name objects, and hold no attribute values.
_DISCOVERY_EVENTS = """
WITH run AS (
    SELECT r.id, r.source, r.alias, r.type, r.state_id, s.name AS state_name
    FROM discovery_runs r LEFT JOIN states s ON s.id = r.state_id WHERE r.id = %(run)s
),
fresh AS (
    SELECT count(*) AS n,
           jsonb_agg(jsonb_build_object('identity', o.identity, 'display_name', o.display_name) ORDER BY o.position)
               FILTER (WHERE o.position IS NOT NULL) AS objects
    FROM (SELECT * FROM discovered_objects WHERE run_id = %(run)s AND is_new ORDER BY position LIMIT %(most)s) o
),
total AS (SELECT count(*) AS n FROM discovered_objects WHERE run_id = %(run)s AND is_new),
matching AS (
    SELECT c.id FROM notify_channels c, run
    WHERE 'resource.unmanaged' = ANY(c.events) AND (run.state_name IS NULL OR run.state_name ~ c.states_regex)
),
events AS (
    INSERT INTO notify_events (kind, state_id, state_name, discovery_run_id, detail)
    SELECT 'resource.unmanaged', run.state_id, run.state_name, run.id,
           jsonb_build_object('source', run.source, 'alias', NULLIF(run.alias, ''), 'type', run.type,
                              'new_unmanaged', total.n, 'objects', fresh.objects)
    FROM run, fresh, total
    WHERE total.n > 0 AND EXISTS (SELECT 1 FROM matching)
    RETURNING id
)
INSERT INTO notify_deliveries (event_id, channel_id)
SELECT e.id, m.id FROM events e, matching m
"""
# An event names at most this many objects (and says how many there were): a first discovery of a
# large account finds thousands, which no webhook wants in one body.
MAX_EVENT_OBJECTS = 100


def record_discovery_events(conn: psycopg.Connection, run_id: str) -> int:
    """resource.unmanaged for a discovery run just finished (inside the finish's transaction)."""
    created = conn.execute(_DISCOVERY_EVENTS, {"run": run_id, "most": MAX_EVENT_OBJECTS}).rowcount
    if created:
        _hint["wrote"] = True
    return created


# --- the outbox: refresh.stale ----------------------------------------------------------------

# Nothing commits staleness, so the pollers evaluate it: every kl process that opens the store
# and the notify sender threads (check_due). The first CTE is the gate: only channels asking for
# refresh.stale whose last evaluation is older than a tenth of their threshold (at most 30 s) take
# part, and they are stamped as evaluated now (so many processes polling cost one evaluation per
# period, and two at once queue on the channel row: the second finds it stamped and skips). With
# none due the statement reads one small table and stops (the EXISTS is a one-time filter), but
# planning it costs the server ~10 ms, on every kl command's path: check_due asks _STALE_DUE first
# (the same gate as a plain EXISTS, in the round trip that asks for due deliveries).
# A state is scheduled while an active schedule's glob matches it (the lowest-numbered such
# schedule is the one named). Never refreshed successfully: stale counts from when the state was
# created or that schedule was, whichever is later.
STALE_CHECK_MAX_PERIOD_S = 30.0
_STALE_EVENTS = """
WITH channels AS (
    UPDATE notify_channels SET stale_checked_at = now()
    WHERE stale_after_s IS NOT NULL AND 'refresh.stale' = ANY(events)
      AND (stale_checked_at IS NULL
           OR stale_checked_at <= now() - make_interval(secs => LEAST(stale_after_s / 10, %(max_period)s)))
    RETURNING id, states_regex, stale_after_s
),
scheduled AS MATERIALIZED (
    SELECT DISTINCT ON (s.id) s.id AS state_id, s.name, sc.id AS schedule_id, sc.states_glob, sc.every_s, sc.cron,
           GREATEST(s.created_at, sc.created_at) AS scheduled_at
    FROM states s JOIN fleet_schedules sc ON NOT sc.paused AND s.name ~ sc.states_regex
    WHERE EXISTS (SELECT 1 FROM channels)
    ORDER BY s.id, sc.id
),
last_ok AS MATERIALIZED (
    SELECT sd.*, (SELECT r.finished_at FROM refresh_runs r WHERE r.state_id = sd.state_id AND r.status = 'succeeded'
                  ORDER BY r.finished_at DESC LIMIT 1) AS last_ok_at
    FROM scheduled sd
),
stale AS MATERIALIZED (
    SELECT l.*, c.id AS channel_id, c.stale_after_s, COALESCE(l.last_ok_at, l.scheduled_at) AS since
    FROM last_ok l JOIN channels c ON l.name ~ c.states_regex
    WHERE COALESCE(l.last_ok_at, l.scheduled_at) + make_interval(secs => c.stale_after_s) < now()
),
noticed AS (
    INSERT INTO notify_stale_notices AS n (state_id, channel_id, last_ok_at)
    SELECT state_id, channel_id, COALESCE(last_ok_at, '-infinity') FROM stale
    ON CONFLICT (state_id, channel_id) DO UPDATE SET last_ok_at = EXCLUDED.last_ok_at, noticed_at = now()
        WHERE n.last_ok_at IS DISTINCT FROM EXCLUDED.last_ok_at
    RETURNING state_id, channel_id
),
fresh AS MATERIALIZED (
    SELECT gen_random_uuid() AS event_id, st.* FROM stale st JOIN noticed USING (state_id, channel_id)
),
events AS (
    INSERT INTO notify_events (id, kind, state_id, state_name, detail)
    SELECT f.event_id, 'refresh.stale', f.state_id, f.name, jsonb_build_object(
               'last_success_at', f.last_ok_at, 'stale_for_s', round(EXTRACT(EPOCH FROM now() - f.since)),
               'stale_after_s', f.stale_after_s,
               'schedule', jsonb_build_object('id', f.schedule_id, 'states', f.states_glob, 'every_s', f.every_s,
                                              'cron', f.cron))
    FROM fresh f
    RETURNING id
)
INSERT INTO notify_deliveries (event_id, channel_id)
SELECT f.event_id, f.channel_id FROM fresh f JOIN events e ON e.id = f.event_id
"""


def record_stale_events(conn: psycopg.Connection) -> int:
    """refresh.stale for every (scheduled state, channel) whose staleness streak was not announced
    yet; returns the deliveries created (they are due at once: the caller's check sees them)."""
    try:
        return conn.execute(_STALE_EVENTS, {"max_period": STALE_CHECK_MAX_PERIOD_S}).rowcount
    except (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientPrivilege):
        # A read-only replica or role can still run commands that read: another poller evaluates.
        return 0


# --- resource.duplicate -------------------------------------------------------------------------

# An object claimed by more than one open instance (store/inventory.DUPLICATES), announced once
# while it lasts (resource_duplicate_notices; its row goes when the duplicate ends, so one that
# comes back is new again), to every channel that asks for the event and whose glob matches a
# state of a claim. Evaluated by the pollers as staleness is: the channels asking for it are
# stamped, at most once a period, and only the process that stamped them evaluates (two at once
# queue on the channel rows). A channel added while a duplicate exists hears of it at the next
# evaluation only if no channel was told before.
DUPLICATE_CHECK_PERIOD_S = 60.0
_DUPLICATE_EVENTS = f"""
WITH channels AS (
    UPDATE notify_channels SET duplicates_checked_at = now()
    WHERE 'resource.duplicate' = ANY(events)
      AND (duplicates_checked_at IS NULL OR duplicates_checked_at <= now() - make_interval(secs => %(period)s))
    RETURNING id
),
dups AS MATERIALIZED (
    SELECT d.* FROM (SELECT 1 FROM channels LIMIT 1) due, LATERAL ({inventory.DUPLICATES}) d
),
ended AS (
    DELETE FROM resource_duplicate_notices n
    WHERE EXISTS (SELECT 1 FROM channels)
      AND NOT EXISTS (SELECT 1 FROM dups d WHERE (d.provider, d.type, d.confidence, d.key)
                                                 = (n.provider_source, n.type, n.confidence, n.key))
    RETURNING 1
),
noticed AS (
    INSERT INTO resource_duplicate_notices (provider_source, type, confidence, key)
    SELECT provider, type, confidence, key FROM dups
    ON CONFLICT DO NOTHING
    RETURNING provider_source, type, confidence, key
),
fresh AS MATERIALIZED (
    SELECT gen_random_uuid() AS event_id, d.* FROM dups d
    JOIN noticed n ON (n.provider_source, n.type, n.confidence, n.key) = (d.provider, d.type, d.confidence, d.key)
),
events AS (
    INSERT INTO notify_events (id, kind, state_id, state_name, detail)
    SELECT f.event_id, 'resource.duplicate', f.first_state_id::uuid, f.first_state,
           jsonb_build_object('confidence', f.confidence, 'evidence', f.evidence, 'provider', f.provider, 'type', f.type,
                              'key', f.key, 'claims', f.claims)
    FROM fresh f
    RETURNING id
)
INSERT INTO notify_deliveries (event_id, channel_id)
SELECT f.event_id, c.id FROM fresh f
JOIN events e ON e.id = f.event_id
JOIN notify_channels c ON 'resource.duplicate' = ANY(c.events)
 AND EXISTS (SELECT 1 FROM jsonb_array_elements(f.claims) cl WHERE cl ->> 'state' ~ c.states_regex)
"""


def record_duplicate_events(conn: psycopg.Connection) -> int:
    """resource.duplicate for every object claimed twice that was not announced yet, when a channel
    asks for it and its period has passed; returns the deliveries created."""
    try:
        with conn.transaction():
            conn.execute("SET LOCAL jit = off")  # as inventory.duplicates: planning estimates, not work
            return conn.execute(_DUPLICATE_EVENTS, {"period": DUPLICATE_CHECK_PERIOD_S, "state_ids": None}).rowcount
    except (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientPrivilege):
        return 0  # as record_stale_events
