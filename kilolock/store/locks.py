"""State locks as Terraform's HTTP backend sees them (LockInfo JSON), shared with kl refresh."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kilolock.errors import KlError


class StateLocked(KlError):
    """Someone else holds the state's lock; ``holder`` is their LockInfo (what Terraform prints,
    and the body of the backend's 423). ``hint`` says what the refused request should have done."""

    def __init__(self, name: str, holder: dict[str, Any], hint: str | None = None) -> None:
        who = holder.get("Who") or "someone"
        op = holder.get("Operation") or "an operation"
        since = holder.get("Created") or "?"
        message = f"state {name!r} is locked by {who} ({op}, lock {holder.get('ID')}, since {since})"
        super().__init__(f"{message}; {hint}" if hint else message)
        self.name = name
        self.holder = holder


@dataclass(frozen=True)
class Lock:
    """A state lock held: its ID and LockInfo."""

    lock_id: str
    info: dict[str, Any]


def random_uuid() -> str:
    """A random (version 4) UUID as text, as str(uuid.uuid4()) makes it. Not through the uuid
    module: on Linux it imports platform, ~3 ms of every kl refresh, which takes a lock."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def lock_info(operation: str, who: str, version: str, info: str = "") -> dict[str, Any]:
    """A LockInfo as Terraform builds it (capitalised keys; Created in RFC 3339 with nanoseconds)."""
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"ID": random_uuid(), "Operation": operation, "Info": info, "Who": who,
            "Version": version, "Created": created, "Path": ""}


_HOLDER = "SELECT info FROM state_locks WHERE state_id = %s"
_HELD = "SELECT s.name, l.info FROM state_locks l JOIN states s ON s.id = l.state_id"
_INSERT_LOCK = """
INSERT INTO state_locks (state_id, lock_id, operation, who, info, principal) VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (state_id) DO NOTHING RETURNING lock_id
"""
_DELETE_OWN_LOCK = "DELETE FROM state_locks WHERE state_id = %s AND lock_id = %s RETURNING lock_id, who, info"
_DELETE_ANY_LOCK = """
DELETE FROM state_locks WHERE state_id = %s AND (%s::text IS NULL OR info ->> 'Info' = %s)
RETURNING lock_id, who, info
"""
_EVENT = "INSERT INTO lock_events (state_id, event, lock_id, who, actor, info) VALUES (%s, %s, %s, %s, %s, %s)"


def current(conn: psycopg.Connection, state_id: str) -> dict[str, Any] | None:
    row = conn.execute(_HOLDER, (state_id,)).fetchone()
    return row[0] if row else None


def may_change_objects(holder: dict[str, Any] | None) -> bool:
    """Whether the holder of a state's lock (its LockInfo, None: unlocked) may be changing the
    state's objects: anything but a plan, which only reads them."""
    return holder is not None and holder.get("Operation") != "OperationTypePlan"


def holder_principal(conn: psycopg.Connection, state_id: str) -> str | None:
    """The principal that took the state's current lock through kl serve (None: none, or not kl serve)."""
    row = conn.execute("SELECT principal FROM state_locks WHERE state_id = %s", (state_id,)).fetchone()
    return row[0] if row else None


def held(conn: psycopg.Connection) -> dict[str, dict[str, Any]]:
    """The LockInfo of every locked state, by state name."""
    return {r["name"]: r["info"] for r in conn.cursor(row_factory=dict_row).execute(_HELD).fetchall()}


def acquire(conn: psycopg.Connection, state_id: str, name: str, info: dict[str, Any], actor: str | None,
            principal: str | None = None) -> None:
    """Take the lock or raise StateLocked with the holder's LockInfo; committed at once so that
    Terraform sees the holder while it is held. ``principal``: who took it through kl serve
    (``user:NAME``, ``token:NAME``), so that a read-only principal may release its own lock only."""
    with conn.transaction():
        row = conn.execute(
            _INSERT_LOCK, (state_id, info["ID"], info.get("Operation"), info.get("Who"), json.dumps(info), principal)
        ).fetchone()
        if row is None:
            raise StateLocked(name, current(conn, state_id) or {})
        conn.execute(_EVENT, (state_id, "lock", info["ID"], info.get("Who"), actor, json.dumps(info)))


def release(conn: psycopg.Connection, state_id: str, lock_id: str, actor: str | None) -> bool:
    """Release our own lock; False if it was no longer ours (force-unlocked meanwhile)."""
    with conn.transaction():
        row = conn.cursor(row_factory=dict_row).execute(_DELETE_OWN_LOCK, (state_id, lock_id)).fetchone()
        if row is None:
            return False
        conn.execute(_EVENT, (state_id, "unlock", lock_id, row["who"], actor, json.dumps(row["info"])))
    return True


def force_release(conn: psycopg.Connection, state_id: str, actor: str | None, *, only_info: str | None = None) -> dict[str, Any] | None:
    """Release whatever lock is held, for someone other than its holder (force-unlock, or a dead
    run's lock); ``only_info`` releases it only if its LockInfo ``Info`` is that. The released LockInfo."""
    with conn.transaction():
        row = conn.cursor(row_factory=dict_row).execute(_DELETE_ANY_LOCK, (state_id, only_info, only_info)).fetchone()
        if row is None:
            return None
        conn.execute(_EVENT, (state_id, "force_unlock", row["lock_id"], row["who"], actor, json.dumps(row["info"])))
    return dict(row["info"])


_DELETE_BY_ID = "DELETE FROM state_locks WHERE state_id = %s AND lock_id = %s RETURNING lock_id, who, info"


def unlock_by_id(conn: psycopg.Connection, state_id: str, name: str, lock_id: str, actor: str | None) -> dict[str, Any] | None:
    """``kl state unlock``: release the lock only if its ID is LOCK_ID (the ID is the confirmation,
    as in ``terraform force-unlock``), recorded as a force_unlock event. The released LockInfo;
    None when the state is not locked; StateLocked when another lock holds it."""
    with conn.transaction():
        row = conn.cursor(row_factory=dict_row).execute(_DELETE_BY_ID, (state_id, lock_id)).fetchone()
        if row is None:
            holder = current(conn, state_id)
            if holder is None:
                return None
            raise StateLocked(name, holder, f"its lock ID is not {lock_id}; nothing unlocked")
        conn.execute(_EVENT, (state_id, "force_unlock", row["lock_id"], row["who"], actor, json.dumps(row["info"])))
    return dict(row["info"])
