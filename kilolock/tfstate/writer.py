"""Writing state back out, in Terraform's own layout.

jsonb keeps neither key order nor formatting, so `kl state pull` re-creates Terraform's own
layout: structs in their field order (statefile/version4.go), maps and cty values with sorted
keys, two-space indentation, Go's HTML-safe string escaping. A state Terraform wrote therefore
comes back byte-identical, and a pulled state diffs cleanly against Terraform's. An OpenTofu
envelope comes back as OpenTofu wrote it.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from kilolock.tfstate.checks import StateError
from kilolock.tfstate.exactjson import _GO_ESCAPES, _encode_string, _go_string, _Number, _write_compact, loads_exact
from kilolock.tfstate.parse import is_encrypted_envelope

TOP_LEVEL_ORDER = ("version", "terraform_version", "serial", "lineage", "outputs", "resources", "check_results")
OUTPUT_ORDER = ("value", "type", "sensitive")
RESOURCE_ORDER = ("module", "mode", "type", "name", "each", "provider", "instances")
INSTANCE_ORDER = (
    "index_key", "status", "deposed", "schema_version", "attributes", "attributes_flat", "sensitive_attributes",
    "identity_schema_version", "identity", "private", "dependencies", "create_before_destroy",
)
PATH_STEP_ORDER = ("type", "value")
DYNAMIC_ORDER = ("value", "type")  # ctyjson writes a dynamic value's wrapper value-first
CHECK_RESULT_ORDER = ("object_kind", "config_addr", "status", "objects")
CHECK_OBJECT_ORDER = ("object_addr", "status", "failure_messages")


def _sorted_deep(v: Any) -> Any:
    if isinstance(v, dict):
        if is_dynamic_wrapper(v):
            # ctyjson writes a value of a `dynamic` attribute (terraform_data's input and output,
            # terraform_remote_state's outputs) value-first; below it the type is concrete, so
            # nothing inside is such a wrapper.
            return {"value": _sorted_plain(v["value"]), "type": _sorted_plain(v["type"])}
        # Code point order is UTF-8's byte order (Go sorts map keys by their bytes): no key function.
        return {k: _sorted_deep(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [_sorted_deep(x) for x in v]
    return v


def _sorted_plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _sorted_plain(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [_sorted_plain(x) for x in v]
    return v


_PRIMITIVE_TYPES = {"string", "number", "bool"}


def is_dynamic_wrapper(v: Any) -> bool:
    """Whether V is how ctyjson wrote a dynamically typed value: an object of exactly ``value`` and
    ``type``, the type a type specification that the value fits. Without the provider's schema that
    is the only sign; an object attribute with exactly these two keys that happens to pass is laid
    out the same way (docs/reading-states.md)."""
    if not (isinstance(v, dict) and len(v) == 2 and "value" in v and "type" in v):
        return False
    try:
        return _fits(v["value"], v["type"])
    except RecursionError:
        return False


def _fits(value: Any, type_: Any) -> bool:
    if isinstance(type_, str):
        if type_ == "dynamic":
            return value is None
        if type_ not in _PRIMITIVE_TYPES:
            return False
        if value is None:
            return True
        if type_ == "string":
            return isinstance(value, str) and not isinstance(value, _Number)
        if type_ == "bool":
            return isinstance(value, bool)
        return isinstance(value, (int, float, _Number)) and not isinstance(value, bool)
    if not isinstance(type_, list) or len(type_) not in (2, 3) or not isinstance(type_[0], str):
        return False
    kind, inner = type_[0], type_[1]
    if len(type_) == 3 and kind != "object":
        return False
    if kind in ("list", "set"):
        return _type_ok(inner) and (value is None or (isinstance(value, list) and all(_fits(x, inner) for x in value)))
    if kind == "map":
        return _type_ok(inner) and (value is None or (isinstance(value, dict) and all(_fits(x, inner) for x in value.values())))
    if kind == "tuple":
        if not isinstance(inner, list) or not all(_type_ok(t) for t in inner):
            return False
        return value is None or (isinstance(value, list) and len(value) == len(inner)
                                 and all(_fits(x, t) for x, t in zip(value, inner, strict=True)))
    if kind == "object":
        if not isinstance(inner, dict) or not all(_type_ok(t) for t in inner.values()):
            return False
        return value is None or (isinstance(value, dict) and value.keys() == inner.keys()
                                 and all(_fits(value[k], t) for k, t in inner.items()))
    return False


def _type_ok(type_: Any) -> bool:
    """A well-formed type specification (what _fits accepts a null of)."""
    return type_ == "dynamic" or _fits(None, type_)


def _ordered(obj: Any, order: tuple[str, ...]) -> Any:
    if not isinstance(obj, dict):
        return obj
    out = {k: obj[k] for k in order if k in obj}
    out.update((k, v) for k, v in obj.items() if k not in out)
    return out


def _terraform_layout(doc: dict[str, Any]) -> dict[str, Any]:
    doc = _ordered(_sorted_deep(doc), TOP_LEVEL_ORDER)
    if isinstance(doc.get("outputs"), dict):
        doc["outputs"] = {k: _ordered(v, OUTPUT_ORDER) for k, v in doc["outputs"].items()}
    if isinstance(doc.get("resources"), list):
        doc["resources"] = [_ordered(r, RESOURCE_ORDER) for r in doc["resources"]]
        for r in doc["resources"]:
            if isinstance(r, dict) and isinstance(r.get("instances"), list):
                r["instances"] = [_instance_layout(i) for i in r["instances"]]
    if isinstance(doc.get("check_results"), list):
        doc["check_results"] = [_ordered(c, CHECK_RESULT_ORDER) for c in doc["check_results"]]
        for c in doc["check_results"]:
            if isinstance(c, dict) and isinstance(c.get("objects"), list):
                c["objects"] = [_ordered(o, CHECK_OBJECT_ORDER) for o in c["objects"]]
    return doc


def _instance_layout(inst: Any) -> Any:
    inst = _ordered(inst, INSTANCE_ORDER)
    if isinstance(inst, dict) and isinstance(inst.get("sensitive_attributes"), list):
        inst["sensitive_attributes"] = [
            [_step_layout(step) for step in path] if isinstance(path, list) else path
            for path in inst["sensitive_attributes"]
        ]
    return inst


def _step_layout(step: Any) -> Any:
    step = _ordered(step, PATH_STEP_ORDER)
    if isinstance(step, dict) and isinstance(step.get("value"), dict):
        step["value"] = _ordered(step["value"], DYNAMIC_ORDER)
    return step


_GO_ESCAPED = re.compile("[<>&\u2028\u2029]")


def _go_escaped(text: str) -> str:
    """JSON text with Go's escapes of what only a string can hold (so the whole text at once, not
    string by string: a translate per string was a fifth of a big pull's time)."""
    return text.translate(_GO_ESCAPES) if _GO_ESCAPED.search(text) else text


class _Streamed:
    """A list written item by item as it is produced (write_terraform_streamed): its length is
    known up front, its items are parsed, laid out and written one at a time."""

    def __init__(self, length: int, items: Iterator[Any], flush: Callable[[list[str]], None]) -> None:
        self.length = length
        self.items = items
        self.flush = flush

    def write(self, indent: str, out: list[str]) -> None:
        if not self.length:
            out.append("[]")
            return
        inner = indent + "  "
        out.append("[\n")
        n = -1
        for n, item in enumerate(self.items):
            out.append(inner)
            _write(item, inner, out)
            out.append(",\n" if n < self.length - 1 else "\n")
            if len(out) > _FLUSH_PIECES:
                self.flush(out)
        if n != self.length - 1:
            raise StateError(f"stored state changed while it was read ({n + 1} items where there were {self.length})")
        out.append(indent + "]")


_FLUSH_PIECES = 8192


def _write(v: Any, indent: str, out: list[str]) -> None:
    """Terraform's layout of V onto OUT, strings with Python's escapes: the text joined from OUT
    takes Go's (_go_escaped) before it is written."""
    if isinstance(v, _Streamed):
        v.write(indent, out)
    elif isinstance(v, dict):
        if not v:
            out.append("{}")
            return
        inner = indent + "  "
        out.append("{\n")
        for n, (k, item) in enumerate(v.items()):
            out.append(f"{inner}{_encode_string(k)}: ")  # Go's escapes: _go_escaped, over the whole text
            _write(item, inner, out)
            out.append(",\n" if n < len(v) - 1 else "\n")
        out.append(indent + "}")
    elif isinstance(v, list):
        if not v:
            out.append("[]")
            return
        inner = indent + "  "
        out.append("[\n")
        for n, item in enumerate(v):
            out.append(inner)
            _write(item, inner, out)
            out.append(",\n" if n < len(v) - 1 else "\n")
        out.append(indent + "]")
    elif isinstance(v, _Number):
        out.append(str.__str__(v))
    elif isinstance(v, str):
        out.append(_encode_string(v))
    elif v is None or v is True or v is False:
        out.append("null" if v is None else "true" if v else "false")
    elif type(v) is int:
        out.append(int.__repr__(v))  # what json.dumps writes, without an encoder per number
    else:
        out.append(json.dumps(v))


def dumps_terraform(doc: dict[str, Any]) -> str:
    """A state document in Terraform's own layout (see above); numbers from loads_exact stay exact."""
    out: list[str] = []
    _write(_terraform_layout(doc), "", out)
    out.append("\n")
    return _go_escaped("".join(out))


# A resource of write_terraform_streamed: the resource without its instances (JSON text), how many
# instances it has, and their JSON texts in order.
StreamedResource = tuple[str, int, Iterator[str]]


def write_terraform_streamed(head: str, resources: tuple[int, Iterator[StreamedResource]] | None,
                             write: Callable[[str], object]) -> None:
    """What ``pretty_state`` makes of a stored state, byte for byte, written piece by piece: HEAD is
    the document without "resources" (JSON text), RESOURCES their number and the resources, None
    when the document has no "resources" key. Only one instance is parsed at a time, so a big
    state is never held whole (as text, parsed, and laid out: pretty_state's three copies)."""
    doc = loads_exact(head)
    if not isinstance(doc, dict):
        raise StateError("stored state is not a JSON object")

    def flush(out: list[str]) -> None:
        write(_go_escaped("".join(out)))
        out.clear()

    def resource(text: str, count: int, instances: Iterator[str]) -> Any:
        res = _sorted_deep(loads_exact(text))
        if not isinstance(res, dict):
            raise StateError("stored state: a resource is not an object")
        res["instances"] = _Streamed(count, (_instance_layout(_sorted_deep(loads_exact(i))) for i in instances), flush)
        return _ordered(res, RESOURCE_ORDER)

    if resources is not None:
        count, items = resources
        doc["resources"] = _Streamed(count, (resource(*r) for r in items), flush)
    out: list[str] = []
    _write(_terraform_layout(doc), "", out)
    out.append("\n")
    flush(out)


def pretty_state(text: str) -> str:
    """State JSON (as stored) in Terraform's own layout."""
    doc = loads_exact(text)
    if not isinstance(doc, dict):
        raise StateError("stored state is not a JSON object")
    if is_encrypted_envelope(doc):
        return text + "\n"  # kept opaque, and given back as `kl serve` gives it
    return dumps_terraform(doc)


# OpenTofu marshals the envelope with Go's json.Marshal: compact, these fields in this order (its
# statedata then basedata structs), map keys sorted, Go's escaping, no final newline.
ENVELOPE_ORDER = ("serial", "lineage", "meta", "encrypted_data", "encryption_version")


def envelope_as_written(text: str, sha256_hex: str) -> str | None:
    """An encrypted envelope stored as JSON (``text``: its keys and spacing are PostgreSQL's) laid
    out again as OpenTofu writes it, when that gives back the very bytes whose SHA-256 was
    ``sha256_hex`` (what was stored); None when the envelope was written some other way."""
    import hashlib

    doc = loads_exact(text)
    if not isinstance(doc, dict):
        return None
    laid = _ordered(doc, ENVELOPE_ORDER)
    if isinstance(laid.get("meta"), dict):
        laid["meta"] = dict(sorted(laid["meta"].items()))
    out: list[str] = []
    _write_compact(laid, out, _go_string)
    compact = "".join(out)
    for candidate in (compact, compact + "\n"):
        if hashlib.sha256(candidate.encode()).hexdigest() == sha256_hex:
            return candidate
    return None
