"""What changed inside one resource instance, for people: attribute paths with before/after,
sensitive values masked; and the drift document (`kl drift --format json`, the drift API) built
from drift record rows."""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kilolock import schema as sch
from kilolock import tfstate
from kilolock.redact import MASK
from kilolock.sensitive import marked_paths, sensitive_paths


@dataclass(frozen=True)
class Change:
    """One attribute that differs between the stored object and the one read back."""

    path: str  # Terraform's printed form (schema.path_display): triggers["k"], member[={"name":"eve"}]
    before: Any
    after: Any


# --- shapes: what a schema says each part of a value is ------------------------------------------
#
# A path step is an attribute (``.name``) or a map key (``["k"]``) or a list index (``[0]``) by
# what the schema says is there, not by how the JSON looks: a single nested attribute, an object
# attribute and a nested block are objects (``single.n``), a map attribute or a map nested
# attribute has keys (``tags["env"]``). A dynamic value is stored as Terraform's
# ``{"value": ..., "type": ...}`` wrapper; the path goes through it (``dyn.x``, never
# ``dyn["value"]``) as the wrapper's type says. A set is compared as a set.


@dataclass(frozen=True, eq=False)
class _Obj:
    """The shape of an object or block: its attributes by name."""

    fields: dict[str, Shape]  # a resource type has 150 attributes at times: found by name

    def field(self, name: str) -> Shape:
        return self.fields.get(name, _ANY)


@dataclass(frozen=True)
class _Coll:
    """The shape of a list, set or map: one shape for every element."""

    kind: str  # list | set | map
    elem: Shape


@dataclass(frozen=True)
class _Tuple:
    """The shape of a tuple: one shape per position."""

    elems: tuple[Shape, ...]


@dataclass(frozen=True)
class _Leaf:
    """A shape with nothing inside to compare by name."""

    kind: str  # primitive | dynamic | any (no schema: the keys' kind is guessed)


_PRIM, _DYN, _ANY = _Leaf("primitive"), _Leaf("dynamic"), _Leaf("any")
Shape = _Obj | _Coll | _Tuple | _Leaf

_PRIMITIVES = frozenset(("string", "number", "bool"))


def _is_type(t: Any) -> bool:
    """Whether T is a cty type in JSON (``"string"``, ``["list", "number"]``, ...)."""
    if isinstance(t, str):
        return t in _PRIMITIVES or t == "dynamic"
    if not isinstance(t, list) or not t:
        return False
    if t[0] in ("list", "set", "map"):
        return len(t) == 2 and _is_type(t[1])
    if t[0] == "object":
        return len(t) in (2, 3) and isinstance(t[1], dict) and all(_is_type(v) for v in t[1].values())
    if t[0] == "tuple":
        return len(t) == 2 and isinstance(t[1], list) and all(_is_type(v) for v in t[1])
    return False


def is_dynamic_wrapper(value: Any) -> bool:
    """A dynamic value as Terraform stores it: ``{"value": V, "type": T}``, T a cty type. Without a
    schema this is how one is recognised (a map whose only keys are ``type`` and ``value``, the
    first a type name, would be taken for one)."""
    return isinstance(value, dict) and len(value) == 2 and "value" in value and "type" in value and _is_type(value["type"])


def _type_shape(t: Any) -> Shape:
    if t == "dynamic":
        return _DYN
    if isinstance(t, str):
        return _PRIM
    if isinstance(t, list) and t and t[0] in ("list", "set", "map") and len(t) == 2:
        return _Coll(t[0], _type_shape(t[1]))
    if isinstance(t, list) and t and t[0] == "object" and len(t) >= 2 and isinstance(t[1], dict):
        return _Obj({k: _type_shape(v) for k, v in t[1].items()})
    if isinstance(t, list) and t and t[0] == "tuple" and len(t) == 2 and isinstance(t[1], list):
        return _Tuple(tuple(_type_shape(v) for v in t[1]))
    return _ANY


def _has_dynamic_attributes(block: sch.Block) -> bool:
    def in_object(obj: sch.NestedObject) -> bool:
        return any(_attr_dynamic(a) for a in obj.attributes)

    def _attr_dynamic(a: sch.Attribute) -> bool:
        return (a.type is not None and b'"dynamic"' in a.type) or (a.nested_type is not None and in_object(a.nested_type))

    return any(_attr_dynamic(a) for a in block.attributes) or any(_has_dynamic_attributes(nb.block) for nb in block.block_types)


def _nested(obj: Shape, nesting: sch.NestingMode) -> Shape:
    if nesting in (sch.NestingMode.SINGLE, sch.NestingMode.GROUP):
        return obj
    return _Coll({sch.NestingMode.LIST: "list", sch.NestingMode.SET: "set", sch.NestingMode.MAP: "map"}.get(nesting, "list"), obj)


def _attribute_shape(attr: sch.Attribute) -> Shape:
    if attr.nested_type is not None:
        obj = _Obj({a.name: _attribute_shape(a) for a in attr.nested_type.attributes})
        return _nested(obj, attr.nested_type.nesting)
    if attr.type is not None:
        return _type_shape(json.loads(attr.type))
    return _ANY


# Block -> its shape, by the block's identity (kept alive here, so an id is not reused while its
# entry stands): hashing a 150-attribute Block on every call would cost more than the walk.
_SHAPES: dict[int, tuple[sch.Block, Shape]] = {}


def block_shape(block: sch.Block) -> Shape:
    hit = _SHAPES.get(id(block))
    if hit is None or hit[0] is not block:
        if len(_SHAPES) > 4096:
            _SHAPES.clear()
        hit = _SHAPES[id(block)] = (block, _block_shape(block))
    return hit[1]


def _block_shape(block: sch.Block) -> Shape:
    """The shape of a resource object of BLOCK. A LIST or MAP of blocks holding a dynamic attribute
    is itself dynamic to Terraform (a tuple or object of its own type), and stored wrapped."""
    fields = {a.name: _attribute_shape(a) for a in block.attributes}
    for nb in block.block_types:
        if nb.nesting in (sch.NestingMode.LIST, sch.NestingMode.MAP) and _has_dynamic_attributes(nb.block):
            fields[nb.type_name] = _DYN
        else:
            fields[nb.type_name] = _nested(block_shape(nb.block), nb.nesting)
    return _Obj(fields)


def stored_steps(block: sch.Block, path: sch.AttributePath) -> list[str]:
    """PATH, in schema terms (``manifest.metadata.name``), as jsonb path steps into the attributes
    as stored: through the ``{"value": ..., "type": ...}`` wrapper of each dynamic value on the way
    (``{manifest,value,metadata,name}``), by the rules the shapes above follow. Below a dynamic
    attribute the value's own type is concrete: nothing there is wrapped again. A step the schema
    does not know is taken as it is."""
    steps: list[str] = []
    node: _Node = block
    for step in path:
        key = step.name if isinstance(step, sch.GetAttr) else step.key
        steps.append(str(key))
        node, wrapped = _stored_child(node, key)
        if wrapped:
            steps.append("value")
    return steps


@dataclass(frozen=True)
class _Each:
    """In stored_steps: a nested collection (of blocks or of nested attributes' objects), whose
    every element is ELEMENT."""

    element: sch.Block | tuple[sch.Attribute, ...]


# What stored_steps stands on: a block, the attributes of a nested object, a nested collection, a cty
# type in JSON, or None (the schema says nothing from here on).
_Node = sch.Block | tuple[sch.Attribute, ...] | _Each | Any


def _stored_child(node: _Node, key: str | int) -> tuple[_Node, bool]:
    """The node under KEY, and whether its value is stored wrapped."""
    if isinstance(node, sch.Block):
        for nb in node.block_types:
            if nb.type_name == key:
                if nb.nesting in (sch.NestingMode.SINGLE, sch.NestingMode.GROUP):
                    return nb.block, False
                wrapped = nb.nesting in (sch.NestingMode.LIST, sch.NestingMode.MAP) and _has_dynamic_attributes(nb.block)
                return _Each(nb.block), wrapped
        return _stored_child(node.attributes, key)
    if isinstance(node, _Each):
        return node.element, False
    if isinstance(node, tuple):  # a nested object's attributes
        attr = next((a for a in node if a.name == key), None)
        if attr is None:
            return None, False
        if attr.nested_type is not None:
            inner = attr.nested_type.attributes
            return (inner if attr.nested_type.nesting in (sch.NestingMode.SINGLE, sch.NestingMode.GROUP) else _Each(inner)), False
        return _typed(json.loads(attr.type) if attr.type is not None else None)
    if isinstance(node, list) and len(node) == 2:  # a cty type: [list|set|map, elem], [object, attrs], [tuple, elems]
        kind, inner = node
        if kind in ("list", "set", "map"):
            t = inner
        elif kind == "object" and isinstance(inner, dict):
            t = inner.get(key)
        elif kind == "tuple" and isinstance(inner, list) and isinstance(key, int) and 0 <= key < len(inner):
            t = inner[key]
        else:
            return None, False
        return _typed(t)
    return None, False


def _typed(t: Any) -> tuple[_Node, bool]:
    """A value of cty type T: a dynamic one is wrapped, and its own type, below, is concrete."""
    return (None, True) if t == "dynamic" else (t, False)


def choose_block(blocks: Sequence[sch.Block], *values: Any) -> sch.Block | None:
    """Of several cached schemas of one resource type (one per provider version), the one whose
    top-level names are exactly those of VALUES, else one that has them all, else the first."""
    if len(blocks) < 2:
        return blocks[0] if blocks else None
    names = [{a.name for a in b.attributes} | {n.type_name for n in b.block_types} for b in blocks]
    keys = [set(v) for v in values if isinstance(v, dict)]
    for exact in (True, False):
        for want in keys:
            for block, have in zip(blocks, names, strict=True):
                if have == want if exact else have >= want:
                    return block
    return blocks[0]


# --- the walk --------------------------------------------------------------------------------------


def plain(value: Any, shape: Shape = _ANY) -> Any:
    """VALUE with every dynamic wrapper replaced by the value it wraps: what a person reads."""
    if shape is _PRIM or value is None:
        return value
    if (shape is _DYN or shape is _ANY) and is_dynamic_wrapper(value):
        return plain(value["value"], _type_shape(value["type"]))
    if isinstance(value, dict):
        if isinstance(shape, _Obj):
            return {k: plain(v, shape.field(k)) for k, v in value.items()}
        elem = shape.elem if isinstance(shape, _Coll) else _ANY
        return {k: plain(v, elem) for k, v in value.items()}
    if isinstance(value, list):
        if isinstance(shape, _Tuple) and len(shape.elems) == len(value):
            return [plain(v, s) for v, s in zip(value, shape.elems, strict=True)]
        elem = shape.elem if isinstance(shape, _Coll) else _ANY
        return [plain(v, elem) for v in value]
    return value


_Found = list[tuple[sch.DriftPath, Any, Any]]


class _Walk:
    def __init__(self, sensitive: list[tuple[Any, ...]]) -> None:
        self.sensitive = sensitive
        self.found: _Found = []

    def report(self, path: sch.DriftPath, before: Any, after: Any, shape: Shape) -> None:
        self.found.append((path, plain(before, shape), plain(after, shape)))

    def walk(self, before: Any, after: Any, path: sch.DriftPath, shape: Shape) -> None:
        if before == after:
            return
        if shape is _DYN or (shape is _ANY and (is_dynamic_wrapper(before) or is_dynamic_wrapper(after))):
            # Through the wrapper, by its type; a value whose type changed is shown whole.
            if is_dynamic_wrapper(before) and is_dynamic_wrapper(after) and before["type"] == after["type"]:
                self.walk(before["value"], after["value"], path, _type_shape(after["type"]))
            else:
                self.report(path, before, after, _DYN)
            return
        keyed = isinstance(shape, _Obj) or shape is _ANY or (isinstance(shape, _Coll) and shape.kind == "map")
        if keyed and isinstance(before, dict) and isinstance(after, dict):
            for k in sorted(set(before) | set(after)):
                step: sch.DriftStep
                if isinstance(shape, _Obj):
                    step, child = sch.GetAttr(k), shape.field(k)
                elif isinstance(shape, _Coll):
                    step, child = sch.Index(k), shape.elem
                else:
                    # Without the schema, an object attribute cannot always be told from a map key:
                    # top-level keys are attributes, and so are the keys of a list or set element (a
                    # nested block, rule[0].cidr); other keys print as map keys (tags["env"]).
                    step = sch.GetAttr(k) if not path or _is_element(path[-1]) else sch.Index(k)
                    child = _ANY
                self.walk(before.get(k), after.get(k), path + (step,), child)
            return
        if isinstance(before, list) and isinstance(after, list):
            if isinstance(shape, _Coll) and shape.kind == "set" and not self._secret(path):
                self._set(before, after, path, shape.elem)
                return
            if len(before) == len(after) and not (isinstance(shape, _Coll) and shape.kind == "set"):
                for i, (b, a) in enumerate(zip(before, after, strict=True)):
                    child = shape.elem if isinstance(shape, _Coll) else (
                        shape.elems[i] if isinstance(shape, _Tuple) and i < len(shape.elems) else _ANY)
                    self.walk(b, a, path + (sch.Index(i),), child)
                return
        self.report(path, before, after, shape)

    def _secret(self, path: sch.DriftPath) -> bool:
        """A set with a secret at, above or inside it is shown whole (masked): its elements would
        carry the secret in their path."""
        loose = _loose(path)
        return any(loose[: len(s)] == s or s[: len(loose)] == loose for s in self.sensitive)

    def _set(self, before: list[Any], after: list[Any], path: sch.DriftPath, elem: Shape) -> None:
        """Elements removed, then elements added, each in their printed order; an element in both
        is no change wherever it sits."""
        def counted(values: list[Any]) -> dict[str, tuple[int, Any]]:
            out: dict[str, tuple[int, Any]] = {}
            for v in values:
                shown = plain(v, elem)
                key = sch.element_json(shown)
                out[key] = (out.get(key, (0, shown))[0] + 1, shown)
            return out

        b, a = counted(before), counted(after)
        for key in sorted(b):
            n, shown = b[key]
            if n > a.get(key, (0, None))[0]:
                self.found.append((path + (sch.Element(shown),), shown, None))
        for key in sorted(a):
            n, shown = a[key]
            if n > b.get(key, (0, None))[0]:
                self.found.append((path + (sch.Element(shown),), None, shown))


def _is_element(step: sch.DriftStep) -> bool:
    return isinstance(step, sch.Index) and isinstance(step.key, int)


def _loose(path: sch.DriftPath) -> tuple[Any, ...]:
    """PATH with attribute and map-key steps alike: the walk guesses which a key is without a
    schema, Terraform's marks know, and a guess must never unmask a secret."""
    return tuple(step.name if isinstance(step, sch.GetAttr) else
                 ("=", sch.element_json(step.value)) if isinstance(step, sch.Element) else step.key for step in path)


def changes(before: dict[str, Any] | None, after: dict[str, Any] | None,
            sensitive_before: list[Any] | None = None, sensitive_after: list[Any] | None = None,
            schema_sensitive: Iterable[sch.AttributePath] = (), block: sch.Block | None = None) -> list[Change]:
    """Attribute-level changes, values masked at paths marked in either object or SCHEMA_SENSITIVE.
    BLOCK, the resource type's schema, says which keys are attributes and which are map keys, where
    dynamic values are and which lists are sets; without it keys are guessed (above)."""
    marked = marked_paths(sensitive_before) + marked_paths(sensitive_after) + list(schema_sensitive)
    sensitive = [_loose(p) for p in marked]
    walk = _Walk(sensitive)
    walk.walk(before or {}, after or {}, (), block_shape(block) if block is not None else _ANY)
    out = []
    for path, b, a in walk.found:
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


# --- cached schemas of the objects' providers ------------------------------------------------------

Schemas = Mapping[tuple[str, str, str], list[Any]]


def schema_key(row: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(provider source, mode, type) of an object: whose cached schemas describe it. None for a
    provider address that does not parse (stored as Terraform wrote it: it has no schema)."""
    try:
        return tfstate.parse_provider(row["provider"]).source, row.get("mode") or "managed", row["type"]
    except (tfstate.StateError, KeyError, TypeError, AttributeError):
        return None


def schema_keys(rows: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    return {k for k in map(schema_key, rows) if k is not None}


# Cached schema JSON -> Block, by the JSON object's identity (kept alive here, so an id is not
# reused while its entry stands); a diff or drift document parses each schema once.
_PARSED: dict[int, tuple[Any, sch.Block]] = {}


def schema_blocks(schemas: Schemas, key: tuple[str, str, str] | None) -> list[sch.Block]:
    out = []
    for raw in schemas.get(key, ()) if key is not None else ():
        hit = _PARSED.get(id(raw))
        if hit is None or hit[0] is not raw:
            if len(_PARSED) > 1024:
                _PARSED.clear()
            hit = _PARSED[id(raw)] = (raw, sch.schema_from_json(raw).block)
        out.append(hit[1])
    return out


def schema_sensitive(schemas: Schemas, key: tuple[str, str, str] | None, *values: Any) -> list[sch.AttributePath]:
    """Paths any cached schema of KEY calls sensitive in any of VALUES (attribute objects; one
    schema per provider version kl has seen: a mismatched shape only finds fewer paths). A state
    written by Terraform < 1.8, OpenTofu < 1.8, or a state-only command since, does not list them
    all in ``sensitive_attributes``; Terraform masks them from the schema all the same."""
    paths: list[sch.AttributePath] = []
    for block in schema_blocks(schemas, key):
        for value in values:
            if isinstance(value, dict):
                paths += sensitive_paths(block, value)
    return paths


def entry(r: Mapping[str, Any], schemas: Schemas | None = None) -> dict[str, Any]:
    """One drift record row (store.drift.list_drift) as the document's entry. A deleted object's
    every attribute "→ null" says nothing more than "deleted", so its changes are empty. SCHEMAS
    (store.history.cached_schemas) give the paths their shape (``changes``)."""
    key = schema_key(r)
    block = choose_block(schema_blocks(schemas or {}, key), r["current_attributes"], r["previous_attributes"])
    changed = [] if r["drift_kind"] == "deleted" else changes(
        r["previous_attributes"], r["current_attributes"], r["previous_sensitive_attributes"], r["current_sensitive_attributes"],
        schema_sensitive(schemas or {}, key, r["previous_attributes"], r["current_attributes"]), block=block)
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
        # serials are Terraform's; an observation (v7.3) carries its base's, so the versions are named too
        "detected_serial": r["detected_serial"], "detected_version": r.get("detected_version"),
        "detected_at": r["detected_at"],
        "first_detected": {"serial": r["first_detected_serial"], "version": r.get("first_detected_version"),
                           "at": r["first_detected_at"]},
        "last_confirmed_serial": r["last_confirmed_serial"],
        "last_confirmed_version": r.get("last_confirmed_version"),
        "open_for_s": int(open_for.total_seconds()),
        "resolved": resolved,
        # the ignore rules that hide this open record (kl drift ignore): the oldest, and all of them
        "ignored_by": ignored,
        "refresh_run_id": str(r["refresh_run_id"]) if r["refresh_run_id"] else None,
        "changed_attributes": r["changed_attributes"],
        "changes": [{"path": c.path, "before": c.before, "after": c.after} for c in changed],
    }


def document(state: str, rows: Iterable[Mapping[str, Any]], *, total: int, open_count: int, ignored_count: int,
             include_resolved: bool, schemas: Schemas | None = None) -> dict[str, Any]:
    """The drift document: ``total`` entries match the selection (open ones, or all with
    ``include_resolved``: ignored and resolved ones too), ``rows`` may be fewer (a limit); ``open``
    is the open count (ignored records left out), exactly what ``kl status`` says; ``ignored`` the
    open records an ignore rule hides."""
    return {"version": 1, "state": state, "all": include_resolved, "total": total, "open": open_count,
            "ignored": ignored_count, "drift": [entry(r, schemas) for r in rows]}
