"""What of a decrypted state kl may keep in PostgreSQL for its lifecycle index.

Users encrypt their state to keep its secrets out of plain storage, so by default the index of a
decrypted state holds every sensitive value as the mask kl drift shows, never the value. A value
is sensitive where the object's ``sensitive_attributes`` mark it (the provider's schema, or a
sensitive variable) or where a cached schema of its resource type says ``sensitive``: a state
written by OpenTofu < 1.8 or Terraform < 1.8, and a state-only command (``tofu state mv``) on one
since, lists none of the schema's, however new the OpenTofu that encrypts it.

A resource type kl has no cached schema of (``kl serve`` indexing OpenTofu's write before any
refresh of the state met its provider) cannot say which of its values are safe: every value of it
is masked, ``id`` included, until a write indexed after a refresh cached the schema. Drift is then
tracked on everything else: a change confined to masked values is not seen as drift. A state whose
settings opt in (``kl state set NAME --store-decrypted-attributes``) is indexed whole, as a plain
state is.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kilolock import drift, sensitive, tfstate
from kilolock.redact import MASK
from kilolock.schema import AttributePath, GetAttr

# (provider source, mode, type) wanted -> the cached schemas (JSON) of those that have one.
SchemaSource = Callable[[Iterable[tuple[str, str, str]]], drift.Schemas]


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


def _mask_all(attributes: dict[str, Any]) -> None:
    for key, value in attributes.items():
        if value is not None:
            attributes[key] = MASK


def _key(res: dict[str, Any]) -> tuple[str, str, str] | None:
    return drift.schema_key({"provider": res.get("provider"), "mode": res.get("mode"), "type": res.get("type")})


def mask_sensitive(doc: dict[str, Any], schemas: SchemaSource | None = None) -> dict[str, Any]:
    """DOC (a decoded state, changed in place and returned) with every sensitive value masked (the
    objects' marks and SCHEMAS', every value of a type without a cached schema), and its outputs
    dropped: the index never reads them, and an output may hold any secret."""
    resources = [res for res in doc.get("resources") or () if isinstance(res, dict)]
    cached = schemas({k for k in map(_key, resources) if k is not None}) if schemas is not None else {}
    for res in resources:
        key = _key(res)
        known = key is not None and bool(drift.schema_blocks(cached, key))
        for obj in res.get("instances") or ():
            if not isinstance(obj, dict):
                continue
            if isinstance(obj.get("attributes_flat"), dict):
                _mask_all(obj["attributes_flat"])  # flatmap: no schema path reaches inside it
            attributes = obj.get("attributes")
            if not isinstance(attributes, dict):
                continue
            if not known:
                _mask_all(attributes)
                continue
            paths = sensitive.marked_paths(obj.get("sensitive_attributes"))
            paths += drift.schema_sensitive(cached, key, attributes)
            for path in paths:
                _mask_at(attributes, path)
    doc["outputs"] = {}
    return doc
