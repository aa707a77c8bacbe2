"""What changed inside one resource instance, for people: attribute paths with before/after,
sensitive values masked."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kilolock import schema as sch
from kilolock.redact import MASK
from kilolock.sensitive import covered, marked_paths


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
            # Without the schema, an object attribute below the top level cannot be told from a
            # map key; top-level keys are always attributes, deeper ones print as keys (["k"]).
            step: sch.PathStep = sch.GetAttr(k) if not path else sch.Index(k)
            _walk(before.get(k), after.get(k), path + (step,), out)
        return
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            _walk(b, a, path + (sch.Index(i),), out)
        return
    out.append((path, before, after))


def changes(before: dict[str, Any] | None, after: dict[str, Any] | None,
            sensitive_before: list[Any] | None = None, sensitive_after: list[Any] | None = None) -> list[Change]:
    sensitive = marked_paths(sensitive_before) + marked_paths(sensitive_after)
    found: list[tuple[sch.AttributePath, Any, Any]] = []
    _walk(before or {}, after or {}, (), found)
    out = []
    for path, b, a in found:
        if covered(path, sensitive):
            b = MASK if b is not None else None
            a = MASK if a is not None else None
        out.append(Change(sch.path_display(path), b, a))
    return out


def show(v: Any) -> str:
    if v == MASK:
        return MASK
    return json.dumps(v, ensure_ascii=False, sort_keys=True)
