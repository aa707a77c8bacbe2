"""Equal to Terraform: compares the resources two state documents hold, field by field.

Used by the tests that hold `kl refresh` to what `terraform apply -refresh-only` writes from the
same state with the same binaries. A difference names the instance, the field (a path into the
instance object: `attributes.triggers.note`, `sensitive_attributes`, `private`, ...) and both
values, so a failing test says exactly what kl wrote differently.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kit.state_diff import instances_by_address

MISSING = object()  # a key (or an instance) one side has and the other does not


@dataclass(frozen=True)
class Difference:
    instance: str  # the full instance address, deposed key included
    field: str  # path into the instance object; "" for the instance itself
    terraform: Any
    kl: Any

    def __str__(self) -> str:
        def show(value: Any) -> str:
            return "(absent)" if value is MISSING else json.dumps(value, sort_keys=True)[:300]

        where = f"{self.instance}: {self.field}" if self.field else self.instance
        return f"{where}: terraform {show(self.terraform)} != kl {show(self.kl)}"


def _diff_values(instance: str, path: str, theirs: Any, ours: Any, out: list[Difference], marks_ordered: bool = True) -> None:
    # Down into objects, so the difference names the attribute; lists and scalars compare whole
    # (with JSON's types: 1 and 1.0 are the same number, True is not 1).
    if isinstance(theirs, dict) and isinstance(ours, dict):
        for key in sorted(theirs.keys() | ours.keys()):
            _diff_values(instance, f"{path}.{key}" if path else key, theirs.get(key, MISSING), ours.get(key, MISSING), out,
                         marks_ordered)
        return
    if path == "sensitive_attributes" and not marks_ordered and isinstance(theirs, list) and isinstance(ours, list):
        theirs, ours = sorted(theirs, key=_canonical), sorted(ours, key=_canonical)
    if _canonical(theirs) != _canonical(ours):
        out.append(Difference(instance, path, theirs, ours))


def _canonical(value: Any) -> Any:
    if value is MISSING:
        return value
    return json.dumps(value, sort_keys=True)


def _resources(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The resource-level fields (mode, type, name, provider, module, each) by resource address."""
    found: dict[str, dict[str, Any]] = {}
    for resource in state["resources"]:
        prefix = resource["module"] + "." if "module" in resource else ""
        key = f'{prefix}{"data." if resource["mode"] == "data" else ""}{resource["type"]}.{resource["name"]}'
        found[key] = {k: v for k, v in resource.items() if k != "instances"} | {"instance_count": len(resource["instances"])}
    return found


def compare_resources(terraform_state: dict[str, Any], kl_state: dict[str, Any], marks_ordered: bool = True) -> list[Difference]:
    """Every difference between the resources of the two documents (managed and data): a resource
    only one side has (Terraform drops a resource whose last instance is gone), a resource-level
    field, then per instance in address order: an instance only one side has, or each field of
    its object that differs. ``marks_ordered`` False compares ``sensitive_attributes`` as sets:
    for CLIs that write them in Go's map order (Terraform before 1.12's sorting, OpenTofu 1.8), so
    the order changes from one write to the next."""
    out: list[Difference] = []
    theirs_r, ours_r = _resources(terraform_state), _resources(kl_state)
    for address in sorted(theirs_r.keys() | ours_r.keys()):
        if address in theirs_r and address in ours_r:
            _diff_values(address, "", theirs_r[address], ours_r[address], out)
        else:
            out.append(Difference(address, "", "resource" if address in theirs_r else MISSING,
                                  "resource" if address in ours_r else MISSING))
    theirs, ours = instances_by_address(terraform_state), instances_by_address(kl_state)
    for address in sorted(theirs.keys() | ours.keys()):
        if address not in ours or address not in theirs:
            out.append(Difference(address, "", "present" if address in theirs else MISSING,
                                  "present" if address in ours else MISSING))
            continue
        _diff_values(address, "", theirs[address], ours[address], out, marks_ordered)
    return out
