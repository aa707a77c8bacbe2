"""Putting refreshed objects back into the state document, the way Terraform writes them."""
from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kilolock import schema as sch
from kilolock import tfstate
from kilolock.sensitive import merged_marks


@dataclass
class InstanceUpdate:
    """What a read changes in one instance of the state."""

    removed: bool
    changed: bool
    attributes: bytes = b""  # canonical JSON
    private: bytes = b""
    identity: bytes | None = None
    identity_schema_version: int | None = None  # written with identity: the version it is under
    schema_version: int = 0
    sensitive_paths: list[sch.AttributePath] = field(default_factory=list)
    reshaped: bool = False  # the stored object was a legacy flatmap: write attributes, drop attributes_flat


# What the lifecycle index looks at (kilolock.store.versions: the hashed fields and the metadata it
# updates in place): an object that differs in none of these needs no index work at all.
_INDEXED_FIELDS = ("schema_version", "status", "attributes", "sensitive_attributes", "identity")


class Spliced(NamedTuple):
    """A refreshed state, and how it differs from the prior one."""

    state: tfstate.State
    # (resource, instance) positions, in the prior document, of objects removed or now different
    # in an indexed field: what the lifecycle index must look at.
    touched: set[tuple[int, int]]
    # No object removed or changed in any field (private data included) and no resource dropped:
    # the document's resources are the prior's, so storing it needs no more than its top level.
    same_resources: bool


def build_refreshed_state(state: tfstate.State, updates: dict[tuple[int, int], InstanceUpdate], serial: int,
                          parser: tfstate.ExactJSON | None = None, *,
                          in_place: bool = False) -> Spliced:
    """A new state: refreshed objects spliced in, gone objects removed (and resources left
    without instances dropped, as Terraform does), serial set, lineage kept, its instances indexed
    (from the prior state's: nothing here needs validating again).

    ``in_place``: the caller is done with the prior state, so an object that differs is updated
    where it is rather than copied (a first refresh, which rewrites every object's private data,
    would otherwise copy all of them)."""
    doc = state.raw
    prior_instances = iter(state.instances)  # in document order, as parse_state lists them
    instances: list[tfstate.Instance] = []
    # Copies only the containers on the way to a changed object: everything else is shared with
    # the prior document, which is never modified unless in_place (a deep copy of a 10k-instance
    # state is slow).
    out = dict(doc)
    out["serial"] = serial
    kept_resources: list[dict[str, Any]] = []
    touched: set[tuple[int, int]] = set()
    same = True
    for ri, res in enumerate(doc.get("resources", [])):
        res = dict(res)
        kept = []
        for ii, obj in enumerate(res.get("instances", [])):
            inst = next(prior_instances)
            assert (inst.resource_index, inst.instance_index) == (ri, ii) and inst.obj is obj
            upd = updates.get((ri, ii))
            if upd is None:
                kept.append(obj)
                instances.append(_placed(inst, len(kept_resources), len(kept) - 1, obj))
                continue
            if upd.removed:
                touched.add((ri, ii))
                same = False
                continue
            # A new object only where something differs: a refresh that changes nothing shares every
            # object with the prior document instead of copying 100,000 of them.
            fields: dict[str, Any] = {}
            if upd.changed or upd.reshaped:
                fields["attributes"] = parser.loads(upd.attributes) if parser else tfstate.loads_exact(upd.attributes)
                if "attributes_flat" in obj:
                    fields["attributes_flat"] = None  # the provider's object form replaces the flatmap
            # else: equal in canonical form, so the stored value (cty JSON as Terraform wrote it) stays
            fields["schema_version"] = upd.schema_version
            prior_marks = obj.get("sensitive_attributes")
            if prior_marks or upd.sensitive_paths:
                value = fields["attributes"] if "attributes" in fields else obj["attributes"]
                fields["sensitive_attributes"] = merged_marks(prior_marks or [], upd.sensitive_paths, value)
            else:  # no marks before or now: what merged_marks makes of that, without its work per instance
                fields["sensitive_attributes"] = []
            fields["private"] = base64.b64encode(upd.private).decode("ascii") if upd.private else None
            if upd.identity is not None:
                fields["identity"] = parser.loads(upd.identity) if parser else tfstate.loads_exact(upd.identity)
                if upd.identity_schema_version is not None:
                    fields["identity_schema_version"] = upd.identity_schema_version
            # New attributes always go in (equal in Python is not equal in JSON: 1 == 1.0 == True).
            # Providers on protocol >= 5.9/6.9 return the identity with every read, nearly always
            # the one stored: compared as the JSON text it would be written as, an unchanged one
            # leaves the object, and so a refresh that changes nothing, as it was.
            differs = [k for k, v in fields.items() if _differs(obj, k, v)]
            if differs:
                same = False
                if any(k in _INDEXED_FIELDS and (k == "identity" or obj.get(k) != fields[k]) for k in differs):
                    touched.add((ri, ii))
                if not in_place:
                    obj = dict(obj)
                for k in differs:
                    if fields[k] is None:
                        del obj[k]
                    else:
                        obj[k] = fields[k]
            kept.append(obj)
            instances.append(_placed(inst, len(kept_resources), len(kept) - 1, obj))
        if kept or res.get("mode") != "managed":
            res["instances"] = kept
            kept_resources.append(res)
        else:
            same = False  # dropped, even one that had no instances to begin with
    out["resources"] = kept_resources
    # A prior without a resources list gains one (an empty list is not no list).
    return Spliced(tfstate.State(raw=out, instances=instances), touched, same and "resources" in doc)


def _differs(obj: dict[str, Any], key: str, new: Any) -> bool:
    """Whether setting KEY to NEW (None: no such key) changes the object as written."""
    if key == "attributes":
        return True
    if key == "identity":  # as JSON text: numbers from the exact parser may be floats or their text
        return key not in obj or tfstate.dumps_compact(obj[key]) != tfstate.dumps_compact(new)
    return (key in obj) != (new is not None) or (new is not None and obj[key] != new)


def _placed(inst: tfstate.Instance, ri: int, ii: int, obj: dict[str, Any]) -> tfstate.Instance:
    if (inst.resource_index, inst.instance_index) == (ri, ii) and inst.obj is obj:
        return inst
    return dataclasses.replace(inst, resource_index=ri, instance_index=ii, obj=obj)
