"""What changed between two versions of a state, instance by instance and attribute by attribute,
sensitive values masked: the document `kl state diff` prints and the web UI shows.

Built from the lifecycle rows that differ between the two versions (store/history.py). A value is
masked when the object's marks or a cached schema of its provider say it is secret; an object
whose provider has no cached schema has every value masked (Terraform < 1.x wrote no marks)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kilolock import drift
from kilolock import schema as sch
from kilolock.redact import MASK
from kilolock.sensitive import block_contains_sensitive

ACTIONS = ("added", "removed", "changed")

Schemas = drift.Schemas
Row = Mapping[str, Any]
schema_key = drift.schema_key
schema_keys = drift.schema_keys


def _schema_sensitive(rows: Sequence[Row], schemas: Schemas) -> list[Any]:
    """Paths a cached schema of the objects' provider calls sensitive, in either object."""
    return [p for key in schema_keys(rows) for p in drift.schema_sensitive(schemas, key, *(r["attributes"] for r in rows))]


# Every path lies under the empty one: drift.changes masks every value.
_EVERYTHING: list[Any] = [()]


def unknown_providers(rows: Iterable[Row], schemas: Schemas) -> set[str]:
    """Providers of ROWS with no cached schema: their values are all masked."""
    return {r["provider"] if k is None else k[0] for r in rows for k in [schema_key(r)] if k is None or k not in schemas}


def instance(before: Row | None, after: Row | None, schemas: Schemas, unknown: set[str]) -> dict[str, Any]:
    """One instance's entry: action, status change, and its masked attribute changes. Providers
    without a cached schema are added to UNKNOWN."""
    row = after if after is not None else before
    assert row is not None
    action = "added" if before is None else "removed" if after is None else "changed"
    entry: dict[str, Any] = {"address": row["address"], "deposed": row["deposed"] or None, "mode": row["mode"],
                             "type": row["type"], "action": action}
    if before is not None and after is not None:
        entry["status"] = None if before["status"] == after["status"] else {"before": before["status"], "after": after["status"]}
        missing = unknown_providers([before, after], schemas)
        unknown |= missing
        block = drift.choose_block(drift.schema_blocks(schemas, schema_key(after)), after["attributes"], before["attributes"])
        found = drift.changes(before["attributes"], after["attributes"],
                              before["sensitive_attributes"], after["sensitive_attributes"],
                              _EVERYTHING if missing else _schema_sensitive([before, after], schemas), block=block)
        entry["changes"] = [{"path": c.path, "before": c.before, "after": c.after} for c in found]
    else:
        entry["status"] = None
        entry["changes"] = []
    return entry


def pairs(rows: Iterable[Row]) -> list[tuple[Row | None, Row | None]]:
    """Lifecycle rows open at exactly one of two serials (``at_to`` says which), in (address,
    deposed) order, as (before, after) per object."""
    sides: dict[tuple[str, str], dict[bool, Row]] = {}
    for r in rows:
        sides.setdefault((r["address"], r["deposed"]), {})[bool(r["at_to"])] = r
    return [(s.get(False), s.get(True)) for s in sides.values()]


def is_change(entry: Mapping[str, Any]) -> bool:
    """False for a lifecycle reopened with the same attributes and status: a change of metadata
    only (marks that reopened one before migration 0007, or an identity kl does not index)."""
    return bool(entry["action"] != "changed" or entry["changes"] or entry["status"])


def document(state: str, serial_from: int | None, serial_to: int, rows: Iterable[Row],
             schemas: Schemas | None = None, *, label_from: str | None = None, label_to: str | None = None) -> dict[str, Any]:
    """The diff document. ``rows``: lifecycle rows open at exactly one of the two serials, in
    (address, deposed) order, ``at_to`` telling which (store.history.differing_objects).
    ``schemas``: cached schema blocks by (source, mode, type) (store.history.cached_schemas); a
    value sensitive by any of them is masked, as it is once a refresh has marked it. ``label_from``
    and ``label_to``: the versions' names when one is an observation (v7.3; it carries its base's
    serial), else v and the serial."""
    unknown: set[str] = set()
    instances = [instance(b, a, schemas or {}, unknown) for b, a in pairs(rows)]
    instances = [i for i in instances if is_change(i)]
    counts = {a: sum(1 for i in instances if i["action"] == a) for a in ACTIONS}
    return {"version": 1, "state": state, "from": serial_from, "to": serial_to,
            "from_version": None if serial_from is None else label_from or f"v{serial_from}",
            "to_version": label_to or f"v{serial_to}", **counts,
            "masked_providers": sorted(unknown), "instances": instances}


def masked_note(state: str, masked_providers: Sequence[str]) -> str | None:
    """Said once: whose values are all masked, and how to see them."""
    if not masked_providers:
        return None
    return (f"values of {', '.join(masked_providers)} resources are all shown as {MASK}: kl has no schema "
            f"of that provider to tell secrets apart; `kl refresh {state}` (or --dry-run) caches it")


def schema_marks_path(block: sch.Block, path: sch.AttributePath) -> bool:
    """Whether a schema calls the value at PATH secret, or one inside it: a search by that path
    must not answer (its yes or no would tell the secret). Index steps go into an element."""
    current: sch.Block | sch.NestedObject | None = block
    for step in path:
        if isinstance(step, sch.Index):
            continue
        if current is None:
            return False
        attr = next((a for a in current.attributes if a.name == step.name), None)
        if attr is not None:
            if attr.sensitive:
                return True
            current = attr.nested_type
            continue
        nested = next((b for b in current.block_types if b.type_name == step.name), None) if isinstance(current, sch.Block) else None
        if nested is None:
            return False
        current = nested.block
    if current is None:
        return False
    if isinstance(current, sch.Block):
        return block_contains_sensitive(current)
    return _object_holds_secret(current)


def _object_holds_secret(obj: sch.NestedObject) -> bool:
    return any(a.sensitive or (a.nested_type is not None and _object_holds_secret(a.nested_type)) for a in obj.attributes)
