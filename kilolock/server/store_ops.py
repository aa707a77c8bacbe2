"""What the backend's requests do to the store, each one transaction.

Writes and lock changes on a state are serialised on its ``states`` row
(states.lock_state_row), so "is it locked, and by whom" and the write that depends on the answer
cannot interleave with a LOCK. Versions, plain and OpenTofu-encrypted, go through
kilolock.store.writes (store_document, store_envelope). No SQL here: that lives in kilolock.store.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from kilolock import tfstate
from kilolock.errors import KlError
from kilolock.store import errors, history, locks, settings, states, versions, writes
from kilolock.store.locks import StateLocked

log = logging.getLogger("kilolock.server.store_ops")


class LockNotHeld(KlError):
    """A write carried ``?ID=`` for a lock that is no longer held (force-unlocked meanwhile)."""


@dataclass(frozen=True)
class Current:
    text: str
    serial: int
    encrypted: bool
    content_hash: str  # of the bytes that were written


@dataclass(frozen=True)
class Written:
    serial: int
    created: bool  # False: a byte-identical retry of the current version
    encrypted: bool


def read_current(conn: psycopg.Connection, name: str) -> Current | None:
    found = versions.current_text(conn, name)
    if found is None:
        return None
    version, text = found
    return Current(text, version.serial, version.encrypted, version.content_hash)


def _check_lock(conn: psycopg.Connection, name: str, sid: str, lock_id: str | None) -> None:
    holder = locks.current(conn, sid)
    if holder is not None and holder.get("ID") != lock_id:
        raise StateLocked(name, holder, f"this write carried lock {lock_id}" if lock_id else "send ?ID=<lock id>")
    if holder is None and lock_id:
        raise LockNotHeld(f"lock {lock_id} on state {name!r} is not held (it was released or force-unlocked); nothing written")


def _is_empty(conn: psycopg.Connection, sid: str) -> bool:
    """No version, or a current version without resources. An encrypted one kl could not index
    hides its resources: it counts as empty only when kl does not know its lineage either (an
    envelope without one)."""
    cur = versions.current_version(conn, sid)
    if cur is None:
        return True
    if cur.encrypted and cur.unindexed:
        return not cur.lineage
    return not versions.has_open_resources(conn, sid)


def decrypted_index(conn: psycopg.Connection, name: str, doc: dict[str, Any],
                    origin: str) -> writes.DecryptedIndex | None:
    """What kl indexes of envelope DOC, decrypted with state NAME's stored encryption configuration
    (None when it has none); a KlError, one line that names no secret, when it cannot."""
    stored = settings.of_state(conn, name)
    if stored.encryption is None:
        return None
    from kilolock import encryption

    keys = encryption.keys_for(stored.encryption, bool(stored.store_decrypted_attributes), f"state {name!r}")
    opened = encryption.open_envelope(doc, keys, origin, functools.partial(history.cached_schemas, conn))
    return writes.DecryptedIndex(opened.index, opened.index_text, masked=not keys.store_decrypted_attributes)


def write_state(conn: psycopg.Connection, name: str, raw: bytes, lock_id: str | None, actor: str) -> Written:
    doc = tfstate.load_json(raw, origin="request body")
    encrypted = tfstate.is_encrypted_envelope(doc)
    envelope = tfstate.envelope_ids(doc, origin="request body") if encrypted else None
    state = None if encrypted else tfstate.parse_state(doc, origin="request body")
    index, unindexed = None, None
    if encrypted:
        # OpenTofu keeps sending what it encrypted whatever kl can read of it: a key kl lacks, or
        # one rotated without kl being told, never refuses the write. The version is stored as
        # sent; its status, and this warning, say why kl has no index of it.
        try:
            index = decrypted_index(conn, name, doc, f"state {name!r}")
        except KlError as exc:
            unindexed = str(exc)
            log.warning("%s; stored as sent, not indexed", unindexed)
        if index is not None and envelope is None:
            envelope = tfstate.EnvelopeIds(index.state.serial, index.state.lineage)
    with conn.transaction():
        sid = states.lock_state_row(conn, name, create=True)
        assert sid is not None
        _check_lock(conn, name, sid, lock_id)
        if state is None:
            result = writes.store_envelope(conn, name, raw, envelope, source="apply", actor=actor, origin="request body",
                                           force=_is_empty(conn, sid), index=index, unindexed=unindexed)
        else:
            result = writes.store_document(conn, name, state, raw, source="apply", actor=actor, force=_is_empty(conn, sid))
    return Written(result.version.serial, result.created, encrypted=encrypted)


def delete_state(conn: psycopg.Connection, name: str, lock_id: str | None) -> bool:
    """Remove a state and its history; False when there was none."""
    with conn.transaction():
        sid = states.lock_state_row(conn, name, create=False)
        if sid is None:
            return False
        holder = locks.current(conn, sid)
        if holder is not None and holder.get("ID") != lock_id:
            raise StateLocked(name, holder, "not deleted")
        states.delete_state(conn, sid)
    return True


def lock_holder(conn: psycopg.Connection, name: str) -> tuple[bool, str | None]:
    """Whether the state is locked, and the principal that took the lock through kl serve (None
    for a lock kl refresh or an older kl serve took)."""
    try:
        sid = states.state_id(conn, name)
    except errors.StateNotFound:
        return False, None
    if locks.current(conn, sid) is None:
        return False, None
    return True, locks.holder_principal(conn, sid)


def lock(conn: psycopg.Connection, name: str, info: dict[str, Any], actor: str, principal: str | None = None) -> None:
    """Take the lock; a retry by the holder (same ID) succeeds again. StateLocked otherwise."""
    with conn.transaction():
        sid = states.lock_state_row(conn, name, create=True)
        assert sid is not None
        holder = locks.current(conn, sid)
        if holder is not None:
            if holder.get("ID") == info["ID"]:
                return
            raise StateLocked(name, holder)
        locks.acquire(conn, sid, name, info, actor, principal)


def unlock(conn: psycopg.Connection, name: str, lock_id: str, actor: str, forced: bool) -> None:
    """Release the lock ``lock_id``; unlocking an unlocked state is a no-op (retries happen).
    ``forced`` records the event as a force-unlock (OpenTofu's force-unlock sends only the ID)."""
    with conn.transaction():
        sid = states.lock_state_row(conn, name, create=False)
        if sid is None:
            return
        holder = locks.current(conn, sid)
        if holder is None:
            return
        if holder.get("ID") != lock_id:
            raise StateLocked(name, holder, f"the unlock carried another lock ID ({lock_id})")
        if forced:
            locks.force_release(conn, sid, actor)
        else:
            locks.release(conn, sid, lock_id, actor)


def force_unlock(conn: psycopg.Connection, name: str, actor: str) -> dict[str, Any] | None:
    """Release whatever lock is held (Terraform's force-unlock sends no ID); the released LockInfo."""
    with conn.transaction():
        sid = states.lock_state_row(conn, name, create=False)
        return locks.force_release(conn, sid, actor) if sid else None
