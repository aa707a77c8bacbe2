"""OIDC issuers kl serve trusts (migration 0021): what ``kl access trust`` writes and ``kl serve``
reads at each request that carries a JWT (a small table: a trust added or removed applies to a
running server at once). Every change writes its access audit row in the same transaction."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from kilolock.store.access import AccessError, StoredGrant, audit


@dataclass(frozen=True)
class Trust:
    name: str
    issuer: str
    audience: str
    jwks: str | None  # a URL, an absolute file path, or None: the issuer's discovery document
    claims: dict[str, str]  # claim -> glob every token must match
    clock_skew_s: float
    lock_grace_s: float
    created_at: datetime | None = None
    created_by: str | None = None


_COLUMNS = "name, issuer, audience, jwks, claims, clock_skew_s, lock_grace_s, created_at, created_by"


def _trust(row: dict[str, Any]) -> Trust:
    return Trust(row["name"], row["issuer"], row["audience"], row["jwks"], dict(row["claims"]), float(row["clock_skew_s"]),
                 float(row["lock_grace_s"]), row["created_at"], row["created_by"])


def add_trust(conn: psycopg.Connection, trust: Trust, actor: str) -> bool:
    """Store TRUST, or replace the one of the same name; True when it is new. Its issuer must not
    be another trust's: a token names its issuer, and that must lead to one trust."""
    with conn.transaction():
        other = conn.execute("SELECT name FROM oidc_trusts WHERE issuer = %s AND name <> %s",
                             (trust.issuer, trust.name)).fetchone()
        if other is not None:
            raise AccessError(f"issuer {trust.issuer} is trusted already as {other[0]!r} "
                              f"(kl access trust remove {other[0]} first, or use that name)")
        row = conn.execute(
            """INSERT INTO oidc_trusts (name, issuer, audience, jwks, claims, clock_skew_s, lock_grace_s, created_by)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
               ON CONFLICT (name) DO UPDATE SET issuer = EXCLUDED.issuer, audience = EXCLUDED.audience,
                   jwks = EXCLUDED.jwks, claims = EXCLUDED.claims, clock_skew_s = EXCLUDED.clock_skew_s,
                   lock_grace_s = EXCLUDED.lock_grace_s, created_at = now(), created_by = EXCLUDED.created_by
               RETURNING (xmax = 0)""",
            (trust.name, trust.issuer, trust.audience, trust.jwks, Jsonb(trust.claims), trust.clock_skew_s,
             trust.lock_grace_s, actor)).fetchone()
        assert row is not None
        new = bool(row[0])
        audit(conn, actor, "trust.add" if new else "trust.change", f"oidc:{trust.name}", None,
              f"issuer {trust.issuer}, audience {trust.audience}")
    return new


def remove_trust(conn: psycopg.Connection, name: str, actor: str) -> int:
    """Remove the trust NAME; how many grants still name it (they stay, matching nothing)."""
    with conn.transaction():
        row = conn.execute("DELETE FROM oidc_trusts WHERE name = %s RETURNING issuer", (name,)).fetchone()
        if row is None:
            raise AccessError(f"no OIDC trust named {name!r} (see `kl access trust list`)")
        audit(conn, actor, "trust.remove", f"oidc:{name}", None, f"issuer {row[0]}")
        left = conn.execute("SELECT count(*) FROM access_grants WHERE starts_with(principal, %s)",
                            (f"oidc:{name}:",)).fetchone()
    return int(left[0]) if left else 0


def list_trusts(conn: psycopg.Connection) -> list[Trust]:
    return [_trust(r) for r in conn.cursor(row_factory=dict_row).execute(
        f"SELECT {_COLUMNS} FROM oidc_trusts ORDER BY name").fetchall()]


def trust_by_issuer(conn: psycopg.Connection, issuer: str) -> Trust | None:
    row = conn.cursor(row_factory=dict_row).execute(
        f"SELECT {_COLUMNS} FROM oidc_trusts WHERE issuer = %s", (issuer,)).fetchone()
    return _trust(row) if row else None


def trust_exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM oidc_trusts WHERE name = %s", (name,)).fetchone() is not None


def any_trust(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM oidc_trusts)").fetchone() == (True,)


def count_trusts(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM oidc_trusts").fetchone()
    return int(row[0]) if row else 0


def grants_of_trust(conn: psycopg.Connection, name: str) -> list[StoredGrant]:
    """Every grant naming a subject of trust NAME (``oidc:NAME:SUB-GLOB``): the caller matches the
    globs against a token's sub."""
    return [StoredGrant(int(r[0]), r[1], r[2], r[3]) for r in conn.execute(
        "SELECT id, principal, role, states_glob FROM access_grants WHERE starts_with(principal, %s) ORDER BY id",
        (f"oidc:{name}:",)).fetchall()]
