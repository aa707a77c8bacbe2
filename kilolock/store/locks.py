"""State locks as Terraform's HTTP backend sees them (LockInfo JSON), shared with kl refresh."""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import psycopg

from kilolock.errors import KlError


class StateLocked(KlError):
    def __init__(self, name: str, holder: dict[str, Any]) -> None:
        who = holder.get("Who") or "someone"
        op = holder.get("Operation") or "an operation"
        since = holder.get("Created") or "?"
        super().__init__(f"state {name!r} is locked by {who} ({op}, lock {holder.get('ID')}, since {since})")
        self.holder = holder


@dataclass(frozen=True)
class Lock:
    lock_id: str
    info: dict[str, Any]


def lock_info(operation: str, who: str, version: str, info: str = "") -> dict[str, Any]:
    """A LockInfo as Terraform builds it (capitalised keys; Created in RFC 3339 with nanoseconds)."""
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"ID": str(uuid.uuid4()), "Operation": operation, "Info": info, "Who": who,
            "Version": version, "Created": created, "Path": ""}


def current(conn: psycopg.Connection, state_id: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT info FROM state_locks WHERE state_id = %s", (state_id,)).fetchone()
    return row[0] if row else None


def acquire(conn: psycopg.Connection, state_id: str, name: str, info: dict[str, Any], actor: str | None) -> None:
    """Take the lock or raise StateLocked with the holder's LockInfo; committed at once so that
    Terraform sees the holder while it is held."""
    with conn.transaction():
        row = conn.execute(
            """INSERT INTO state_locks (state_id, lock_id, operation, who, info) VALUES (%s, %s, %s, %s, %s)
               ON CONFLICT (state_id) DO NOTHING RETURNING lock_id""",
            (state_id, info["ID"], info.get("Operation"), info.get("Who"), json.dumps(info)),
        ).fetchone()
        if row is None:
            holder = current(conn, state_id) or {}
            raise StateLocked(name, holder)
        conn.execute(
            "INSERT INTO lock_events (state_id, event, lock_id, who, actor, info) VALUES (%s, 'lock', %s, %s, %s, %s)",
            (state_id, info["ID"], info.get("Who"), actor, json.dumps(info)),
        )


def release(conn: psycopg.Connection, state_id: str, lock_id: str, actor: str | None) -> bool:
    """Release our own lock; False if it was no longer ours (force-unlocked meanwhile)."""
    with conn.transaction():
        row = conn.execute(
            "DELETE FROM state_locks WHERE state_id = %s AND lock_id = %s RETURNING who, info", (state_id, lock_id)
        ).fetchone()
        if row is None:
            return False
        conn.execute(
            "INSERT INTO lock_events (state_id, event, lock_id, who, actor, info) VALUES (%s, 'unlock', %s, %s, %s, %s)",
            (state_id, lock_id, row[0], actor, json.dumps(row[1])),
        )
    return True


def force_release(conn: psycopg.Connection, state_id: str, actor: str | None, *, only_info: str | None = None) -> dict[str, Any] | None:
    """Release whatever lock is held, for someone other than its holder (force-unlock, or a dead
    run's lock); ``only_info`` releases it only if its LockInfo ``Info`` is that. The released LockInfo."""
    with conn.transaction():
        row = conn.execute(
            "DELETE FROM state_locks WHERE state_id = %s AND (%s::text IS NULL OR info ->> 'Info' = %s) RETURNING lock_id, who, info",
            (state_id, only_info, only_info),
        ).fetchone()
        if row is None:
            return None
        conn.execute(
            "INSERT INTO lock_events (state_id, event, lock_id, who, actor, info) VALUES (%s, 'force_unlock', %s, %s, %s, %s)",
            (state_id, row[0], row[1], actor, json.dumps(row[2])),
        )
    return dict(row[2])
