"""What changed inside one resource instance, for people: attribute paths with before/after,
sensitive values masked; and the drift document (`kl drift --format json`, the drift API) built
from drift record rows."""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kilolock import schema as sch
from kilolock.redact import MASK
from kilolock.sensitive import marked_paths


@dataclass(frozen=True)
class Change:
    path: str  # Terraform's printed form (schema.path_display): triggers["k"]
    before: Any
    after: Any


def _walk(before: Any, after: Any, path: sch.AttributePath, out: list[tuple[sch.AttributePath, Any, Any]]) -> None:
    if before == after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for k in sorted(set(before) | set(after)):
            # Without the schema, an object attribute cannot always be told from a map key:
            # top-level keys are attributes, and so are the keys of a list or set element (a
            # nested block, rule[0].cidr); other keys print as map keys (tags["env"]).
            step: sch.PathStep = sch.GetAttr(k) if not path or _is_element(path[-1]) else sch.Index(k)
            _walk(before.get(k), after.get(k), path + (step,), out)
        return
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            _walk(b, a, path + (sch.Index(i),), out)
        return
    out.append((path, before, after))


def _is_element(step: sch.PathStep) -> bool:
    return isinstance(step, sch.Index) and isinstance(step.key, int)


def _loose(path: sch.AttributePath) -> tuple[str | int, ...]:
    """PATH with attribute and map-key steps alike: the walk guesses which a key is, Terraform's
    marks know, and a guess must never unmask a secret."""
    return tuple(step.name if isinstance(step, sch.GetAttr) else step.key for step in path)


def changes(before: dict[str, Any] | None, after: dict[str, Any] | None,
            sensitive_before: list[Any] | None = None, sensitive_after: list[Any] | None = None,
            schema_sensitive: Iterable[sch.AttributePath] = ()) -> list[Change]:
    """Attribute-level changes, values masked at paths marked in either object or SCHEMA_SENSITIVE."""
    marked = marked_paths(sensitive_before) + marked_paths(sensitive_after) + list(schema_sensitive)
    sensitive = [_loose(p) for p in marked]
    found: list[tuple[sch.AttributePath, Any, Any]] = []
    _walk(before or {}, after or {}, (), found)
    out = []
    for path, b, a in found:
        loose = _loose(path)
        if any(loose[: len(s)] == s or s[: len(loose)] == loose for s in sensitive):  # sensitive.covered, loosely
            b = MASK if b is not None else None
            a = MASK if a is not None else None
        out.append(Change(sch.path_display(path), b, a))
    return out


def show(v: Any) -> str:
    if v == MASK:
        return MASK
    return json.dumps(v, ensure_ascii=False, sort_keys=True)


def duration(seconds: float) -> str:
    """A duration for people, two units at most: 3d 4h, 2h 5m, 7m 3s, 12s."""
    s = max(0, int(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{n}{u}" for n, u in ((d, "d"), (h, "h"), (m, "m"), (s, "s")) if n]
    return " ".join(parts[:2]) or "0s"


def entry(r: Mapping[str, Any]) -> dict[str, Any]:
    """One drift record row (store.drift.list_drift) as the document's entry. A deleted object's
    every attribute "→ null" says nothing more than "deleted", so its changes are empty."""
    changed = [] if r["drift_kind"] == "deleted" else changes(
        r["previous_attributes"], r["current_attributes"], r["previous_sensitive_attributes"], r["current_sensitive_attributes"])
    open_for: timedelta = r["open_for"]
    resolved = None if r["resolved_serial"] is None else {
        "serial": r["resolved_serial"], "at": r["resolved_at"], "how": r["resolved_how"]}
    ignored = None if r.get("ignore_rule_id") is None else {
        "rule": r["ignore_rule_id"], "reason": r["ignore_reason"],
        "rules": r.get("ignore_rules") or [{"rule": r["ignore_rule_id"], "reason": r["ignore_reason"]}]}
    status = "resolved" if resolved is not None else "ignored" if ignored is not None else "open"
    return {
        "address": r["address"], "deposed": r["deposed"] or None, "kind": r["drift_kind"], "type": r["type"],
        "status": status,
        "detected_serial": r["detected_serial"], "detected_at": r["detected_at"],
        "first_detected": {"serial": r["first_detected_serial"], "at": r["first_detected_at"]},
        "last_confirmed_serial": r["last_confirmed_serial"],
        "open_for_s": int(open_for.total_seconds()),
        "resolved": resolved,
        # the ignore rules that hide this open record (kl drift ignore): the oldest, and all of them
        "ignored_by": ignored,
        "refresh_run_id": str(r["refresh_run_id"]) if r["refresh_run_id"] else None,
        "changed_attributes": r["changed_attributes"],
        "changes": [{"path": c.path, "before": c.before, "after": c.after} for c in changed],
    }


def document(state: str, rows: Iterable[Mapping[str, Any]], *, total: int, open_count: int, ignored_count: int,
             include_resolved: bool) -> dict[str, Any]:
    """The drift document: ``total`` entries match the selection (open ones, or all with
    ``include_resolved``: ignored and resolved ones too), ``rows`` may be fewer (a limit); ``open``
    is the open count (ignored records left out), exactly what ``kl status`` says; ``ignored`` the
    open records an ignore rule hides."""
    return {"version": 1, "state": state, "all": include_resolved, "total": total, "open": open_count,
            "ignored": ignored_count, "drift": [entry(r) for r in rows]}
