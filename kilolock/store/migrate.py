"""Applies migrations/NNNN_*.sql in order, each in its own transaction, recorded with a checksum."""
from __future__ import annotations

import hashlib
import importlib.resources
from dataclasses import dataclass

import psycopg

from kilolock.errors import KlError

# Serialises concurrent `kl db migrate` runs (an arbitrary constant: "kl" "mi" "gr").
_ADVISORY_KEY = 0x6B6C_6D69_6772

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    name        text        PRIMARY KEY,
    checksum    text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(KlError):
    pass


@dataclass(frozen=True)
class Migration:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def bundled_migrations() -> list[Migration]:
    """The migrations shipped inside the package (a symlink to migrations/ in a checkout)."""
    root = importlib.resources.files("kilolock").joinpath("_migrations")
    found = [m for m in root.iterdir() if m.name.endswith(".sql")]
    found.sort(key=lambda m: m.name)
    if not found:
        raise MigrationError("no migrations found inside the kilolock package (broken install?)")
    return [Migration(m.name, m.read_text(encoding="utf-8")) for m in found]


def _applied(conn: psycopg.Connection) -> dict[str, str]:
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return {}
    return dict(conn.execute("SELECT name, checksum FROM schema_migrations").fetchall())


def _check(applied: dict[str, str], bundled: list[Migration]) -> list[Migration]:
    known = {m.name: m for m in bundled}
    for name, checksum in sorted(applied.items()):
        if name not in known:
            raise MigrationError(f"the database has migration {name}, which this kl does not know; it was migrated by a newer kl")
        if known[name].checksum != checksum:
            raise MigrationError(
                f"migration {name} was changed after it was applied (checksum {checksum[:12]} in the database, "
                f"{known[name].checksum[:12]} in this kl); applied migrations are immutable"
            )
    return [m for m in bundled if m.name not in applied]


def pending_migrations(conn: psycopg.Connection) -> list[str]:
    with conn.transaction():
        return [m.name for m in _check(_applied(conn), bundled_migrations())]


def apply_migrations(conn: psycopg.Connection) -> list[str]:
    """Apply what is pending; return the names applied (empty when already current)."""
    bundled = bundled_migrations()
    done: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_KEY,))
        conn.execute(_CREATE_TABLE)
    # Re-read under the lock in each step so two concurrent migrators apply each file once.
    while True:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_KEY,))
            pending = _check(_applied(conn), bundled)
            if not pending:
                return done
            m = pending[0]
            try:
                conn.execute(m.sql.encode())
            except psycopg.Error as exc:
                raise MigrationError(f"migration {m.name} failed: {str(exc).strip().splitlines()[0]}") from None
            conn.execute("INSERT INTO schema_migrations (name, checksum) VALUES (%s, %s)", (m.name, m.checksum))
            done.append(m.name)
