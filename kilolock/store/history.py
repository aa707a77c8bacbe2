"""Two versions of a state side by side, read from the lifecycle index (``kl state diff``).

A lifecycle row is open at serial N when ``create_serial <= N`` and it was not closed by then
(``delete_serial IS NULL OR delete_serial > N``). A row open at both serials is the same object
in the same shape in both versions, so only rows open at exactly one of them can differ: those
are all this reads, never the two state documents.

An observation (v7.3) has no lifecycle rows of its own: the index is Terraform's. Its objects are
read from its document (which holds every object it read, also where its base moved meanwhile and
nothing was recorded as observed_objects), and set beside the other endpoint's objects.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import psycopg
from psycopg.rows import class_row, dict_row

from kilolock import tfstate
from kilolock.errors import KlError
from kilolock.store import observations, versions
from kilolock.store.states import state_id

# Terraform's versions: an observation carries its base's serial (migration 0022).
_LAST_TWO = ("SELECT serial, encrypted FROM state_versions WHERE state_id = %s AND kind = 'terraform' "
             "ORDER BY serial DESC LIMIT 2")
# unindexed: why kl holds no index of an (OpenTofu-encrypted) version; NULL: its resources are indexed.
_SERIALS = "SELECT serial, unindexed FROM state_versions WHERE state_id = %s AND serial = ANY(%s) AND kind = 'terraform'"

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


class ObjectSide(TypedDict):
    """An object as one side of a diff holds it (a lifecycle row's, or an observation's), with
    ``at_to`` saying which side (FROM False, TO True); attributes and marks are the state's JSON."""

    address: str
    deposed: str
    mode: str
    type: str
    provider: str
    status: str | None
    attributes: Any
    sensitive_attributes: Any
    at_to: bool


def _unindexed(name: str, label: str, why: str) -> KlError:
    why = "" if why == "OpenTofu-encrypted" else f" ({why})"  # the reason a version stored sealed gives
    return KlError(f"state {name!r} {label} is OpenTofu-encrypted and not indexed{why}, so kl cannot diff it: "
                   f"`kl state set {name} --encryption-config FILE` indexes the versions written after it")


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
    found: dict[int, str | None] = {int(s): why for s, why in conn.execute(_SERIALS, (sid, serials)).fetchall()}
    for serial in serials:
        if serial not in found:
            raise KlError(f"state {name!r} has no version with serial {serial} (see `kl state versions {name}`)")
        why = found[serial]
        if why is not None:
            raise _unindexed(name, f"version {serial}", why)


def differing_objects(conn: psycopg.Connection, sid: str, serial_from: int, serial_to: int) -> list[ObjectSide]:
    """Lifecycle rows open at exactly one of the two serials, by address and deposed key; ``at_to``
    says which. An object in both lists (same address and deposed key) changed between them."""
    params = {"sid": sid, "from": serial_from, "to": serial_to}
    return conn.cursor(row_factory=class_row(ObjectSide)).execute(_DIFFERING, params).fetchall()


@dataclass(frozen=True)
class Endpoint:
    """One side of a diff: Terraform's version ``serial``, or (``observation`` set) an observation of it."""

    serial: int
    observation: int | None = None
    version_id: str | None = None  # an observation's row

    @property
    def label(self) -> str:
        return f"v{self.serial}" if self.observation is None else f"v{self.serial}.{self.observation}"


_OBSERVATION = """
SELECT o.id::text, o.unindexed FROM state_versions o JOIN state_versions b ON b.id = o.base_version_id
WHERE o.state_id = %s AND o.kind = 'observation' AND b.kind = 'terraform' AND b.serial = %s AND o.observation_number = %s
"""


def observation_endpoints(conn: psycopg.Connection, name: str, ref_from: tuple[int, int | None] | None,
                          ref_to: tuple[int, int | None] | None, *, observed: bool) -> tuple[str, Endpoint, Endpoint]:
    """(state id, FROM, TO) where either may be an observation: REF_FROM and REF_TO as (serial,
    observation number or None), with the defaults of ``endpoints`` (TO: Terraform's current
    version); ``observed``: Terraform's current version → the latest observation."""
    sid = state_id(conn, name)
    if observed:
        latest = observations.latest(conn, sid)
        if latest is None:
            raise KlError(f"state {name!r} has no observation yet: `kl refresh {name}` records one")
        current = versions.current_version(conn, sid)
        assert current is not None  # an observation has a base
        ref_from, ref_to = (current.serial, None), (latest.serial, latest.observation_number)
    if ref_to is None:
        last = conn.execute(_LAST_TWO, (sid,)).fetchone()
        if last is None:
            raise KlError(f"state {name!r} has no versions")
        ref_to = (int(last[0]), None)
    assert ref_from is not None  # the parser takes TO only after FROM
    return sid, _endpoint(conn, sid, name, ref_from), _endpoint(conn, sid, name, ref_to)


def _endpoint(conn: psycopg.Connection, sid: str, name: str, ref: tuple[int, int | None]) -> Endpoint:
    serial, number = ref
    if number is None:
        _check(conn, sid, name, [serial])
        return Endpoint(serial)
    row = conn.execute(_OBSERVATION, (sid, serial, number)).fetchone()
    if row is None:
        raise KlError(f"state {name!r} has no observation v{serial}.{number} (see `kl state versions {name}`)")
    if row[1] is not None:
        raise _unindexed(name, f"observation v{serial}.{number}", row[1])
    return Endpoint(serial, number, str(row[0]))


_OPEN_ROWS = f"""
SELECT r.address, r.deposed, r.mode, r.type, r.provider, r.status, r.attributes, r.sensitive_attributes
FROM resources r WHERE r.state_id = %(sid)s AND {_OPEN_AT.format(n="%(serial)s")}
"""


def _objects(conn: psycopg.Connection, sid: str, name: str, end: Endpoint) -> dict[tuple[str, str], dict[str, Any]]:
    """The objects of one endpoint by (address, deposed), as lifecycle rows have them."""
    if end.version_id is None:
        rows = conn.cursor(row_factory=dict_row).execute(_OPEN_ROWS, {"sid": sid, "serial": end.serial}).fetchall()
        return {(r["address"], r["deposed"]): r for r in rows}
    doc = versions.load_document(conn, name, None, json.loads, version_id=end.version_id)
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for inst in tfstate.parse_state(doc, origin=f"state {name!r} {end.label}").instances:
        found[(inst.address, inst.deposed)] = {
            "address": inst.address, "deposed": inst.deposed, "mode": inst.mode, "type": inst.type,
            "provider": inst.provider, "status": inst.obj.get("status"), "attributes": inst.obj.get("attributes"),
            "sensitive_attributes": inst.obj.get("sensitive_attributes", [])}
    return found


def differing_between(conn: psycopg.Connection, sid: str, name: str, a: Endpoint, b: Endpoint) -> list[ObjectSide]:
    """As ``differing_objects``, between endpoints either of which may be an observation: the
    objects whose status or attributes differ, or that only one side holds, each side a row with
    ``at_to`` saying which (FROM False, TO True), ordered by address and deposed key."""
    before, after = _objects(conn, sid, name, a), _objects(conn, sid, name, b)
    rows: list[ObjectSide] = []
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key), after.get(key)
        if old is not None and new is not None and (old["status"], old["attributes"]) == (new["status"], new["attributes"]):
            continue
        rows += [cast(ObjectSide, {**old, "at_to": False})] if old is not None else []
        rows += [cast(ObjectSide, {**new, "at_to": True})] if new is not None else []
    return rows


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
