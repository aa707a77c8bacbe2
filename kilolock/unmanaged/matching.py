"""Which open instances claim a listed object: the one place discovery asks the identity index
(store/identities.py, migration 0024).

An instance claims an object when both are of the same provider source and resource type and
their identities are equal under the same identity schema version (an identity stored under an
older version is another identity until a refresh upgrades it; identities compare as the index
keys them: key order and spelling do not matter, a null attribute does). An instance stored without
an identity (by Terraform before 1.12) claims an object whose identity's ``id`` is its ``id``
attribute: weaker evidence, said as such.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from kilolock.store import identities as index


@dataclass(frozen=True)
class Claim:
    state: str
    address: str
    deposed: str
    # 'identity': the same identity. 'id': an instance stored without an identity whose id
    # attribute is the identity's id.
    evidence: str = "identity"

    def as_json(self) -> dict[str, str]:
        return {"state": self.state, "address": self.address, "deposed": self.deposed, "evidence": self.evidence}


def _object_id(identity: dict[str, Any]) -> str | None:
    """The identity's id attribute as the index keeps an instance's id (its text)."""
    oid = identity.get("id")
    if isinstance(oid, bool) or not isinstance(oid, str | int):
        return None
    return str(oid) or None


def claims(conn: psycopg.Connection, source: str, type_: str, identities: Sequence[dict[str, Any]],
           identity_schema_version: int) -> list[list[Claim]]:
    """For each of IDENTITIES (listed under IDENTITY_SCHEMA_VERSION), the open instances that are it."""
    wanted = [index.Wanted(identity, identity_schema_version, object_id=_object_id(identity)) for identity in identities]
    return [[Claim(c.state, c.address, c.deposed, c.evidence) for c in found]
            for found in index.claims(conn, source, type_, wanted)]
