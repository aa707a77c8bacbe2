"""Applies migrations/NNNN_*.sql in order, each in its own transaction, recorded with a checksum.

Released migrations (0001-0006 and every later one once released) are never edited: databases
record their checksums. A schema change is a new file, and comes with an upgrade fixture
(tests/store/test_upgrade.py says how) proving that existing data survives it.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg.rows import dict_row

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
_TABLE_EXISTS = "SELECT to_regclass('schema_migrations') IS NOT NULL"
_APPLIED = "SELECT name, checksum FROM schema_migrations"
_RECORD = "INSERT INTO schema_migrations (name, checksum) VALUES (%s, %s)"
_LOCK = "SELECT pg_advisory_xact_lock(%s)"


class MigrationError(KlError):
    pass


@dataclass(frozen=True)
class Migration:
    """One migration file: its name and SQL."""

    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def bundled_migrations() -> list[Migration]:
    """The migrations shipped inside the package (a symlink to migrations/ in a checkout)."""
    found = _zipped_migrations()
    if found is None:
        import importlib.resources  # a checkout or an installed package; kl.pyz never needs it (~2 ms)

        root = importlib.resources.files("kilolock").joinpath("_migrations")
        files = sorted((m for m in root.iterdir() if m.name.endswith(".sql")), key=lambda m: m.name)
        found = [Migration(m.name, m.read_text(encoding="utf-8")) for m in files]
    if not found:
        raise MigrationError("no migrations found inside the kilolock package (broken install?)")
    return found


def _zipped_migrations() -> list[Migration] | None:
    """From kl.pyz: read through the zipimporter that loaded kilolock, whose table of contents the
    import system has already read. importlib.resources would open the 33 MiB zip again with
    zipfile and list its thousands of names: a tenth of a small refresh's database start-up.
    None when kilolock is not zipped, or the table (private: an attribute up to Python 3.12, a
    method from 3.13) is not where expected."""
    import os
    import zipimport

    import kilolock

    loader = kilolock.__spec__.loader if kilolock.__spec__ is not None else None
    if not isinstance(loader, zipimport.zipimporter) or not kilolock.__file__:
        return None
    try:
        files = getattr(loader, "_files", None)
        if files is None:
            files = loader._get_files()
        package_dir = os.path.dirname(kilolock.__file__)
        if not package_dir.startswith(loader.archive + os.sep):
            return None
        inner = package_dir[len(loader.archive) + 1:] + os.sep + "_migrations" + os.sep
        names = sorted(k for k in files if k.startswith(inner) and k.endswith(".sql") and os.sep not in k[len(inner):])
        return [Migration(k[len(inner):], loader.get_data(os.path.join(loader.archive, k)).decode("utf-8")) for k in names]
    except (AttributeError, TypeError, OSError):
        return None


def _applied(conn: psycopg.Connection) -> dict[str, str]:
    exists = conn.execute(_TABLE_EXISTS).fetchone()
    if not exists or not exists[0]:
        return {}
    return {r["name"]: r["checksum"] for r in conn.cursor(row_factory=dict_row).execute(_APPLIED).fetchall()}


def _check(applied: dict[str, str], bundled: Sequence[Migration]) -> list[Migration]:
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
    if conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        # Every command checks the schema first: one round trip, not a transaction of four. On its
        # own a failed statement leaves nothing behind, and a database without the table has no
        # migration applied.
        try:
            applied = {r["name"]: r["checksum"] for r in conn.cursor(row_factory=dict_row).execute(_APPLIED).fetchall()}
        except psycopg.errors.UndefinedTable:
            applied = {}
        return [m.name for m in _check(applied, bundled_migrations())]
    with conn.transaction():
        return [m.name for m in _check(_applied(conn), bundled_migrations())]


def apply_migrations(conn: psycopg.Connection, migrations: Sequence[Migration] | None = None) -> list[str]:
    """Apply what is pending; return the names applied (empty when already current).

    ``migrations`` (default: the bundled ones) lets the upgrade tests build a database as an older
    kl left it: the bundled list cut after the last migration of that release.
    """
    bundled = bundled_migrations() if migrations is None else list(migrations)
    done: list[str] = []
    with conn.transaction():
        conn.execute(_LOCK, (_ADVISORY_KEY,))
        conn.execute(_CREATE_TABLE)
    # Re-read under the lock in each step so two concurrent migrators apply each file once.
    while True:
        with conn.transaction():
            conn.execute(_LOCK, (_ADVISORY_KEY,))
            pending = _check(_applied(conn), bundled)
            if not pending:
                return done
            m = pending[0]
            try:
                conn.execute(m.sql.encode())
            except psycopg.Error as exc:
                raise MigrationError(f"migration {m.name} failed: {str(exc).strip().splitlines()[0]}") from None
            conn.execute(_RECORD, (m.name, m.checksum))
            done.append(m.name)
