"""What a run found, as kl drift shows it: each changed instance's changes, the status its drift
record will have (open, ignored, resolved), and the open drift it resolves by reading objects back."""
from __future__ import annotations

import json
import logging
from typing import Any

import psycopg

from kilolock import drift as attribute_drift
from kilolock import tfstate
from kilolock.refresh.result import Failure as Failure  # noqa: PLC0414 - run() returns them: its callers know them from here
from kilolock.refresh.result import Result as Result  # noqa: PLC0414
from kilolock.schema import path_to_state_json
from kilolock.store import drift_records, ignore_rules

log = logging.getLogger("kilolock.refresh")

from kilolock.refresh.instance import Entry


def drift_of(entry: Entry, schemas: attribute_drift.Schemas) -> dict[str, Any]:
    """What a changed instance's read found, as kl drift prints it (SCHEMAS shape its paths)."""
    update = entry.update
    assert update is not None
    deposed = entry.inst.deposed or None
    if update.removed:  # every attribute "-> null" would say nothing more than "deleted"
        return {"address": entry.inst.address, "deposed": deposed, "kind": "deleted", "changes": []}
    try:
        before = json.loads(entry.prior_json) if entry.prior_json is not None else entry.inst.obj.get("attributes")
        after = json.loads(update.attributes)
    except ValueError:
        before = after = None
    key = attribute_drift.schema_key({"provider": entry.inst.provider, "mode": entry.inst.mode, "type": entry.inst.type})
    block = attribute_drift.choose_block(attribute_drift.schema_blocks(schemas, key), after, before)
    # The provider's schema marks what the new value holds (update.sensitive_paths); the prior value
    # may hold sensitive parts the new one lacks (a list element gone), which its marks may not list.
    changes = attribute_drift.changes(before if isinstance(before, dict) else None, after if isinstance(after, dict) else None,
                                      entry.inst.obj.get("sensitive_attributes"),
                                      [path_to_state_json(p) for p in update.sensitive_paths],
                                      attribute_drift.schema_sensitive(schemas, key, before), block=block)
    return {"address": entry.inst.address, "deposed": deposed, "kind": "changed",
            "changes": [{"path": c.path, "before": c.before, "after": c.after} for c in changes]}


def judge_drift(conn: psycopg.Connection, name: str, sid: str, drifted: list[Entry], items: list[dict[str, Any]]) -> None:
    """Each item's status as the drift records will have it once committed (asked before the
    commit, so a dry run gets the same answer): what kl drift, kl status and the exit codes say."""
    findings = []
    for e in drifted:
        update = e.update
        assert update is not None
        before = e.prior_json.decode() if e.prior_json is not None else tfstate.dumps_compact(e.inst.obj.get("attributes"))
        after = None if update.removed or update.attributes is None else update.attributes.decode()
        findings.append(ignore_rules.Finding(e.inst.address, e.inst.deposed, "deleted" if update.removed else "changed",
                                             before, after))
    for item, verdict in zip(items, ignore_rules.classify(conn, name, sid, findings), strict=True):
        item["status"] = "resolved" if verdict.read_back else "ignored" if verdict.rules else "open"
        item["ignored_by"] = None if not verdict.rules else {
            "rule": verdict.rules[0]["rule"], "reason": verdict.rules[0]["reason"], "rules": verdict.rules}


def with_read_back(conn: psycopg.Connection, sid: str, entries: list[Entry], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ITEMS and, in address order among them, the open drift this run resolves: objects read back
    exactly as Terraform's version holds them where a record says they differed."""
    found = {(i["address"], i["deposed"] or "") for i in items}
    # Sent is not answered: a read a cancel cut short has no update, and says nothing of its object.
    read = {(e.inst.address, e.inst.deposed) for e in entries if e.read and not e.error and e.update is not None}
    back: list[dict[str, Any]] = [{"address": a, "deposed": d or None, "kind": k, "changes": [], "status": "resolved", "ignored_by": None}
            for a, d, k in drift_records.on_terraforms_baseline(conn, sid) if (a, d) in read and (a, d) not in found]
    return sorted(items + back, key=lambda i: (i["address"], i["deposed"] or "")) if back else items


