"""State versions and the lifecycle index written with them.

`write_version` is the one path by which a version enters the database (import, the HTTP
backend's apply writes, refresh commits): the version row and its lifecycle rows in one
transaction, with the serial and lineage rules checked under a row lock on the state.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from kilolock import tfstate
from kilolock.errors import KlError

SOURCES = ("import", "apply", "refresh")


class StateNotFound(KlError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no state named {name!r} (see `kl state list`)")
        self.name = name


class VersionConflict(KlError):
    """A write that would overwrite or fork history (serial not advancing, foreign lineage)."""


@dataclass(frozen=True)
class VersionRow:
    id: str
    serial: int
    lineage: str
    source: str
    content_hash: str
    terraform_version: str | None = None
    actor: str | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class WriteResult:
    state_id: str
    version: VersionRow
    created: bool  # False: an idempotent retry of the current version, nothing written
    opened: int = 0
    closed: int = 0
    unchanged: int = 0


def content_hash(raw: bytes) -> str:
    """Identity of a version's bytes: a retried write of the very same bytes is not a new version."""
    return hashlib.sha256(raw).hexdigest()


# --- reads -------------------------------------------------------------------------------------


def state_id(conn: psycopg.Connection, name: str) -> str:
    row = conn.execute("SELECT id FROM states WHERE name = %s", (name,)).fetchone()
    if row is None:
        raise StateNotFound(name)
    return str(row[0])


_VERSION_COLS = "id, serial, lineage, source, content_hash, terraform_version, actor, created_at"


def _version(row: tuple[Any, ...]) -> VersionRow:
    return VersionRow(str(row[0]), int(row[1]), row[2], row[3], row[4], row[5], row[6], row[7])


def current_version(conn: psycopg.Connection, sid: str) -> VersionRow | None:
    row = conn.execute(
        f"SELECT {_VERSION_COLS} FROM state_versions WHERE state_id = %s ORDER BY serial DESC LIMIT 1", (sid,)
    ).fetchone()
    return _version(row) if row else None


def find_version(conn: psycopg.Connection, sid: str, serial: int, hash_: str) -> VersionRow | None:
    """The version at SERIAL if it holds exactly the bytes hashed to HASH_ (did our write land?)."""
    row = conn.execute(
        f"SELECT {_VERSION_COLS} FROM state_versions WHERE state_id = %s AND serial = %s AND content_hash = %s",
        (sid, serial, hash_),
    ).fetchone()
    return _version(row) if row else None


def list_versions(conn: psycopg.Connection, name: str) -> list[VersionRow]:
    sid = state_id(conn, name)
    rows = conn.execute(f"SELECT {_VERSION_COLS} FROM state_versions WHERE state_id = %s ORDER BY serial", (sid,)).fetchall()
    return [_version(r) for r in rows]


def raw_state_text(conn: psycopg.Connection, name: str, serial: int | None = None) -> str:
    sid = state_id(conn, name)
    if serial is None:
        row = conn.execute(
            "SELECT raw_state::text FROM state_versions WHERE state_id = %s ORDER BY serial DESC LIMIT 1", (sid,)
        ).fetchone()
        if row is None:
            raise KlError(f"state {name!r} has no versions")
    else:
        row = conn.execute(
            "SELECT raw_state::text FROM state_versions WHERE state_id = %s AND serial = %s", (sid, serial)
        ).fetchone()
        if row is None:
            raise KlError(f"state {name!r} has no version with serial {serial} (see `kl state versions {name}`)")
    return str(row[0])


def open_attributes(conn: psycopg.Connection, sid: str) -> dict[tuple[str, str], bytes]:
    """Attributes JSON of each managed object in the current version, by (address, deposed key).

    The open lifecycle rows hold exactly the current version's objects (written in the same
    transaction), and PostgreSQL renders their JSON far faster than Python re-serialises it.
    """
    rows = conn.execute(
        "SELECT address, deposed, attributes::text FROM resources WHERE state_id = %s AND delete_serial IS NULL AND mode = 'managed'",
        (sid,),
    ).fetchall()
    return {(a, d): t.encode() for a, d, t in rows if t is not None}


# --- the write path ----------------------------------------------------------------------------

_ENSURE_STATE = "INSERT INTO states (name) VALUES (%s) ON CONFLICT (name) DO NOTHING"

_DESCRIPTORS_TABLE = """
CREATE TEMP TABLE kl_descriptors (
    address text, deposed text, mode text, type text, name text, module text,
    index_key jsonb, provider text, ri int, ii int
) ON COMMIT DROP
"""

# The objects come from the version just inserted, so attributes are stored exactly as PostgreSQL
# parsed them (no re-serialisation in Python). One pass over the document: a per-row
# `raw_state -> 'resources' -> ri` would de-TOAST the whole state once per instance.
# The content hash covers what makes an object "the same object in the same shape"; private,
# dependencies and create_before_destroy are bookkeeping and do not open a new lifecycle.
_INCOMING_TABLE = """
CREATE TEMP TABLE kl_incoming ON COMMIT DROP AS
SELECT d.address, d.deposed, d.mode, d.type, d.name, d.module, d.index_key, d.provider, o.obj,
       encode(sha256(convert_to(jsonb_build_array(
           d.provider, o.obj -> 'schema_version', o.obj -> 'status', o.obj -> 'attributes',
           COALESCE(o.obj -> 'sensitive_attributes', '[]'::jsonb), o.obj -> 'identity')::text, 'UTF8')), 'hex') AS content_hash
FROM kl_descriptors d
JOIN (
    SELECT (r.ord - 1)::int AS ri, (inst.ord - 1)::int AS ii, inst.obj
    FROM state_versions v,
         jsonb_array_elements(v.raw_state -> 'resources') WITH ORDINALITY AS r(res, ord),
         jsonb_array_elements(r.res -> 'instances') WITH ORDINALITY AS inst(obj, ord)
    WHERE v.id = %s
) o ON o.ri = d.ri AND o.ii = d.ii
"""

_SCOPE_TABLE = "CREATE TEMP TABLE kl_scope (address text, deposed text) ON COMMIT DROP"

_CLOSE_GONE_OR_CHANGED = """
UPDATE resources r
SET delete_serial = %(serial)s, closed_by_version_id = %(vid)s
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL
  AND (NOT %(scoped)s OR EXISTS (SELECT 1 FROM kl_scope s WHERE s.address = r.address AND s.deposed = r.deposed))
  AND NOT EXISTS (
      SELECT 1 FROM kl_incoming i
      WHERE i.address = r.address AND i.deposed = r.deposed AND i.content_hash = r.content_hash
  )
"""

_OPEN_NEW_OR_CHANGED = """
INSERT INTO resources (
    state_id, address, deposed, mode, type, name, module, index_key, provider, schema_version,
    status, attributes, sensitive_attributes, content_hash, create_serial, opened_by_version_id
)
SELECT %(sid)s, i.address, i.deposed, i.mode, i.type, i.name, i.module, i.index_key, i.provider,
       COALESCE((i.obj ->> 'schema_version')::bigint, 0), i.obj ->> 'status', i.obj -> 'attributes',
       COALESCE(i.obj -> 'sensitive_attributes', '[]'::jsonb), i.content_hash, %(serial)s, %(vid)s
FROM kl_incoming i
WHERE NOT EXISTS (
    SELECT 1 FROM resources r
    WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
)
"""


def _check_advance(name: str, cur: VersionRow, new: tfstate.State, new_hash: str, force: bool) -> bool:
    """The serial and lineage rules. True: the write is a retry of the current version."""
    if new_hash == cur.content_hash:
        return True
    if new.lineage != cur.lineage and not force:
        raise VersionConflict(
            f"state {name!r} has lineage {cur.lineage}, the new state has {new.lineage}: "
            "it is a different state; use --force to replace it anyway"
        )
    if new.serial <= cur.serial:
        raise VersionConflict(
            f"state {name!r} is at serial {cur.serial}; the new state has serial {new.serial}, which does not advance it "
            "(a write must have a higher serial unless it is byte-identical to the current version)"
        )
    return False


def write_version(
    conn: psycopg.Connection,
    name: str,
    state: tfstate.State,
    raw: bytes,
    *,
    source: str,
    actor: str | None,
    force: bool = False,
    expect_serial: int | None = None,
    expect_lineage: str | None = None,
    touched: set[tuple[str, str]] | None = None,
) -> WriteResult:
    """Store ``raw`` (already parsed into ``state``) as the next version of state ``name``.

    ``expect_serial``/``expect_lineage`` make it a compare-and-swap: the write happens only if the
    current version is still the one the caller started from (the refresh commit uses it).
    ``touched`` (only with ``expect_serial``) lists the (address, deposed) objects that may differ
    from that version, removed ones included; the caller guarantees every other object is
    unchanged, so the lifecycle index looks at the touched ones only and a refresh commit costs
    what drifted, not what exists.
    """
    if touched is not None and expect_serial is None:
        raise ValueError("touched needs expect_serial: it describes a change against a known version")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}")
    new_hash = content_hash(raw)
    try:
        raw_text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise tfstate.StateError("state: not UTF-8 text") from None
    with conn.transaction():
        conn.execute(_ENSURE_STATE, (name,))
        sid = str(conn.execute("SELECT id FROM states WHERE name = %s FOR UPDATE", (name,)).fetchone()[0])
        cur = current_version(conn, sid)
        if expect_serial is not None and (cur is None or cur.serial != expect_serial or cur.lineage != expect_lineage):
            now = f"serial {cur.serial}, lineage {cur.lineage}" if cur else "no version"
            raise VersionConflict(
                f"state {name!r} changed while this run was in progress (started from serial {expect_serial}, now {now}); nothing was written"
            )
        if cur is not None and _check_advance(name, cur, state, new_hash, force):
            return WriteResult(state_id=sid, version=cur, created=False)
        try:
            row = conn.execute(
                f"""INSERT INTO state_versions (state_id, serial, lineage, terraform_version, source, raw_state, content_hash, actor)
                    VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s) RETURNING {_VERSION_COLS}""",
                (sid, state.serial, state.lineage, state.terraform_version or None, source, raw_text, new_hash, actor),
            ).fetchone()
        except psycopg.errors.DataError as exc:  # e.g. \u0000, which jsonb cannot store
            raise tfstate.StateError(f"state: PostgreSQL cannot store it as JSON: {str(exc).strip().splitlines()[0]}") from None
        version = _version(row)
        opened, closed, unchanged = _index_lifecycles(conn, sid, version, state, touched)
    return WriteResult(state_id=sid, version=version, created=True, opened=opened, closed=closed, unchanged=unchanged)


def _index_lifecycles(conn: psycopg.Connection, sid: str, version: VersionRow, state: tfstate.State,
                      touched: set[tuple[str, str]] | None) -> tuple[int, int, int]:
    cur = conn.cursor()
    cur.execute(_DESCRIPTORS_TABLE)
    cur.execute(_SCOPE_TABLE)
    if touched is not None:
        with cur.copy("COPY kl_scope (address, deposed) FROM STDIN") as copy:
            for key in touched:
                copy.write_row(key)
    with cur.copy(
        "COPY kl_descriptors (address, deposed, mode, type, name, module, index_key, provider, ri, ii) FROM STDIN"
    ) as copy:
        for inst in state.instances:
            if touched is not None and (inst.address, inst.deposed) not in touched:
                continue
            key = None if inst.index_key is None else json.dumps(inst.index_key)
            copy.write_row((inst.address, inst.deposed, inst.mode, inst.type, inst.name, inst.module, key,
                            inst.provider, inst.resource_index, inst.instance_index))
    # Temp tables have no statistics until analysed; without them the joins below go quadratic.
    cur.execute("ANALYZE kl_descriptors")
    cur.execute(_INCOMING_TABLE, (version.id,))
    cur.execute("ANALYZE kl_incoming")
    params = {"sid": sid, "vid": version.id, "serial": version.serial, "scoped": touched is not None}
    closed = cur.execute(_CLOSE_GONE_OR_CHANGED, params).rowcount
    opened = cur.execute(_OPEN_NEW_OR_CHANGED, params).rowcount
    cur.execute("DROP TABLE kl_descriptors, kl_incoming, kl_scope")
    return opened, closed, len(state.instances) - opened
