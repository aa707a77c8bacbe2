"""``kl state diff``: what changed, instance by instance and attribute by attribute, between two
versions of a state.

The document (``document``, printed by ``--format json``) is built from the lifecycle rows that
differ between the two versions (store/history.py); the renderers take the document, as kl
drift's do, so a field it gains reaches every format."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kilolock import drift
from kilolock.cli import render
from kilolock.redact import MASK

ACTIONS = ("added", "removed", "changed")
_SIGN = {"added": "+", "removed": "-", "changed": "~"}


Schemas = Mapping[tuple[str, str, str], list[Any]]


def schema_key(row: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(provider source, mode, type) of an object: whose cached schemas say what is secret. None
    for a provider address that does not parse (stored as Terraform wrote it: it has no schema)."""
    from kilolock import tfstate

    try:
        return tfstate.parse_provider(row["provider"]).source, row["mode"], row["type"]
    except tfstate.StateError:
        return None


def schema_keys(rows: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    return {k for k in map(schema_key, rows) if k is not None}


def _schema_sensitive(rows: Sequence[Mapping[str, Any]], schemas: Schemas) -> list[Any]:
    """Paths a cached schema of the objects' provider calls sensitive, in either object (any version
    kl has seen: a mismatched shape only finds fewer paths)."""
    from kilolock import schema as sch
    from kilolock.sensitive import sensitive_paths

    paths = []
    for key in schema_keys(rows):
        for block in schemas.get(key, ()):
            for r in rows:
                paths += sensitive_paths(sch.schema_from_json(block).block, r["attributes"] or {})
    return paths


# Every path lies under the empty one: drift.changes masks every value.
_EVERYTHING: list[Any] = [()]


def _instance(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None, schemas: Schemas,
              unknown: set[str]) -> dict[str, Any]:
    row = after if after is not None else before
    assert row is not None
    action = "added" if before is None else "removed" if after is None else "changed"
    entry: dict[str, Any] = {"address": row["address"], "deposed": row["deposed"] or None, "mode": row["mode"],
                             "type": row["type"], "action": action}
    if before is not None and after is not None:
        entry["status"] = None if before["status"] == after["status"] else {"before": before["status"], "after": after["status"]}
        # Terraform < 1.x wrote no mark for a value its provider's schema calls sensitive
        # (local_file.sensitive_content): without a schema, any value may be a secret.
        missing = {r["provider"] if k is None else k[0]
                   for r, k in ((before, schema_key(before)), (after, schema_key(after))) if k is None or k not in schemas}
        unknown |= missing
        known = not missing
        found = drift.changes(before["attributes"], after["attributes"],
                              before["sensitive_attributes"], after["sensitive_attributes"],
                              _schema_sensitive([before, after], schemas) if known else _EVERYTHING)
        entry["changes"] = [{"path": c.path, "before": c.before, "after": c.after} for c in found]
    else:
        entry["status"] = None
        entry["changes"] = []
    return entry


def document(state: str, serial_from: int | None, serial_to: int, rows: Iterable[Mapping[str, Any]],
             schemas: Schemas | None = None) -> dict[str, Any]:
    """The diff document. ``rows``: lifecycle rows open at exactly one of the two serials, in
    (address, deposed) order, ``at_to`` telling which (store.history.differing_objects).
    ``schemas``: cached schema blocks by (source, mode, type) (store.history.cached_schemas); a
    value sensitive by any of them is masked, as it is once a refresh has marked it."""
    sides: dict[tuple[str, str], dict[bool, Mapping[str, Any]]] = {}
    for r in rows:
        sides.setdefault((r["address"], r["deposed"]), {})[bool(r["at_to"])] = r
    unknown: set[str] = set()
    instances = [_instance(s.get(False), s.get(True), schemas or {}, unknown) for s in sides.values()]
    # A lifecycle reopened with the same attributes and status changed metadata only (marks that
    # reopened one before migration 0007, or an identity kl does not index): not a change.
    instances = [i for i in instances if i["action"] != "changed" or i["changes"] or i["status"]]
    counts = {a: sum(1 for i in instances if i["action"] == a) for a in ACTIONS}
    return {"version": 1, "state": state, "from": serial_from, "to": serial_to, **counts,
            "masked_providers": sorted(unknown), "instances": instances}


def masked_note(doc: dict[str, Any]) -> str | None:
    """Said once: whose values are all masked, and how to see them."""
    if not doc["masked_providers"]:
        return None
    return (f"values of {', '.join(doc['masked_providers'])} resources are all shown as {MASK}: kl has no schema "
            f"of that provider to tell secrets apart; `kl refresh {doc['state']}` (or --dry-run) caches it")


def _summary(doc: dict[str, Any]) -> str:
    return ", ".join(f"{doc[a]} {a}" for a in ACTIONS)


def _nothing(doc: dict[str, Any]) -> str | None:
    if doc["from"] is None:
        return f"{doc['state']}: one version only (v{doc['to']}); nothing to compare"
    if doc["from"] == doc["to"]:
        return f"{doc['state']}: v{doc['from']} against itself; nothing to compare"
    return None


def _status(s: dict[str, Any]) -> str:
    return f"{s['before'] or 'ready'} → {s['after'] or 'ready'}"


def render_table(doc: dict[str, Any]) -> None:
    nothing = _nothing(doc)
    if nothing:
        print(nothing)
        return
    print(f"{doc['state']}: v{doc['from']} → v{doc['to']}: {_summary(doc)}")
    note = masked_note(doc)
    if note:
        print(f"note: {note}")
    for e in doc["instances"]:
        deposed = f" (deposed {e['deposed']})" if e["deposed"] else ""
        print(f"{_SIGN[e['action']]} {e['address']}{deposed}")
        if e["status"]:
            print(f"    status: {_status(e['status'])}")
        for c in e["changes"]:
            print(f"    {c['path']}: {drift.show(c['before'])} → {drift.show(c['after'])}")


def render_markdown(doc: dict[str, Any], heading: str = "###") -> None:
    """For CI step summaries and pull-request comments: a table per changed instance."""
    nothing = _nothing(doc)
    if nothing:
        print(f"{heading} `{doc['state']}`: " + nothing.split(": ", 1)[1])
        return
    print(f"{heading} Changes in `{doc['state']}` from v{doc['from']} to v{doc['to']}: {_summary(doc)}")
    note = masked_note(doc)
    if note:
        print(f"\n_Note: {note}._")
    for e in doc["instances"]:
        deposed = f" (deposed `{e['deposed']}`)" if e["deposed"] else ""
        print()
        print(f"**`{e['address']}`**{deposed}: {e['action']}")
        if e["status"]:
            print(f"\nstatus: {_status(e['status'])}")
        if e["changes"]:
            print()
            print(render.markdown_changes(e["changes"]))
