"""What of a decrypted state kl may keep in PostgreSQL for its lifecycle index.

Users encrypt their state to keep its secrets out of plain storage, so by default the index of a
decrypted state holds every value the state marks sensitive (``sensitive_attributes``: what the
provider's schema or a sensitive variable made secret) as the mask kl drift shows, never the value.
Drift is then tracked on everything else: a change confined to masked values is not seen as
drift. A state whose settings opt in (``kl state set NAME --encryption-index-values``) is indexed
whole, as a plain state is.
"""
from __future__ import annotations

from typing import Any

from kilolock import sensitive, tfstate
from kilolock.redact import MASK
from kilolock.schema import AttributePath, GetAttr


def _has(container: Any, key: str | int) -> bool:
    if isinstance(container, dict):
        return isinstance(key, str) and key in container
    return isinstance(container, list) and isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(container)


def _mask_at(attributes: Any, path: AttributePath) -> None:
    """The value at PATH replaced by the mask; a path the value lacks (or a null) is left alone. A
    step a dynamic value's ``{"value", "type"}`` wrapper lacks is looked for inside its value, as
    kilolock.sensitive looks."""
    parent, keys = attributes, [step.name if isinstance(step, GetAttr) else step.key for step in path]
    for i, key in enumerate(keys):
        if isinstance(parent, dict) and key not in parent and tfstate.is_dynamic_wrapper(parent):
            parent = parent["value"]
        if not _has(parent, key):
            return
        if i == len(keys) - 1:
            if parent[key] is not None:
                parent[key] = MASK
            return
        parent = parent[key]


def mask_sensitive(doc: dict[str, Any]) -> dict[str, Any]:
    """DOC (a decoded state, changed in place and returned) with every marked value masked, and
    its outputs dropped: the index never reads them, and an output may hold any secret."""
    for res in doc.get("resources") or ():
        for obj in res.get("instances") or () if isinstance(res, dict) else ():
            if not isinstance(obj, dict) or not isinstance(obj.get("attributes"), dict):
                continue
            for path in sensitive.marked_paths(obj.get("sensitive_attributes")):
                _mask_at(obj["attributes"], path)
    doc["outputs"] = {}
    return doc
