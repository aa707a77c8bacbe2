"""What each request of Terraform's ``backend "http"`` means, as status codes and bodies.

Facts this follows (see the http-backend reference): GET 204 = no state; writes accept 200; DELETE,
LOCK and UNLOCK only 200; a lock conflict is 423 with the holder's LockInfo as the body, whose
non-empty ``ID`` is what makes ``-lock-timeout`` wait and retry.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import psycopg

from kilolock import jsondoc, tfstate
from kilolock.server import store_ops
from kilolock.server.auth import Principal
from kilolock.store.errors import VersionConflict
from kilolock.store.locks import StateLocked


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)


def text(status: int, message: str, **headers: str) -> Response:
    return Response(status, (message + "\n").encode(), headers=dict(headers))


def _json_default(v: Any) -> Any:
    return v.isoformat() if isinstance(v, datetime) else str(v)


def json_body(status: int, obj: Any) -> Response:
    return Response(status, (json.dumps(obj, default=_json_default) + "\n").encode(), "application/json")


def _content_md5(body: bytes) -> str:
    return base64.b64encode(hashlib.md5(body).digest()).decode()


def _holder(exc: StateLocked) -> Response:
    return json_body(423, exc.holder)


def check_content_md5(header: str | None, body: bytes) -> Response | None:
    """None when the body matches the header (or there is none); otherwise the 400 to send."""
    if header is None:
        return None
    try:
        sent = base64.b64decode(header.strip(), validate=True)
    except binascii.Error:
        return text(400, "Content-MD5 header is not base64")
    if len(sent) != 16:
        return text(400, f"Content-MD5 header decodes to {len(sent)} bytes, expected 16")
    if sent != hashlib.md5(body).digest():
        return text(400, "Content-MD5 does not match the body (corrupted in transit?); nothing written")
    return None


@dataclass(frozen=True)
class BackendPolicy:
    # Terraform's `force-unlock` sends UNLOCK with no body, so no lock ID can be checked: allowed
    # only when the operator opts in, or for an admin credential.
    allow_empty_force_unlock: bool = False


def get_state(conn: psycopg.Connection, name: str) -> Response:
    cur = store_ops.read_current(conn, name)
    if cur is None:
        return Response(204)
    # jsonb does not keep Terraform's key order or layout; the plain state is laid out again as
    # Terraform writes it, so `terraform state pull` matches `kl state pull` byte for byte. An
    # encrypted envelope is laid out as OpenTofu writes it when that gives back what was POSTed.
    if cur.encrypted:
        body = (tfstate.envelope_as_written(cur.text, cur.content_hash) or cur.text + "\n").encode()
    else:
        body = tfstate.pretty_state(cur.text).encode()
    return Response(200, body, "application/json", {"Content-MD5": _content_md5(body)})


def put_state(conn: psycopg.Connection, name: str, body: bytes, lock_id: str | None, principal: Principal,
              content_md5: str | None) -> Response:
    bad = check_content_md5(content_md5, body)
    if bad is not None:
        return bad
    try:
        written = store_ops.write_state(conn, name, body, lock_id, principal.name)
    except StateLocked as exc:
        return _holder(exc)
    except (store_ops.LockNotHeld, VersionConflict) as exc:
        return text(409, str(exc))
    except tfstate.StateError as exc:
        return text(400, str(exc))
    what = "encrypted version" if written.encrypted else "version"
    if not written.created:
        return text(200, f"{name}: serial {written.serial} is already the current {what} (identical); nothing written")
    return text(200, f"{name}: stored {what} serial {written.serial}")


def delete_state(conn: psycopg.Connection, name: str, lock_id: str | None) -> Response:
    try:
        gone = store_ops.delete_state(conn, name, lock_id)
    except StateLocked as exc:
        return _holder(exc)
    # 200 either way: the client accepts only 200, and a retried DELETE must not fail.
    return text(200, f"{name}: deleted" if gone else f"{name}: no such state; nothing to delete")


def parse_lock_info(body: bytes) -> dict[str, Any] | str:
    """The LockInfo, or a one-line reason why the body is not one."""
    try:
        doc = jsondoc.load(body)
    except jsondoc.NotStorable as exc:
        return f"lock info: {exc}"
    if not isinstance(doc, dict):
        return "lock info must be a JSON object"
    lock_id = doc.get("ID")
    if not isinstance(lock_id, str) or not lock_id.strip():
        return 'lock info has no "ID" (a non-empty string)'
    if len(lock_id) > 200 or any(ord(c) < 0x20 for c in lock_id):
        return 'lock info "ID" is too long or contains control characters'
    for key in ("Operation", "Info", "Who", "Version", "Created", "Path"):
        if key in doc and not isinstance(doc[key], str):
            return f'lock info "{key}" must be a string'
    return doc


def lock_refused(reason: str, info: dict[str, Any] | str) -> Response:
    """A LOCK the principal may not take, answered so that Terraform prints why. Of a 403 Terraform
    and OpenTofu print only "HTTP remote state endpoint invalid auth"; of a 409 (or 423)
    they print the ``ID`` of the LockInfo in the body ("HTTP remote state already locked: ID=..."),
    so the ID carries the reason and says that nothing is locked. 409, not the 423 of a lock held by
    someone, keeps the two apart in logs and metrics; the clients treat both alike."""
    asked = info if isinstance(info, dict) else {}
    # Every field as Go's LockInfo decodes it (Created in RFC 3339): a body it cannot decode is
    # printed as "failed to unmarshal body", without the reason.
    return json_body(409, {"ID": f"none, the state is not locked: {reason}", "Operation": asked.get("Operation", ""),
                           "Info": reason, "Who": "kl serve", "Version": "",
                           "Created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "Path": ""})


def lock_state(conn: psycopg.Connection, name: str, body: bytes, principal: Principal) -> Response:
    info = parse_lock_info(body)
    if isinstance(info, str):
        return text(400, info)
    try:
        store_ops.lock(conn, name, info, principal.name, principal.id)
    except StateLocked as exc:
        return _holder(exc)
    return json_body(200, info)


def unlock_state(conn: psycopg.Connection, name: str, body: bytes, principal: Principal) -> Response:
    """UNLOCK; whether the principal may (its own lock, another's, a force-unlock) is the caller's
    check (kilolock.server.access)."""
    if not body.strip():
        released = store_ops.force_unlock(conn, name, principal.name)
        return text(200, f"{name}: force-unlocked lock {released['ID']}" if released else f"{name}: was not locked")
    info = parse_lock_info(body)
    if isinstance(info, str):
        return text(400, info)
    # OpenTofu's force-unlock sends a LockInfo holding only the ID; a normal unlock sends the
    # whole LockInfo it locked with. The ID is checked either way; the audit says which it was.
    forced = not info.get("Who") and not info.get("Operation")
    try:
        store_ops.unlock(conn, name, info["ID"], principal.name, forced)
    except StateLocked as exc:
        return _holder(exc)
    return text(200, f"{name}: unlocked")
