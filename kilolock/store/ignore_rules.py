"""Drift ignore rules (``drift_ignore_rules``, migrations 0009 and 0012): ``kl drift ignore add|list|remove``.

Matching is SQL only, in one function (``kl_drift_ignored_by``, migrations 0012 and 0018) that the
``resource_drift`` view calls: rules hide an open record there when together they cover every
change it has, and ``current_resource_drift`` (what kl drift, kl status, the exit codes and the
API count as open drift) leaves hidden records out. ``classify`` asks the same function about
changes a refresh found and has not committed (``kl refresh --dry-run``). Records are never
deleted or changed by a rule, so removing one brings its records back. The globs are stored with
the PostgreSQL regexes kilolock.globs compiles them to; a path is stored in Terraform's form and
as jsonb path steps, with a set element it ends on (``member[={"name":"eve"}]``) apart as jsonb.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from kilolock import globs
from kilolock import schema as sch
from kilolock.errors import KlError


class RuleNotFound(KlError):
    def __init__(self, rule_id: int) -> None:
        super().__init__(f"no drift ignore rule with id {rule_id} (see `kl drift ignore list`)")
        self.rule_id = rule_id


@dataclass(frozen=True)
class NewRule:
    """An ignore rule to add."""

    states_glob: str
    address_glob: str
    path: sch.DriftPath | None = None
    reason: str | None = None
    expires_in_s: float | None = None


def path_steps(path: sch.DriftPath) -> list[str]:
    """PATH as jsonb path steps (``#>``/``#-``): attribute names and map keys as themselves, list
    indexes as their digits; a set element it ends on is not a step (``path_element``)."""
    return [step.name if isinstance(step, sch.GetAttr) else str(step.key) for step in path if not isinstance(step, sch.Element)]


def path_element(path: sch.DriftPath) -> Jsonb | None:
    """The set element PATH ends on (drift_path_parse allows one only last), as jsonb; None: none."""
    return Jsonb(path[-1].value) if path and isinstance(path[-1], sch.Element) else None


_INSERT = """
INSERT INTO drift_ignore_rules (states_glob, states_regex, address_glob, address_regex, path, path_steps, path_element,
                                reason, created_by, expires_at)
VALUES (%(states_glob)s, %(states_regex)s, %(address_glob)s, %(address_regex)s, %(path)s, %(path_steps)s,
        %(path_element)s, %(reason)s,
        %(by)s, CASE WHEN %(expires_in)s::float8 IS NULL THEN NULL
                     ELSE now() + make_interval(secs => %(expires_in)s::float8) END)
RETURNING id
"""

# How many open records each rule hides now: a record counts for every rule that hides it (rules
# combine: each may cover some of its changes). One pass over the view, not one per rule.
_LIST = """
SELECT r.id, r.states_glob, r.address_glob, r.path, r.reason, r.created_at, r.created_by, r.expires_at,
       (r.expires_at IS NOT NULL AND r.expires_at <= now()) AS expired,
       COALESCE(h.hidden, 0) AS hidden
FROM drift_ignore_rules r
LEFT JOIN (SELECT rule_id, count(*) AS hidden FROM resource_drift, unnest(ignore_rule_ids) AS rule_id
           GROUP BY rule_id) h ON h.rule_id = r.id
ORDER BY r.id
"""

# Changes found and not committed (a dry run): what the commit would record. An open record at the
# address keeps its baseline (what the last apply or import wrote), so that is what the rules see
# and what a read-back compares with; else the stored attributes the run compared. read_back: the
# read returns the object to that baseline (the commit resolves the record: no drift).
_CLASSIFY = """
SELECT f.n, CASE WHEN rb.read_back THEN NULL ELSE kl_drift_ignored_by(%(state)s, f.address, f.kind, b.prev, f.cur) END AS ids,
       rb.read_back
FROM unnest(%(addresses)s::text[], %(deposed)s::text[], %(kinds)s::text[], %(prevs)s::jsonb[], %(curs)s::jsonb[])
     WITH ORDINALITY AS f(address, deposed, kind, prev, cur, n)
LEFT JOIN LATERAL (
    SELECT base.attributes FROM drift_records x JOIN resources base ON base.id = x.baseline_resource_id
    WHERE x.state_id = %(sid)s AND x.address = f.address AND x.deposed = f.deposed AND x.resolved_version_id IS NULL
    LIMIT 1
) rec ON true,
LATERAL (SELECT COALESCE(rec.attributes, f.prev) AS prev) b,
LATERAL (SELECT rec.attributes IS NOT NULL AND f.kind = 'changed' AND rec.attributes = f.cur AS read_back) rb
ORDER BY f.n
"""
_REASONS = "SELECT id, reason FROM drift_ignore_rules WHERE id = ANY(%s)"


def add_rule(conn: psycopg.Connection, rule: NewRule, actor: str) -> int:
    """Store RULE; the new rule's id. The globs must already be valid (kilolock.globs)."""
    params: dict[str, Any] = {
        "states_glob": rule.states_glob, "states_regex": globs.sql_regex(rule.states_glob),
        "address_glob": rule.address_glob, "address_regex": globs.address_regex(rule.address_glob),
        "path": sch.path_display(rule.path) if rule.path else None,
        "path_steps": path_steps(rule.path) if rule.path else None,
        "path_element": path_element(rule.path) if rule.path else None,
        "reason": rule.reason, "by": actor, "expires_in": rule.expires_in_s,
    }
    with conn.transaction():
        row = conn.execute(_INSERT, params).fetchone()
    assert row is not None  # RETURNING
    return int(row[0])


# The instances a rule could hide: those in the matching states' current versions, and those an
# open drift record says are gone (a refresh closed their lifecycle).
_ADDRESSES_OF = """
SELECT r.address FROM resources r JOIN states s ON s.id = r.state_id WHERE s.name ~ %(states)s AND r.delete_serial IS NULL
UNION
SELECT d.address FROM drift_records d JOIN states s ON s.id = d.state_id
WHERE s.name ~ %(states)s AND d.resolved_version_id IS NULL
"""
_STATES_MATCH = "SELECT EXISTS (SELECT 1 FROM states WHERE name ~ %s)"
_ADDRESS_MATCH = f"SELECT EXISTS (SELECT 1 FROM ({_ADDRESSES_OF}) a WHERE a.address ~ %(address)s)"
_SOME_ADDRESSES = f"SELECT address FROM ({_ADDRESSES_OF}) a LIMIT %(limit)s"


def states_match(conn: psycopg.Connection, states_glob: str) -> bool:
    """Whether any stored state's name matches STATES_GLOB."""
    row = conn.execute(_STATES_MATCH, (globs.sql_regex(states_glob),)).fetchone()
    return bool(row and row[0])


def address_matches(conn: psycopg.Connection, states_glob: str, address_glob: str) -> bool:
    """Whether ADDRESS_GLOB matches an instance of the states STATES_GLOB matches now (or one whose
    open drift says it is gone)."""
    params = {"states": globs.sql_regex(states_glob), "address": globs.address_regex(address_glob)}
    row = conn.execute(_ADDRESS_MATCH, params).fetchone()
    return bool(row and row[0])


def some_addresses(conn: psycopg.Connection, states_glob: str, limit: int) -> list[str]:
    """Up to LIMIT distinct instance addresses of the states STATES_GLOB matches (as address_matches sees them)."""
    return [r[0] for r in conn.execute(_SOME_ADDRESSES, {"states": globs.sql_regex(states_glob), "limit": limit})]


class ListedRule(TypedDict):
    """A row of `kl drift ignore list`: a rule, whether it expired, and how many records it hides."""

    id: int
    states_glob: str
    address_glob: str
    path: str | None  # None: the whole instance
    reason: str | None
    created_at: datetime
    created_by: str | None
    expires_at: datetime | None
    expired: bool
    hidden: int


def list_rules(conn: psycopg.Connection) -> list[ListedRule]:
    return conn.cursor(row_factory=class_row(ListedRule)).execute(_LIST).fetchall()


def remove_rule(conn: psycopg.Connection, rule_id: int) -> None:
    """Raises RuleNotFound (nothing changed) for an unknown id."""
    with conn.transaction():
        row = conn.execute("DELETE FROM drift_ignore_rules WHERE id = %s RETURNING id", (rule_id,)).fetchone()
    if row is None:
        raise RuleNotFound(rule_id)



@dataclass(frozen=True)
class Finding:
    """One change a refresh found: ``before``/``after`` the attributes as JSON text (``after``
    None when the object is gone)."""

    address: str
    deposed: str
    kind: str  # changed | deleted
    before: str | None
    after: str | None


@dataclass(frozen=True)
class Verdict:
    """What the ignore rules say of one finding."""

    rules: list[dict[str, Any]]  # [{"rule", "reason"}], oldest first: the rules that hide it (empty: none)
    read_back: bool  # the object is back to its open record's baseline: committing resolves that drift


def classify(conn: psycopg.Connection, state: str, sid: str, findings: list[Finding]) -> list[Verdict]:
    """What the drift records would say of FINDINGS once committed, in their order: the rules that
    would hide each (as ``resource_drift`` would list them), or that it resolves an open record."""
    if not findings:
        return []
    params = {"state": state, "sid": sid, "addresses": [f.address for f in findings],
              "deposed": [f.deposed for f in findings], "kinds": [f.kind for f in findings],
              "prevs": [f.before for f in findings], "curs": [f.after for f in findings]}
    rows = conn.execute(_CLASSIFY, params).fetchall()
    ids = sorted({i for _, found, _ in rows for i in found or ()})
    reasons: dict[int, str | None] = dict(conn.execute(_REASONS, (ids,)).fetchall()) if ids else {}
    return [Verdict([{"rule": i, "reason": reasons.get(i)} for i in found or ()], bool(read_back))
            for _, found, read_back in rows]
