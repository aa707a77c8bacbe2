"""Terraform states built in code, for tests that need exact control over content (fixtures made
by real Terraform, tests/fixtures/states, cover the real shape)."""
from __future__ import annotations

import json
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
