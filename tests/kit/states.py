"""Terraform states built in code, for tests that need exact control over content (fixtures made
by real Terraform, tests/fixtures/states, cover the real shape)."""
from __future__ import annotations

import json
import random
from typing import Any

NULL_PROVIDER = 'provider["registry.terraform.io/hashicorp/null"]'


def build_state(serial: int, instances: dict[str, dict[str, Any]], lineage: str = "lineage-1", **top: Any) -> bytes:
    """A Terraform v4 state with one null_resource per entry: {name: attributes}."""
    doc: dict[str, Any] = {
        "version": 4,
        "terraform_version": "1.0.3",
        "serial": serial,
        "lineage": lineage,
        "outputs": {},
        "resources": [
            {"mode": "managed", "type": "null_resource", "name": name, "provider": NULL_PROVIDER,
             "instances": [{"schema_version": 0, "attributes": attrs, "sensitive_attributes": []}]}
            for name, attrs in instances.items()
        ],
    }
    doc.update(top)
    return json.dumps(doc).encode()


def null_count_state(instances: int, seed: int, lineage: str) -> bytes:
    """`count = N` of null_resource in Terraform 1.8's shape, with random ids the null provider keeps
    (so a refresh finds no drift); SEED makes the ids."""
    rng = random.Random(seed)
    return json.dumps({
        "version": 4, "terraform_version": "1.8.5", "serial": 1, "lineage": lineage, "outputs": {},
        "resources": [{
            "mode": "managed", "type": "null_resource", "name": "r", "provider": NULL_PROVIDER,
            "instances": [{"index_key": n, "schema_version": 0, "sensitive_attributes": [],
                           "attributes": {"id": str(rng.getrandbits(63)), "triggers": {"n": str(n)}}}
                          for n in range(instances)],
        }],
    }).encode()
