"""Sensitive attribute paths: which parts of a resource object are secret, and where they are.

One module for every walk over sensitivity, whatever asks: the refresh (which paths to record, and
which values to feed the run's redactor), the state splice (which marks still apply) and drift
(which changes to mask). Paths are ``kilolock.schema.AttributePath``; provider wire messages never
get here (kilolock.provider converts ReadResource's sensitive paths before handing them over).

``sensitive_paths`` mirrors Terraform's ``configschema`` ``Block.SensitivePaths`` (>= 1.8), which
is what Terraform actually records after a refresh: every ``sensitive`` attribute, through nested
blocks and nested attributes, with an index step per element of a LIST (int) or MAP (string key).

Sets: Terraform indexes a set element by the element's own value, but cty cannot keep marks on
set elements; it hoists them onto the set as a whole, so what reaches ``sensitive_attributes`` is
the path of the set itself. We record exactly that: a set (of blocks or nested objects) whose
elements contain sensitive attributes is marked as a whole, once, when it has any element.
That is the conservative reading too: no sensitive value inside a set can escape unmarked.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from kilolock import tfstate
from kilolock.schema import (
    AttributePath,
    Block,
    GetAttr,
    Index,
    NestedObject,
    NestingMode,
    path_display,
    path_from_state_json,
    path_to_state_json,
)

# --- schema-sensitive paths ------------------------------------------------------------------------


def _unwrap_dynamic(value: Any) -> Any:
    """Blocks typed dynamic (LIST/MAP with dynamic contents) hold a ``{"type","value"}`` wrapper."""
    if isinstance(value, dict) and set(value) == {"type", "value"}:
        return value["value"]
    return value


def _elements(value: Any) -> list[tuple[int | str, Any]]:
    if isinstance(value, list):
        return list(enumerate(value))
    if isinstance(value, dict):
        return sorted(value.items())
    return []


def block_contains_sensitive(block: Block) -> bool:
    return any(a.sensitive or (a.nested_type is not None and _object_contains_sensitive(a.nested_type))
               for a in block.attributes) or any(block_contains_sensitive(nb.block) for nb in block.block_types)


def _object_contains_sensitive(obj: NestedObject) -> bool:
    return any(a.sensitive or (a.nested_type is not None and _object_contains_sensitive(a.nested_type))
               for a in obj.attributes)


def _block_paths(block: Block, value: Any, base: AttributePath, out: list[AttributePath]) -> None:
    if not isinstance(value, dict):
        return  # a null block has no sensitive parts
    for attr in block.attributes:
        path = base + (GetAttr(attr.name),)
        if attr.sensitive:
            out.append(path)
        elif attr.nested_type is not None and _object_contains_sensitive(attr.nested_type):
            _nested_paths(attr.nested_type, value.get(attr.name), path, out)
    for nested in block.block_types:
        if not block_contains_sensitive(nested.block):
            continue
        path = base + (GetAttr(nested.type_name),)
        child = _unwrap_dynamic(value.get(nested.type_name))
        if nested.nesting in (NestingMode.SINGLE, NestingMode.GROUP):
            _block_paths(nested.block, child, path, out)
        elif nested.nesting == NestingMode.SET:
            _set_paths(functools.partial(_block_paths, nested.block), child, path, out)
        else:
            for key, elem in _elements(child):
                _block_paths(nested.block, elem, path + (Index(key),), out)


def _nested_paths(obj: NestedObject, value: Any, base: AttributePath, out: list[AttributePath]) -> None:
    if value is None:
        return
    if obj.nesting == NestingMode.SINGLE:
        _object_paths(obj, value, base, out)
    elif obj.nesting == NestingMode.SET:
        _set_paths(lambda elem, p, acc: _object_paths(obj, elem, p, acc), value, base, out)
    else:
        for key, elem in _elements(value):
            _object_paths(obj, elem, base + (Index(key),), out)


def _object_paths(obj: NestedObject, value: Any, base: AttributePath, out: list[AttributePath]) -> None:
    if not isinstance(value, dict):
        return
    for attr in obj.attributes:
        path = base + (GetAttr(attr.name),)
        if attr.sensitive:
            out.append(path)
        elif attr.nested_type is not None and _object_contains_sensitive(attr.nested_type):
            _nested_paths(attr.nested_type, value.get(attr.name), path, out)


def _set_paths(element_paths: Callable[[Any, AttributePath, list[AttributePath]], None], value: Any,
               base: AttributePath, out: list[AttributePath]) -> None:
    """Mark the whole set once if any element would carry a sensitive mark (cty hoists them)."""
    if not isinstance(value, list):
        return
    for elem in value:
        found: list[AttributePath] = []
        element_paths(elem, base, found)
        if found:
            out.append(base)
            return


def sensitive_paths(block: Block, value: Any) -> list[AttributePath]:
    """Schema-sensitive paths of a decoded value (JSON bytes or parsed), unique and sorted the way
    Terraform sorts ``sensitive_attributes`` (by their display form)."""
    if isinstance(value, (bytes, bytearray, str)):
        value = json.loads(value)
    out: list[AttributePath] = []
    _block_paths(block, value, (), out)
    unique = {path_display(p): p for p in out}
    return [unique[k] for k in sorted(unique)]


# --- marks as state JSON (``sensitive_attributes``) -------------------------------------------------


def sensitive_attributes_json(paths: Iterable[AttributePath]) -> list[list[dict[str, Any]]]:
    """Paths in Terraform's state ``sensitive_attributes`` shape, deduplicated and sorted."""
    unique = {path_display(p): p for p in paths}
    return [path_to_state_json(unique[k]) for k in sorted(unique)]


def marked_paths(marks: Iterable[Any] | None) -> list[AttributePath]:
    """``sensitive_attributes`` of a state object as paths; malformed marks are skipped."""
    out = []
    for raw in marks or ():
        try:
            out.append(path_from_state_json(raw))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def merged_marks(prior: Iterable[Any], new: Iterable[AttributePath], value: Any) -> list[list[dict[str, Any]]]:
    """Prior marks ∪ new paths, kept only where the new value has them, sorted as Terraform sorts
    them (by their printed form), in state JSON shape. A malformed prior mark cannot be re-applied:
    Terraform would fail on it, kl drops it."""
    return sensitive_attributes_json(p for p in (*marked_paths(prior), *new) if _lookup(value, p)[0])


# --- values at paths --------------------------------------------------------------------------------


def _lookup(doc: Any, path: AttributePath) -> tuple[bool, Any]:
    """(True, the value at PATH inside DOC, a decoded JSON object) or (False, None) when absent.
    PATH is a cty path, which does not see how state JSON stores a dynamic value: a step that a
    ``{"value": ..., "type": ...}`` wrapper lacks is looked for inside its value."""
    value = doc
    for step in path:
        key = step.name if isinstance(step, GetAttr) else step.key
        if isinstance(value, dict) and key not in value and tfstate.is_dynamic_wrapper(value):
            value = value["value"]
        if isinstance(value, dict):
            if not isinstance(key, str) or key not in value:
                return False, None
            value = value[key]
        elif isinstance(value, list) and isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(value):
            value = value[key]
        else:
            return False, None
    return True, value


def values_at(doc: Any, paths: Iterable[AttributePath]) -> Iterator[Any]:
    """The values at PATHS inside DOC (a decoded JSON object); paths that do not exist are skipped."""
    for path in paths:
        found, value = _lookup(doc, path)
        if found:
            yield value


def covered(path: AttributePath, sensitive: Iterable[AttributePath]) -> bool:
    """Whether the value at PATH is secret: it sits at or below a sensitive path, or holds one below it."""
    return any(path[: len(s)] == s or s[: len(path)] == path for s in sensitive)
