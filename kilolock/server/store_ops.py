"""The backend's reads and writes on the store, each one transaction.

Writes and lock changes on a state are serialised on its ``states`` row (SELECT … FOR UPDATE), so
"is it locked, and by whom" and the write that depends on the answer cannot interleave with a LOCK.
Versions go through kilolock.store.versions.write_version (the one write path); only
OpenTofu-encrypted envelopes, which have no serial, lineage or resources to index, are stored here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from kilolock import tfstate
from kilolock.errors import KlError
from kilolock.store import locks, versions


class LockConflict(KlError):
    """Someone else holds the lock; ``holder`` is their LockInfo (what Terraform prints)."""

    def __init__(self, message: str, holder: dict[str, Any]) -> None:
        super().__init__(message)
        self.holder = holder


class LockNotHeld(KlError):
    """A write carried ``?ID=`` for a lock that is no longer held (force-unlocked meanwhile)."""


@dataclass(frozen=True)
class Current:
    text: str
    serial: int
    encrypted: bool


@dataclass(frozen=True)
class Written:
    serial: int
    created: bool  # False: a byte-identical retry of the current version
    encrypted: bool


def _lock_state_row(conn: psycopg.Connection, name: str, create: bool) -> str | None:
    if create:
        conn.execute("INSERT INTO states (name) VALUES (%s) ON CONFLICT (name) DO NOTHING", (name,))
    row = conn.execute("SELECT id FROM states WHERE name = %s FOR UPDATE", (name,)).fetchone()
    return str(row[0]) if row else None


def read_current(conn: psycopg.Connection, name: str) -> Current | None:
    row = conn.execute(
        """SELECT v.raw_state::text, v.serial, v.encrypted FROM states s
           JOIN state_versions v ON v.state_id = s.id WHERE s.name = %s ORDER BY v.serial DESC LIMIT 1""",
        (name,),
    ).fetchone()
    return Current(row[0], int(row[1]), bool(row[2])) if row else None


def _check_lock(conn: psycopg.Connection, name: str, sid: str, lock_id: str | None) -> None:
    holder = locks.current(conn, sid)
    if holder is not None and holder.get("ID") != lock_id:
        who = holder.get("Who") or "someone"
        if lock_id:
            raise LockConflict(f"state {name!r} is locked by {who} with lock {holder.get('ID')}, not {lock_id}", holder)
        raise LockConflict(f"state {name!r} is locked by {who} (lock {holder.get('ID')}); send ?ID=<lock id>", holder)
    if holder is None and lock_id:
        raise LockNotHeld(f"lock {lock_id} on state {name!r} is not held (it was released or force-unlocked); nothing written")


def _is_empty(conn: psycopg.Connection, sid: str) -> bool:
    """No version, or a current version without resources (or one kl cannot see into)."""
    row = conn.execute(
        """SELECT v.encrypted, EXISTS (SELECT 1 FROM resources r WHERE r.state_id = v.state_id AND r.delete_serial IS NULL)
           FROM state_versions v WHERE v.state_id = %s ORDER BY v.serial DESC LIMIT 1""",
        (sid,),
    ).fetchone()
    return row is None or bool(row[0]) or not row[1]


def write_state(conn: psycopg.Connection, name: str, raw: bytes, lock_id: str | None, actor: str) -> Written:
    doc = tfstate.load_json(raw, origin="request body")
    encrypted = tfstate.is_encrypted_envelope(doc)
    state = None if encrypted else tfstate.parse_state(doc, origin="request body")
    with conn.transaction():
        sid = _lock_state_row(conn, name, create=True)
        assert sid is not None
        _check_lock(conn, name, sid, lock_id)
        if encrypted:
            return _write_encrypted(conn, sid, raw, actor)
        assert state is not None
        result = versions.write_version(conn, name, state, raw, source="apply", actor=actor, force=_is_empty(conn, sid))
    return Written(result.version.serial, result.created, encrypted=False)


def _write_encrypted(conn: psycopg.Connection, sid: str, raw: bytes, actor: str) -> Written:
    # The envelope hides serial and lineage: kl numbers it after the current version and keeps the
    # lineage it knew, so the serial order of versions stays the order of writes.
    digest = versions.content_hash(raw)
    cur = conn.execute(
        "SELECT serial, lineage, content_hash FROM state_versions WHERE state_id = %s ORDER BY serial DESC LIMIT 1", (sid,)
    ).fetchone()
    if cur is not None and cur[2] == digest:
        return Written(int(cur[0]), created=False, encrypted=True)
    serial = int(cur[0]) + 1 if cur else 1
    try:
        conn.execute(
            """INSERT INTO state_versions (state_id, serial, lineage, source, raw_state, content_hash, actor, encrypted)
               VALUES (%s, %s, %s, 'apply', %s::jsonb, %s, %s, true)""",
            (sid, serial, cur[1] if cur else "", raw.decode("utf-8"), digest, actor),
        )
    except psycopg.errors.DataError as exc:
        raise tfstate.StateError(f"request body: PostgreSQL cannot store it as JSON: {str(exc).strip().splitlines()[0]}") from None
    return Written(serial, created=True, encrypted=True)


def delete_state(conn: psycopg.Connection, name: str, lock_id: str | None) -> bool:
    """Remove a state and its history; False when there was none."""
    with conn.transaction():
        sid = _lock_state_row(conn, name, create=False)
        if sid is None:
            return False
        holder = locks.current(conn, sid)
        if holder is not None and holder.get("ID") != lock_id:
            raise LockConflict(f"state {name!r} is locked by {holder.get('Who') or 'someone'}; not deleted", holder)
        conn.execute("DELETE FROM states WHERE id = %s", (sid,))
    return True


def lock(conn: psycopg.Connection, name: str, info: dict[str, Any], actor: str) -> None:
    """Take the lock; a retry by the holder (same ID) succeeds again. LockConflict otherwise."""
    with conn.transaction():
        sid = _lock_state_row(conn, name, create=True)
        assert sid is not None
        holder = locks.current(conn, sid)
        if holder is not None:
            if holder.get("ID") == info["ID"]:
                return
            raise LockConflict(f"state {name!r} is locked by {holder.get('Who') or 'someone'}", holder)
        locks.acquire(conn, sid, name, info, actor)


def unlock(conn: psycopg.Connection, name: str, lock_id: str, actor: str, forced: bool) -> None:
    """Release the lock ``lock_id``; unlocking an unlocked state is a no-op (retries happen).
    ``forced`` records the event as a force-unlock (OpenTofu's force-unlock sends only the ID)."""
    with conn.transaction():
        sid = _lock_state_row(conn, name, create=False)
        if sid is None:
            return
        holder = locks.current(conn, sid)
        if holder is None:
            return
        if holder.get("ID") != lock_id:
            raise LockConflict(f"state {name!r} is locked by {holder.get('Who') or 'someone'} with another lock ID", holder)
        if forced:
            locks.force_release(conn, sid, actor)
        else:
            locks.release(conn, sid, lock_id, actor)


def force_unlock(conn: psycopg.Connection, name: str, actor: str) -> dict[str, Any] | None:
    """Release whatever lock is held (Terraform's force-unlock sends no ID); the released LockInfo."""
    with conn.transaction():
        sid = _lock_state_row(conn, name, create=False)
        return locks.force_release(conn, sid, actor) if sid else None
