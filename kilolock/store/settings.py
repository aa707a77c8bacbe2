"""Per-state refresh settings (``state_settings``): what ``kl state set`` stores and ``kl refresh``
starts from, so a state refreshes the same way from any directory, host or scheduler."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

# Setting name as the command line spells it -> its column.
COLUMNS: dict[str, str] = {
    "workdir": "workdir",
    "provider-search-path": "provider_search_paths",
    "provider-parallelism": "provider_parallelism",
    "actor": "actor",
    "encryption-config": "encryption",
    "store-decrypted-attributes": "store_decrypted_attributes",
}


@dataclass(frozen=True)
class StateSettings:
    """A state's stored refresh settings (kl state set)."""

    workdir: str | None = None
    provider_search_paths: tuple[str, ...] | None = None
    provider_parallelism: int | str | None = None  # a number, or "auto" (migration 0011)
    actor: str | None = None
    # OpenTofu's encryption block (JSON form, passphrases as {"env": NAME} references): kl decrypts
    # the state to index and refresh it (kilolock.encryption).
    encryption: dict[str, Any] | None = None
    store_decrypted_attributes: bool | None = None  # index sensitive values unmasked: an explicit opt-in
    updated_at: Any = None
    updated_by: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"workdir": self.workdir,
                "provider_search_paths": list(self.provider_search_paths) if self.provider_search_paths is not None else None,
                "provider_parallelism": self.provider_parallelism, "actor": self.actor,
                "encryption": self.encryption, "store_decrypted_attributes": bool(self.store_decrypted_attributes)}


@dataclass(frozen=True)
class Changes:
    """What one ``kl state set`` does: values to store and settings to clear."""

    values: dict[str, Any] = field(default_factory=dict)  # column -> value
    unset: tuple[str, ...] = ()  # columns


_GET = """SELECT workdir, provider_search_paths, provider_parallelism, actor, encryption, store_decrypted_attributes,
       updated_at, updated_by
FROM state_settings WHERE state_id = %s"""


def get(conn: psycopg.Connection, state_id: str) -> StateSettings:
    row = conn.cursor(row_factory=dict_row).execute(_GET, (state_id,)).fetchone()
    if row is None:
        return StateSettings()
    paths = row["provider_search_paths"]
    return StateSettings(row["workdir"], tuple(paths) if paths is not None else None,
                         _parallelism(row["provider_parallelism"]), row["actor"], row["encryption"],
                         row["store_decrypted_attributes"], row["updated_at"], row["updated_by"])


def of_state(conn: psycopg.Connection, name: str) -> StateSettings:
    """State NAME's settings; none for a state that does not exist (yet)."""
    row = conn.execute("SELECT id::text FROM states WHERE name = %s", (name,)).fetchone()
    return get(conn, str(row[0])) if row else StateSettings()


def _parallelism(stored: str | None) -> int | str | None:
    # Stored as text since 0011: 'auto', or a number that reads back as one.
    return int(stored) if stored is not None and stored.isdigit() else stored


def update(conn: psycopg.Connection, state_id: str, changes: Changes, actor: str) -> StateSettings:
    """Store CHANGES in one transaction; settings not named keep their value. The result."""
    assigned = {**changes.values, **dict.fromkeys(changes.unset)}
    unknown = set(assigned) - set(COLUMNS.values())
    if unknown:
        raise ValueError(f"unknown setting column(s) {sorted(unknown)}")
    cols = sorted(assigned)
    insert = sql.SQL(
        "INSERT INTO state_settings (state_id, updated_by{extra}) VALUES (%(sid)s, %(by)s{values}) "
        "ON CONFLICT (state_id) DO UPDATE SET updated_at = now(), updated_by = EXCLUDED.updated_by{sets}"
    ).format(
        extra=sql.SQL("").join(sql.SQL(", ") + sql.Identifier(c) for c in cols),
        values=sql.SQL("").join(sql.SQL(", ") + sql.Placeholder(c) for c in cols),
        sets=sql.SQL("").join(sql.SQL(", {c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in cols),
    )
    params: dict[str, Any] = {"sid": state_id, "by": actor}
    for c in cols:
        v = assigned[c]
        params[c] = (list(v) if isinstance(v, tuple) else str(v) if c == "provider_parallelism" and v is not None
                     else Jsonb(v) if c == "encryption" and v is not None else v)
    with conn.transaction():
        conn.execute(insert, params)
    return get(conn, state_id)
