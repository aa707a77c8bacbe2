"""Removing and renaming a state (``kl state rm``, ``kl state mv``): what is the state's own, and
what names it by glob.

A state's own rows are keyed by its id (versions, lifecycles, pieces, lock and lock events, refresh
runs, drift records, settings, per-state provider configs, fleet jobs, notification events): the
schema's foreign keys cascade them all from the ``states`` row, so deleting that row deletes them in
the same statement (states.delete_state), and a rename changes the name alone while they follow
the id. Grants, ignore rules, notify channels and schedules name states by glob: they belong to no
one state, so both leave them as they are, and list them for the user to decide.
"""
from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.rows import class_row

from kilolock.errors import KlError
from kilolock.store import errors, locks, states


class StateExists(KlError):
    def __init__(self, name: str) -> None:
        super().__init__(f"a state named {name!r} exists already; nothing renamed (`kl state rm {name}` first, "
                         "if it is the one to go)")
        self.name = name


@dataclass(frozen=True)
class Owned:
    """How many rows of each kind a state has of its own (what deleting it deletes)."""

    versions: int
    lifecycles: int
    refresh_runs: int
    drift_records: int
    lock_events: int
    settings: int
    provider_configs: int
    fleet_jobs: int  # queued or running: a finished job is history of its runs
    notify_events: int


_OWNED = """
SELECT (SELECT count(*) FROM state_versions WHERE state_id = %(sid)s) AS versions,
       (SELECT count(*) FROM resources WHERE state_id = %(sid)s) AS lifecycles,
       (SELECT count(*) FROM refresh_runs WHERE state_id = %(sid)s) AS refresh_runs,
       (SELECT count(*) FROM drift_records WHERE state_id = %(sid)s) AS drift_records,
       (SELECT count(*) FROM lock_events WHERE state_id = %(sid)s) AS lock_events,
       (SELECT count(*) FROM state_settings WHERE state_id = %(sid)s) AS settings,
       (SELECT count(*) FROM provider_configs WHERE state_id = %(sid)s) AS provider_configs,
       (SELECT count(*) FROM fleet_jobs WHERE state_id = %(sid)s AND status IN ('queued', 'running')) AS fleet_jobs,
       (SELECT count(*) FROM notify_events WHERE state_id = %(sid)s) AS notify_events
"""


def owned(conn: psycopg.Connection, sid: str) -> Owned:
    row = conn.cursor(row_factory=class_row(Owned)).execute(_OWNED, {"sid": sid}).fetchone()
    assert row is not None  # an aggregate row
    return row


@dataclass(frozen=True)
class GlobUse:
    """A stored object that names states by glob: a grant, an ignore rule, a notify channel or a schedule."""

    kind: str  # grant | ignore rule | notify channel | schedule
    key: str  # how it is named to remove it: the grant's principal, the rule's or schedule's id, the channel's name
    detail: str | None  # the grant's role, the rule's address glob
    states_glob: str
    matches: bool  # matches the name asked about
    matches_other: bool  # matches the other name (a rename's new name); False without one


# Matched as the store matches them everywhere: the name against the stored regex of the glob.
_GLOB_USES = """
SELECT kind, key, detail, states_glob, matches, matches_other FROM (
    SELECT 1 AS o, id, 'grant' AS kind, principal AS key, role AS detail, states_glob,
           %(name)s ~ states_regex AS matches, COALESCE(%(other)s ~ states_regex, false) AS matches_other
    FROM access_grants
    UNION ALL
    SELECT 2, id, 'ignore rule', id::text, address_glob, states_glob,
           %(name)s ~ states_regex, COALESCE(%(other)s ~ states_regex, false)
    FROM drift_ignore_rules
    UNION ALL
    SELECT 3, id, 'notify channel', name, NULL, states_glob,
           %(name)s ~ states_regex, COALESCE(%(other)s ~ states_regex, false)
    FROM notify_channels
    UNION ALL
    SELECT 4, id, 'schedule', id::text, NULL, states_glob,
           %(name)s ~ states_regex, COALESCE(%(other)s ~ states_regex, false)
    FROM fleet_schedules
) u
WHERE matches OR matches_other
ORDER BY o, id
"""


def glob_uses(conn: psycopg.Connection, name: str, other: str | None = None) -> list[GlobUse]:
    """The grants, ignore rules, channels and schedules whose glob matches NAME or OTHER."""
    return conn.cursor(row_factory=class_row(GlobUse)).execute(_GLOB_USES, {"name": name, "other": other}).fetchall()


_EXISTS = "SELECT EXISTS (SELECT 1 FROM states WHERE name = %s)"
_RENAME = "UPDATE states SET name = %s WHERE id = %s"


def exists(conn: psycopg.Connection, name: str) -> bool:
    row = conn.execute(_EXISTS, (name,)).fetchone()
    return bool(row and row[0])


def rename(conn: psycopg.Connection, old: str, new: str) -> str:
    """Rename state OLD to NEW in one transaction, under OLD's row lock (states.lock_state_row: no
    write or lock change interleaves); its id, which everything of its own follows. StateNotFound,
    StateLocked (someone holds its lock) or StateExists: nothing changed."""
    try:
        with conn.transaction():
            sid = states.lock_state_row(conn, old, create=False)
            if sid is None:
                raise errors.StateNotFound(old)
            holder = locks.current(conn, sid)
            if holder is not None:
                raise locks.StateLocked(old, holder, "not renamed")
            if exists(conn, new):
                raise StateExists(new)
            conn.execute(_RENAME, (new, sid))
    except psycopg.errors.UniqueViolation:
        # created meanwhile (a first write through kl serve takes no lock that this one waits on)
        raise StateExists(new) from None
    return sid
