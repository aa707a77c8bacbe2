"""Drift ignore rules (``drift_ignore_rules``, migration 0009): ``kl drift ignore add|list|remove``.

Matching is SQL only, in the ``resource_drift`` view: a rule hides an open record there, and
``current_resource_drift`` (what kl drift, kl status, the exit codes and the API count as open
drift) leaves hidden records out. Records are never deleted or changed by a rule, so removing one
brings its records back. The globs are stored with the PostgreSQL regexes kilolock.globs compiles
them to; a path is stored in Terraform's form and as jsonb path steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kilolock import globs
from kilolock import schema as sch
from kilolock.errors import KlError


class RuleNotFound(KlError):
    def __init__(self, rule_id: int) -> None:
        super().__init__(f"no drift ignore rule with id {rule_id} (see `kl drift ignore list`)")
        self.rule_id = rule_id


@dataclass(frozen=True)
class NewRule:
    states_glob: str
    address_glob: str
    path: sch.AttributePath | None = None
    reason: str | None = None
    expires_in_s: float | None = None


def path_steps(path: sch.AttributePath) -> list[str]:
    """PATH as jsonb path steps (``#>``/``#-``): attribute names and map keys as themselves, list
    indexes as their digits."""
    return [step.name if isinstance(step, sch.GetAttr) else str(step.key) for step in path]


_INSERT = """
INSERT INTO drift_ignore_rules (states_glob, states_regex, address_glob, address_regex, path, path_steps, reason,
                                created_by, expires_at)
VALUES (%(states_glob)s, %(states_regex)s, %(address_glob)s, %(address_regex)s, %(path)s, %(path_steps)s, %(reason)s,
        %(by)s, CASE WHEN %(expires_in)s::float8 IS NULL THEN NULL
                     ELSE now() + make_interval(secs => %(expires_in)s::float8) END)
RETURNING id
"""

# How many open records each rule hides now: a record counts for the one rule it names (the
# oldest that matches). One pass over the view, not one per rule.
_LIST = """
SELECT r.id, r.states_glob, r.address_glob, r.path, r.reason, r.created_at, r.created_by, r.expires_at,
       (r.expires_at IS NOT NULL AND r.expires_at <= now()) AS expired,
       COALESCE(h.hidden, 0) AS hidden
FROM drift_ignore_rules r
LEFT JOIN (SELECT ignore_rule_id, count(*) AS hidden FROM resource_drift
           WHERE ignore_rule_id IS NOT NULL GROUP BY ignore_rule_id) h ON h.ignore_rule_id = r.id
ORDER BY r.id
"""


def add_rule(conn: psycopg.Connection, rule: NewRule, actor: str) -> int:
    """Store RULE; the new rule's id. The globs must already be valid (kilolock.globs)."""
    params: dict[str, Any] = {
        "states_glob": rule.states_glob, "states_regex": globs.sql_regex(rule.states_glob),
        "address_glob": rule.address_glob, "address_regex": globs.address_regex(rule.address_glob),
        "path": sch.path_display(rule.path) if rule.path else None,
        "path_steps": path_steps(rule.path) if rule.path else None,
        "reason": rule.reason, "by": actor, "expires_in": rule.expires_in_s,
    }
    with conn.transaction():
        row = conn.execute(_INSERT, params).fetchone()
    assert row is not None  # RETURNING
    return int(row[0])


def list_rules(conn: psycopg.Connection) -> list[dict[str, Any]]:
    return conn.cursor(row_factory=dict_row).execute(_LIST).fetchall()


def remove_rule(conn: psycopg.Connection, rule_id: int) -> None:
    """Raises RuleNotFound (nothing changed) for an unknown id."""
    with conn.transaction():
        row = conn.execute("DELETE FROM drift_ignore_rules WHERE id = %s RETURNING id", (rule_id,)).fetchone()
    if row is None:
        raise RuleNotFound(rule_id)

