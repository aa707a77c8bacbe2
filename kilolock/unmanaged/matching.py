"""Which open instances claim a listed object: the one place discovery asks the identity index.

An instance claims an object when both are of the same provider source and resource type and
their identities are equal under the same identity schema version (an identity stored under an
older version is another identity until a refresh upgrades it). Identities compare as JSON values:
key order and spelling do not matter, a null attribute does.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from kilolock.store import discovery_runs


@dataclass(frozen=True)
class Claim:
    state: str
    address: str
    deposed: str
    # 'identity': the same identity. The identity index adds 'id' (an instance stored without an
    # identity, by Terraform before 1.12, whose id attribute is the identity's id): weaker evidence.
    evidence: str = "identity"

    def as_json(self) -> dict[str, str]:
        return {"state": self.state, "address": self.address, "deposed": self.deposed, "evidence": self.evidence}


def _key(identity: dict[str, Any], version: int) -> str:
    return f"{version}:" + json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def claims(conn: psycopg.Connection, source: str, type_: str, identities: Sequence[dict[str, Any]],
           identity_schema_version: int) -> list[list[Claim]]:
    """For each of IDENTITIES (listed under IDENTITY_SCHEMA_VERSION), the open instances that are it."""
    index: dict[str, list[Claim]] = {}
    for inst in discovery_runs.open_identities(conn, source, type_):
        index.setdefault(_key(inst.identity, inst.identity_schema_version), []).append(
            Claim(inst.state, inst.address, inst.deposed))
    return [list(index.get(_key(identity, identity_schema_version), ())) for identity in identities]
