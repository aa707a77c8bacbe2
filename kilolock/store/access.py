"""Tokens, grants and the access audit (migration 0015): what ``kl token``, ``kl access`` and
``kl serve``'s per-state checks read and write.

A token is found by the SHA-256 of its secret (an index lookup of a hash, so its timing says
nothing about the secret), and only a usable one (not revoked, not expired) is returned: a revoked
or expired token costs the same lookup as an unknown one. Every grant and token change writes its
audit row in the same transaction.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

import psycopg
from psycopg.rows import class_row, dict_row

from kilolock import globs
from kilolock.errors import KlError

ROLES = ("read", "write", "admin")


class AccessError(KlError):
    pass


@dataclass(frozen=True)
class StoredGrant:
    id: int
    principal: str
    role: str
    states_glob: str


@dataclass(frozen=True)
class UsableToken:
    id: int
    name: str
    grants: tuple[StoredGrant, ...]


_AUDIT = "INSERT INTO access_audit (actor, action, target, state, detail) VALUES (%s, %s, %s, %s, %s)"


def audit(conn: psycopg.Connection, actor: str, action: str, target: str | None, state: str | None,
          detail: str | None) -> None:
    conn.execute(_AUDIT, (actor, action, target, state, detail))


class AuditEntry(TypedDict):
    """A row of `kl access log`: who did (or was refused) what, on which state."""

    id: int
    at: datetime
    actor: str
    action: str
    target: str | None
    state: str | None
    detail: str | None


def audit_log(conn: psycopg.Connection, limit: int = 100) -> list[AuditEntry]:
    return conn.cursor(row_factory=class_row(AuditEntry)).execute(
        "SELECT id, at, actor, action, target, state, detail FROM access_audit ORDER BY id DESC LIMIT %s",
        (limit,)).fetchall()


# --- grants ---------------------------------------------------------------------------------------

def _grant_rows(rows: list[dict[str, Any]]) -> list[StoredGrant]:
    return [StoredGrant(r["id"], r["principal"], r["role"], r["states_glob"]) for r in rows]


def grants_of(conn: psycopg.Connection, principal: str) -> list[StoredGrant]:
    return _grant_rows(conn.cursor(row_factory=dict_row).execute(
        "SELECT id, principal, role, states_glob FROM access_grants WHERE principal = %s ORDER BY id",
        (principal,)).fetchall())


class ListedGrant(TypedDict):
    """A row of `kl access list`: a grant, with its token's state when the principal is a token."""

    id: int
    principal: str
    role: str
    states_glob: str
    created_at: datetime
    created_by: str | None
    token_revoked_at: datetime | None
    token_expires_at: datetime | None


def list_grants(conn: psycopg.Connection, principal: str | None = None) -> list[ListedGrant]:
    return conn.cursor(row_factory=class_row(ListedGrant)).execute(
        """SELECT g.id, g.principal, g.role, g.states_glob, g.created_at, g.created_by,
                  t.revoked_at AS token_revoked_at, t.expires_at AS token_expires_at
           FROM access_grants g
           LEFT JOIN access_tokens t ON g.principal = 'token:' || t.name
           WHERE %(p)s::text IS NULL OR g.principal = %(p)s
           ORDER BY g.principal, g.id""", {"p": principal}).fetchall()


def add_grant(conn: psycopg.Connection, principal: str, role: str, states_glob: str, actor: str) -> tuple[int, str | None]:
    """Give PRINCIPAL ROLE on the states STATES_GLOB matches; one grant per (principal, glob), so
    granting again changes its role. The grant's id and the role it replaced (None: new)."""
    if role not in ROLES:
        raise AccessError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    with conn.transaction():
        if principal.startswith("token:"):
            _token_must_exist(conn, principal[len("token:"):])
        if principal.startswith("oidc:"):
            trust = principal.split(":", 2)[1]
            if conn.execute("SELECT 1 FROM oidc_trusts WHERE name = %s", (trust,)).fetchone() is None:
                raise AccessError(f"no OIDC trust named {trust!r} (see `kl access trust list`; add one with "
                                  "`kl access trust oidc`)")
        before = conn.execute("SELECT role FROM access_grants WHERE principal = %s AND states_glob = %s FOR UPDATE",
                              (principal, states_glob)).fetchone()
        row = conn.execute(
            """INSERT INTO access_grants (principal, role, states_glob, states_regex, created_by)
               VALUES (%s, %s, %s, %s, %s)
               ON CONFLICT (principal, states_glob) DO UPDATE SET role = EXCLUDED.role,
                   created_at = now(), created_by = EXCLUDED.created_by
               RETURNING id""", (principal, role, states_glob, globs.sql_regex(states_glob), actor)).fetchone()
        assert row is not None
        audit(conn, actor, "grant", principal, None,
              f"{role} on {states_glob}" + (f" (was {before[0]})" if before and before[0] != role else ""))
    return int(row[0]), before[0] if before else None


def revoke_grant(conn: psycopg.Connection, principal: str, states_glob: str | None, actor: str) -> list[StoredGrant]:
    """Remove PRINCIPAL's grant on STATES_GLOB (every grant of it when None); the removed grants."""
    with conn.transaction():
        rows = _grant_rows(conn.cursor(row_factory=dict_row).execute(
            """DELETE FROM access_grants WHERE principal = %s AND (%s::text IS NULL OR states_glob = %s)
               RETURNING id, principal, role, states_glob""", (principal, states_glob, states_glob)).fetchall())
        for g in rows:
            audit(conn, actor, "revoke", principal, None, f"{g.role} on {g.states_glob}")
    return rows


# --- tokens ---------------------------------------------------------------------------------------

def _token_must_exist(conn: psycopg.Connection, name: str) -> None:
    if conn.execute("SELECT 1 FROM access_tokens WHERE name = %s", (name,)).fetchone() is None:
        raise AccessError(f"no token named {name!r} (see `kl token list`; make one with `kl token create`)")


def create_token(conn: psycopg.Connection, name: str, secret_sha256: bytes, role: str, states_glob: str,
                 expires_in_s: float | None, actor: str) -> datetime | None:
    """Store a token (its hash only) and its first grant; its expiry time (None: never)."""
    if role not in ROLES:
        raise AccessError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    with conn.transaction():
        if conn.execute("SELECT 1 FROM access_tokens WHERE name = %s", (name,)).fetchone() is not None:
            raise AccessError(f"a token named {name!r} exists already (revoked ones keep their name): choose another name")
        row = conn.execute(
            """INSERT INTO access_tokens (name, secret_sha256, created_by, expires_at)
               VALUES (%s, %s, %s, CASE WHEN %s::float8 IS NULL THEN NULL ELSE now() + make_interval(secs => %s::float8) END)
               RETURNING expires_at""", (name, secret_sha256, actor, expires_in_s, expires_in_s)).fetchone()
        assert row is not None
        conn.execute("""INSERT INTO access_grants (principal, role, states_glob, states_regex, created_by)
                        VALUES (%s, %s, %s, %s, %s)""",
                     (f"token:{name}", role, states_glob, globs.sql_regex(states_glob), actor))
        audit(conn, actor, "token.create", f"token:{name}", None,
              f"{role} on {states_glob}" + (f", expires {row[0].isoformat()}" if row[0] else ""))
    expires: datetime | None = row[0]
    return expires


def revoke_token(conn: psycopg.Connection, name: str, actor: str) -> bool:
    """Revoke a token at once; False when it was revoked already."""
    with conn.transaction():
        _token_must_exist(conn, name)
        row = conn.execute("UPDATE access_tokens SET revoked_at = now(), revoked_by = %s "
                           "WHERE name = %s AND revoked_at IS NULL RETURNING id", (actor, name)).fetchone()
        if row is not None:
            audit(conn, actor, "token.revoke", f"token:{name}", None, None)
    return row is not None


_USABLE_TOKENS = "FROM access_tokens WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())"


def any_usable_token(conn: psycopg.Connection) -> bool:
    return conn.execute(f"SELECT EXISTS (SELECT 1 {_USABLE_TOKENS})").fetchone() == (True,)


def count_usable_tokens(conn: psycopg.Connection) -> int:
    row = conn.execute(f"SELECT count(*) {_USABLE_TOKENS}").fetchone()
    return int(row[0]) if row else 0


class ListedToken(TypedDict):
    """A row of `kl token list`: a token (never its secret) and the grants it holds."""

    name: str
    created_at: datetime
    created_by: str | None
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    expired: bool
    grants: list[str]  # "ROLE on GLOB"


def list_tokens(conn: psycopg.Connection) -> list[ListedToken]:
    return conn.cursor(row_factory=class_row(ListedToken)).execute(
        """SELECT t.name, t.created_at, t.created_by, t.expires_at, t.revoked_at, t.last_used_at,
                  (t.expires_at IS NOT NULL AND t.expires_at <= now()) AS expired,
                  COALESCE((SELECT array_agg(g.role || ' on ' || g.states_glob ORDER BY g.id)
                            FROM access_grants g WHERE g.principal = 'token:' || t.name), '{}') AS grants
           FROM access_tokens t ORDER BY t.name""").fetchall()


# One statement whatever the outcome: a usable token and its grants, or no row at all for an
# unknown, revoked or expired one (the same index probe either way).
_USABLE = """
SELECT t.id, t.name, g.id AS grant_id, g.role, g.states_glob
FROM access_tokens t LEFT JOIN access_grants g ON g.principal = 'token:' || t.name
WHERE t.secret_sha256 = %s AND t.revoked_at IS NULL AND (t.expires_at IS NULL OR t.expires_at > now())
ORDER BY g.id
"""


def usable_token(conn: psycopg.Connection, secret_sha256: bytes) -> UsableToken | None:
    rows = conn.execute(_USABLE, (secret_sha256,)).fetchall()
    if not rows:
        return None
    token_id, name = int(rows[0][0]), str(rows[0][1])
    grants = tuple(StoredGrant(int(r[2]), f"token:{name}", r[3], r[4]) for r in rows if r[2] is not None)
    return UsableToken(token_id, name, grants)


def touch_token(conn: psycopg.Connection, token_id: int) -> None:
    conn.execute("UPDATE access_tokens SET last_used_at = now() WHERE id = %s", (token_id,))
