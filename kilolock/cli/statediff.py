"""``kl state diff``: what changed, instance by instance and attribute by attribute, between two
versions of a state.

The document (``document``, printed by ``--format json``, in kilolock/versiondiff.py, which the web
UI shows too) is built from the lifecycle rows that differ between the two versions
(store/history.py); the renderers take the document, as kl drift's do, so a field it gains reaches
every format."""
from __future__ import annotations

from typing import Any

from kilolock import drift, versiondiff
from kilolock.cli import render
from kilolock.versiondiff import ACTIONS, Schemas, document, schema_key, schema_keys

__all__ = ["ACTIONS", "Schemas", "document", "masked_note", "render_markdown", "render_table", "schema_key", "schema_keys"]

_SIGN = {"added": "+", "removed": "-", "changed": "~"}


def masked_note(doc: dict[str, Any]) -> str | None:
    """Said once: whose values are all masked, and how to see them."""
    return versiondiff.masked_note(doc["state"], doc["masked_providers"])


def _summary(doc: dict[str, Any]) -> str:
    return ", ".join(f"{doc[a]} {a}" for a in ACTIONS)


def _nothing(doc: dict[str, Any]) -> str | None:
    if doc["from"] is None:
        return f"{doc['state']}: one version only ({doc['to_version']}); nothing to compare"
    if doc["from_version"] == doc["to_version"]:
        return f"{doc['state']}: {doc['from_version']} against itself; nothing to compare"
    return None


def _status(s: dict[str, Any]) -> str:
    return f"{s['before'] or 'ready'} → {s['after'] or 'ready'}"


def render_table(doc: dict[str, Any]) -> None:
    nothing = _nothing(doc)
    if nothing:
        print(nothing)
        return
    print(f"{doc['state']}: {doc['from_version']} → {doc['to_version']}: {_summary(doc)}")
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
    print(f"{heading} Changes in `{doc['state']}` from {doc['from_version']} to {doc['to_version']}: {_summary(doc)}")
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
