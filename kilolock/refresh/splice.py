"""Putting refreshed objects back into the state document, the way Terraform writes them."""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from kilolock import schema as sch
from kilolock import tfstate
from kilolock.sensitive import merged_marks


@dataclass
class InstanceUpdate:
    removed: bool
    changed: bool
    attributes: bytes = b""  # canonical JSON
    private: bytes = b""
    identity: bytes | None = None
    schema_version: int = 0
    sensitive_paths: list[sch.AttributePath] = field(default_factory=list)
    reshaped: bool = False  # the stored object was a legacy flatmap: write attributes, drop attributes_flat


# What the lifecycle index looks at (kilolock.store.versions: the hashed fields and the metadata it
# updates in place): an object that differs in none of these needs no index work at all.
_INDEXED_FIELDS = ("schema_version", "status", "attributes", "sensitive_attributes", "identity")


def build_refreshed_state(doc: dict[str, Any], updates: dict[tuple[int, int], InstanceUpdate], serial: int,
                          parser: tfstate.ExactJSON | None = None) -> tuple[dict[str, Any], set[tuple[int, int]]]:
    """A new state document: refreshed objects spliced in, gone objects removed (and resources
    left without instances dropped, as Terraform does), serial set, lineage kept. Also returns
    the (resource, instance) positions, in ``doc``, of objects that were removed or now differ in
    an indexed field."""
    # Copies only the containers on the way to a changed object: everything else is shared with
    # the prior document, which is never modified (a deep copy of a 10k-instance state is slow).
    out = dict(doc)
    out["serial"] = serial
    kept_resources = []
    touched: set[tuple[int, int]] = set()
    for ri, res in enumerate(doc.get("resources", [])):
        res = dict(res)
        kept = []
        for ii, obj in enumerate(res.get("instances", [])):
            upd = updates.get((ri, ii))
            if upd is None:
                kept.append(obj)
                continue
            if upd.removed:
                touched.add((ri, ii))
                continue
            old, obj = obj, dict(obj)
            if upd.changed or upd.reshaped:
                obj["attributes"] = parser.loads(upd.attributes) if parser else tfstate.loads_exact(upd.attributes)
                obj.pop("attributes_flat", None)
            # else: equal in canonical form, so the stored value (cty JSON as Terraform wrote it) stays
            value = obj["attributes"]
            obj["schema_version"] = upd.schema_version
            obj["sensitive_attributes"] = merged_marks(obj.get("sensitive_attributes") or [], upd.sensitive_paths, value)
            if upd.private:
                obj["private"] = base64.b64encode(upd.private).decode("ascii")
            else:
                obj.pop("private", None)
            if upd.identity is not None:
                obj["identity"] = parser.loads(upd.identity) if parser else tfstate.loads_exact(upd.identity)
            if any(obj.get(k) != old.get(k) for k in _INDEXED_FIELDS):
                touched.add((ri, ii))
            kept.append(obj)
        if kept or res.get("mode") != "managed":
            res["instances"] = kept
            kept_resources.append(res)
    out["resources"] = kept_resources
    return out, touched
