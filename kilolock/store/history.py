"""Two versions of a state side by side, read from the lifecycle index (``kl state diff``).

A lifecycle row is open at serial N when ``create_serial <= N`` and it was not closed by then
(``delete_serial IS NULL OR delete_serial > N``). A row open at both serials is the same object
in the same shape in both versions, so only rows open at exactly one of them can differ: those
are all this reads, never the two state documents.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kilolock.errors import KlError
from kilolock.store.states import state_id

# Terraform's versions: an observation carries its base's serial (migration 0022).
_LAST_TWO = ("SELECT serial, encrypted FROM state_versions WHERE state_id = %s AND kind = 'terraform' "
             "ORDER BY serial DESC LIMIT 2")
_SERIALS = "SELECT serial, encrypted FROM state_versions WHERE state_id = %s AND serial = ANY(%s) AND kind = 'terraform'"

_OPEN_AT = "(r.create_serial <= {n} AND (r.delete_serial IS NULL OR r.delete_serial > {n}))"
_AT_FROM = _OPEN_AT.format(n="%(from)s")
_AT_TO = _OPEN_AT.format(n="%(to)s")

# A row open at exactly one of the two serials was opened or closed by a version between them, so
# the versions in between lead to the rows through their opened-by / closed-by indexes: the cost is
# what changed in the range, not the state's whole history. (A row both opened and closed in the
# range is open at neither: no row comes through both branches.)
_BETWEEN = """
SELECT id FROM state_versions
WHERE state_id = %(sid)s AND serial > LEAST(%(from)s, %(to)s) AND serial <= GREATEST(%(from)s, %(to)s) AND kind = 'terraform'
"""
_COLUMNS = f"r.address, r.deposed, r.mode, r.type, r.provider, r.status, r.attributes, r.sensitive_attributes, {_AT_TO} AS at_to"
_DIFFERING = f"""
WITH between_versions AS ({_BETWEEN})
SELECT * FROM (
    SELECT {_COLUMNS} FROM resources r
    WHERE r.opened_by_version_id IN (SELECT id FROM between_versions) AND ({_AT_FROM}) <> ({_AT_TO})
    UNION ALL
    SELECT {_COLUMNS} FROM resources r
    WHERE r.closed_by_version_id IN (SELECT id FROM between_versions) AND ({_AT_FROM}) <> ({_AT_TO})
) differing
ORDER BY address, deposed, at_to
"""


def _encrypted(name: str, serial: int) -> KlError:
    return KlError(f"state {name!r} version {serial} is OpenTofu-encrypted: kl cannot see its resources, so it cannot diff it")


def endpoints(conn: psycopg.Connection, name: str, serial_from: int | None, serial_to: int | None) -> tuple[str, int | None, int]:
    """(state id, FROM serial, TO serial), checked to exist and be readable. TO defaults to the
    current version; FROM, given neither, to the one before it. FROM is None when there is
    nothing to compare: the state has one version only."""
    sid = state_id(conn, name)
    if serial_to is None:
        last = conn.execute(_LAST_TWO, (sid,)).fetchall()
        if not last:
            raise KlError(f"state {name!r} has no versions")
        serial_to = int(last[0][0])
        if serial_from is None:
            if len(last) == 1:
                _check(conn, sid, name, [serial_to])
                return sid, None, serial_to
            serial_from = int(last[1][0])
    assert serial_from is not None  # the parser takes TO_SERIAL only after FROM_SERIAL
    _check(conn, sid, name, [serial_from] if serial_from == serial_to else [serial_from, serial_to])
    return sid, serial_from, serial_to


def _check(conn: psycopg.Connection, sid: str, name: str, serials: list[int]) -> None:
    found: dict[int, bool] = {int(s): bool(e) for s, e in conn.execute(_SERIALS, (sid, serials)).fetchall()}
    for serial in serials:
        if serial not in found:
            raise KlError(f"state {name!r} has no version with serial {serial} (see `kl state versions {name}`)")
        if found[serial]:
            raise _encrypted(name, serial)


def differing_objects(conn: psycopg.Connection, sid: str, serial_from: int, serial_to: int) -> list[dict[str, Any]]:
    """Lifecycle rows open at exactly one of the two serials, by address and deposed key; ``at_to``
    says which. An object in both lists (same address and deposed key) changed between them."""
    params = {"sid": sid, "from": serial_from, "to": serial_to}
    return conn.cursor(row_factory=dict_row).execute(_DIFFERING, params).fetchall()


# Each cached version's schema of each (source, mode, type) asked for: a secret by any of them is masked.
_SCHEMA_BLOCKS = """
SELECT k.source, k.mode, k.type, b.block
FROM unnest(%s::text[], %s::text[], %s::text[]) AS k(source, mode, type)
JOIN provider_schemas p ON p.source = k.source,
LATERAL (SELECT p.schema -> (CASE k.mode WHEN 'data' THEN 'data_source_schemas' ELSE 'resource_schemas' END) -> k.type
         AS block) b
WHERE b.block IS NOT NULL
"""


def cached_schemas(conn: psycopg.Connection, wanted: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str, str], list[Any]]:
    """The cached schemas (as stored: JSON) of each (provider source, mode, type) in WANTED, one
    per provider version kl has seen; absent when none is cached."""
    keys = sorted(set(wanted))
    out: dict[tuple[str, str, str], list[Any]] = {}
    if not keys:
        return out
    rows = conn.execute(_SCHEMA_BLOCKS, ([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys])).fetchall()
    for source, mode, type_, block in rows:
        out.setdefault((source, mode, type_), []).append(block)
    return out
