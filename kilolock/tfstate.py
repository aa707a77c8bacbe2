"""Terraform state (format version 4): parsing, validation and instance addresses.

The parsed form keeps every instance object as the dict Terraform wrote, so a state that goes
in comes back out with nothing lost; what this module adds is validation with a JSON path in
every error, and the addresses Terraform prints (``module.a["x"].null_resource.b[0]``).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kilolock.errors import KlError

InstanceKey = int | str | None


class StateError(KlError):
    """The state file is not a Terraform state Kilolock can store; the message says where."""


# --- addresses ---------------------------------------------------------------------------------


def hcl_quoted(s: str) -> str:
    """A string as Terraform prints it inside an address: HCL quoted-template escaping."""
    out = ['"']
    for i, ch in enumerate(s):
        if ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "$%":
            # "${" and "%{" would start a template sequence; Terraform doubles the introducer.
            out.append(ch * 2 if s[i + 1 : i + 2] == "{" else ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def format_key(key: InstanceKey) -> str:
    if key is None:
        return ""
    if isinstance(key, int):
        return f"[{key}]"
    return f"[{hcl_quoted(key)}]"


def instance_address(module: str, mode: str, type_: str, name: str, key: InstanceKey) -> str:
    local = f"{'data.' if mode == 'data' else ''}{type_}.{name}{format_key(key)}"
    return f"{module}.{local}" if module else local


# --- the parsed state --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProviderRef:
    """``provider["registry.terraform.io/hashicorp/null"].alias`` split into its parts."""

    source: str  # registry.terraform.io/hashicorp/null
    alias: str  # "" when not aliased
    module: str  # the module prefix, e.g. "module.child" ("" for root)

    @property
    def type(self) -> str:
        return self.source.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)  # slots: a 100,000-instance state has 100,000 of them
class Instance:
    address: str
    deposed: str  # "" for the current object
    module: str
    mode: str
    type: str
    name: str
    index_key: InstanceKey
    provider: str  # the provider string exactly as in state
    resource_index: int  # position in state["resources"]
    instance_index: int  # position in that resource's "instances"
    obj: dict[str, Any]  # the instance object as Terraform wrote it (empty in an index: parse_state(keep_objects=False))

    @property
    def schema_version(self) -> int:
        return int(self.obj.get("schema_version", 0))


@dataclass
class State:
    raw: dict[str, Any]
    instances: list[Instance]

    @property
    def serial(self) -> int:
        return int(self.raw["serial"])

    @property
    def lineage(self) -> str:
        return str(self.raw["lineage"])

    @property
    def terraform_version(self) -> str:
        return str(self.raw.get("terraform_version", ""))

    def managed(self) -> Iterator[Instance]:
        return (i for i in self.instances if i.mode == "managed")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_text(data: bytes, origin: str = "state") -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateError(f"{origin}: not UTF-8 text (byte {exc.start})") from None


def load_json(data: bytes | str, origin: str = "state") -> dict[str, Any]:
    if isinstance(data, bytes):
        data = decode_text(data, origin)
    if not data or data.isspace():  # not strip(): a copy of a whole big state
        raise StateError(f"{origin}: empty input, expected a Terraform state (JSON)")
    try:
        doc = json.loads(data, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise StateError(f"{origin}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # NaN/Infinity, or a number too deep for the parser
        raise StateError(f"{origin}: not valid JSON: {exc}") from None
    except RecursionError:
        raise StateError(f"{origin}: not valid JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise StateError(f"{origin}: expected a JSON object at the top level, got {_kind(doc)}")
    if _nested_deeper_than(doc, MAX_NESTING):
        raise StateError(f"{origin}: JSON nested deeper than {MAX_NESTING} levels; no Terraform state is, "
                         "and kl could not lay it out again for `state pull`")
    return doc


# Writing a state back out (pretty_state, used by `kl state pull` and GET in `kl serve`) recurses
# once or twice per level, so a document that json.loads still takes (~1,000 levels) could be
# stored and then never read back. Real states nest about 6 levels plus their attribute values,
# which the codec caps at 64 (codec.MAX_DEPTH).
MAX_NESTING = 128


def _nested_deeper_than(doc: Any, limit: int) -> bool:
    # Level by level, with exact type checks (json.loads makes plain dicts and lists): about a
    # tenth of parse_state's time on a 10,000-instance state.
    level, depth = [doc], 1
    while level:
        if depth > limit:
            return True
        deeper = []
        for value in level:
            for item in value.values() if type(value) is dict else value:
                if type(item) is dict or type(item) is list:
                    deeper.append(item)
        level, depth = deeper, depth + 1
    return False


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def is_encrypted_envelope(doc: dict[str, Any]) -> bool:
    """OpenTofu's client-side encrypted state: ``{"meta":…, "encrypted_data":…, "encryption_version":…}``."""
    return "encryption_version" in doc and "encrypted_data" in doc


def _expect(cond: bool, path: str, msg: str) -> None:
    if not cond:
        raise StateError(f"{path}: {msg}")


def _expect_type(v: Any, types: type | tuple[type, ...], path: str, what: str) -> None:
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)))
    if not ok:
        raise StateError(f"{path}: expected {what}, got {_kind(v)}")


def parse_provider(s: str, path: str = "provider") -> ProviderRef:
    """Parse an AbsProviderConfig string: ``[module.x.]provider["host/ns/type"][.alias]``."""
    head, sep, rest = s.partition('provider["')
    _expect(bool(sep), path, f'provider address {s!r} is not of the form provider["HOST/NAMESPACE/TYPE"]')
    module = head.removesuffix(".")
    _expect(head == "" or head.endswith("."), path, f"provider address {s!r} has a malformed module prefix")
    source, sep, tail = rest.partition('"]')
    _expect(bool(sep) and source.count("/") == 2 and all(source.split("/")), path,
            f"provider address {s!r}: source must be HOST/NAMESPACE/TYPE")
    alias = ""
    if tail:
        _expect(tail.startswith(".") and len(tail) > 1, path, f"provider address {s!r} has trailing text {tail!r}")
        alias = tail[1:]
    return ProviderRef(source=source, alias=alias, module=module)


_NO_OBJECT: dict[str, Any] = {}


class _Owned:
    """Copies of the document's strings and numbers an index keeps, one per distinct value.

    The parsed document is freed once validated, but Python returns a memory arena to the system
    only when nothing in it is left: one index key per instance, still referenced, kept every arena
    of a 100,000-instance document (85 MiB) resident."""

    def __init__(self) -> None:
        self._copies: dict[object, Any] = {}

    def __call__(self, value: Any) -> Any:
        if type(value) is int:
            return int(str(value)) if not -5 <= value <= 256 else value  # small ints are shared already
        if type(value) is not str or not value:
            return value
        copy = self._copies.get(value)
        if copy is None:
            copy = self._copies[value] = value.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")
        return copy


def parse_state(data: bytes | str | dict[str, Any], origin: str = "state", *, keep_objects: bool = True) -> State:
    """Validate a Terraform state v4 document and index its resource instances.

    ``keep_objects=False`` makes an index, for storing the document's bytes as they are: its
    instances carry no objects (an empty dict) and its ``raw`` only the top-level fields, so the
    parsed document (several times the size of its text) is freed as soon as it is validated."""
    doc = data if isinstance(data, dict) else load_json(data, origin)
    if is_encrypted_envelope(doc):
        raise StateError(
            f"{origin}: this is an OpenTofu-encrypted state (encryption_version "
            f"{doc.get('encryption_version')!r}); Kilolock cannot index or refresh encrypted state"
        )
    version = doc.get("version")
    _expect("version" in doc, f"{origin}.version", "missing; not a Terraform state file")
    _expect_type(version, int, f"{origin}.version", "a number")
    if version != 4:
        hint = " (Terraform 0.11 or older); upgrade it with Terraform 0.12+ first" if version in (1, 2, 3) else ""
        raise StateError(f"{origin}.version: state format version {version} is not supported, only 4{hint}")
    for key in ("serial", "lineage"):
        _expect(key in doc, f"{origin}.{key}", "missing")
    _expect_type(doc["serial"], int, f"{origin}.serial", "a number")
    _expect(doc["serial"] >= 0, f"{origin}.serial", "must not be negative")
    _expect_type(doc["lineage"], str, f"{origin}.lineage", "a string")
    _expect(doc["lineage"] != "", f"{origin}.lineage", "must not be empty")
    if "terraform_version" in doc:
        _expect_type(doc["terraform_version"], str, f"{origin}.terraform_version", "a string")
    if "outputs" in doc:
        _expect_type(doc["outputs"], dict, f"{origin}.outputs", "an object")
        for oname, out in doc["outputs"].items():
            _expect_type(out, dict, f"{origin}.outputs.{oname}", "an object")
            _expect("value" in out, f"{origin}.outputs.{oname}", "missing value")
    resources = doc.get("resources", [])
    _expect_type(resources, list, f"{origin}.resources", "an array")

    instances: list[Instance] = []
    seen: set[str | tuple[str, str]] = set()  # an address alone for a current object: half the memory
    owned = _Owned()
    for ri, res in enumerate(resources):
        rpath = f"{origin}.resources[{ri}]"
        _expect_type(res, dict, rpath, "an object")
        for key in ("mode", "type", "name", "provider", "instances"):
            _expect(key in res, f"{rpath}.{key}", "missing")
        mode, type_, name = res["mode"], res["type"], res["name"]
        _expect(mode in ("managed", "data"), f"{rpath}.mode", f"must be \"managed\" or \"data\", got {mode!r}")
        _expect_type(type_, str, f"{rpath}.type", "a string")
        _expect_type(name, str, f"{rpath}.name", "a string")
        _expect(bool(type_) and bool(name), rpath, "type and name must not be empty")
        _expect_type(res["provider"], str, f"{rpath}.provider", "a string")
        parse_provider(res["provider"], f"{rpath}.provider")
        module = res.get("module", "")
        _expect_type(module, str, f"{rpath}.module", "a string")
        _expect(module == "" or module.startswith("module."), f"{rpath}.module", f"{module!r} is not a module address")
        _expect_type(res["instances"], list, f"{rpath}.instances", "an array")
        for ii, obj in enumerate(res["instances"]):
            ipath = f"{rpath}.instances[{ii}]"
            _expect_type(obj, dict, ipath, "an object")
            if "attributes_flat" in obj and "attributes" not in obj:
                raise StateError(
                    f"{ipath}.attributes_flat: legacy flatmap attributes (Terraform 0.11 era) are not supported; "
                    "refresh the state with Terraform 0.12+ first"
                )
            _expect("attributes" in obj, f"{ipath}.attributes", "missing")
            _expect_type(obj["attributes"], dict, f"{ipath}.attributes", "an object")
            if "schema_version" in obj:
                _expect_type(obj["schema_version"], int, f"{ipath}.schema_version", "a number")
            key = obj.get("index_key")
            _expect(key is None or (isinstance(key, (int, str)) and not isinstance(key, bool)),
                    f"{ipath}.index_key", f"expected a number or a string, got {_kind(key)}")
            deposed = obj.get("deposed", "")
            _expect_type(deposed, str, f"{ipath}.deposed", "a string")
            if "sensitive_attributes" in obj:
                _expect_type(obj["sensitive_attributes"], list, f"{ipath}.sensitive_attributes", "an array")
            if "status" in obj:
                _expect(obj["status"] in ("tainted",), f"{ipath}.status", f"unknown status {obj['status']!r}")
            address = instance_address(module, mode, type_, name, key)
            identity = (address, deposed) if deposed else address
            _expect(identity not in seen, ipath, f"duplicate instance {address}" + (f" (deposed {deposed})" if deposed else ""))
            seen.add(identity)
            if keep_objects:
                instances.append(Instance(address, deposed, module, mode, type_, name, key, res["provider"], ri, ii, obj))
            else:
                instances.append(Instance(address, owned(deposed), owned(module), owned(mode), owned(type_), owned(name),
                                          owned(key), owned(res["provider"]), ri, ii, _NO_OBJECT))
    if not keep_objects:
        return State(raw={k: v for k, v in doc.items() if k != "resources"}, instances=instances)
    return State(raw=doc, instances=instances)


# Terraform writes keys in these orders (statefile/version4.go); `kl state pull` restores them,
# since jsonb does not keep key order, so a pulled state diffs cleanly against Terraform's own.
TOP_LEVEL_ORDER = ("version", "terraform_version", "serial", "lineage", "outputs", "resources", "check_results")
RESOURCE_ORDER = ("module", "mode", "type", "name", "each", "provider", "instances")
INSTANCE_ORDER = (
    "index_key", "status", "deposed", "schema_version", "attributes", "attributes_flat", "sensitive_attributes",
    "identity_schema_version", "identity", "private", "dependencies", "create_before_destroy",
)


# --- writing state back out --------------------------------------------------------------------
#
# jsonb keeps neither key order nor formatting, so `kl state pull` re-creates Terraform's own
# layout: structs in their field order (statefile/version4.go), maps and cty values with sorted
# keys, two-space indentation, Go's HTML-safe string escaping. A state Terraform wrote therefore
# comes back byte-identical, and a pulled state diffs cleanly against Terraform's.

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


class _Number(str):
    """A JSON number kept as its text, so `kl state pull` never rounds a value through a float."""


def _sorted_deep(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _sorted_deep(v[k]) for k in sorted(v, key=lambda k: k.encode("utf-8"))}
    if isinstance(v, list):
        return [_sorted_deep(x) for x in v]
    return v


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


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _go_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False).translate(_GO_ESCAPES)


def _write_compact(v: Any, out: list[str]) -> None:
    if isinstance(v, dict):
        out.append("{")
        for n, (k, item) in enumerate(v.items()):
            if n:
                out.append(",")
            out.append(json.dumps(k, ensure_ascii=False))
            out.append(":")
            _write_compact(item, out)
        out.append("}")
    elif isinstance(v, list):
        out.append("[")
        for n, item in enumerate(v):
            if n:
                out.append(",")
            _write_compact(item, out)
        out.append("]")
    elif isinstance(v, _Number):
        out.append(str.__str__(v))
    else:
        out.append(json.dumps(v, ensure_ascii=False))


def dumps_compact(v: Any) -> str:
    """Compact JSON of a value from loads_exact, numbers exactly as they were written."""
    out: list[str] = []
    _write_compact(v, out)
    return "".join(out)


def private_bytes(obj: dict[str, Any]) -> bytes:
    """An instance object's `private` (base64 in state) as the bytes the provider gave."""
    import base64
    import binascii

    text = obj.get("private")
    if not text:
        return b""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise StateError("instance private data is not valid base64") from None


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
    if isinstance(v, _Streamed):
        v.write(indent, out)
    elif isinstance(v, dict):
        if not v:
            out.append("{}")
            return
        inner = indent + "  "
        out.append("{\n")
        for n, (k, item) in enumerate(v.items()):
            out.append(f"{inner}{_go_string(k)}: ")
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
        out.append(_go_string(v))
    else:
        out.append(json.dumps(v))


def loads_exact(text: str | bytes) -> Any:
    """Parse JSON keeping every non-integer number as its text (integers are exact in Python)."""
    return json.loads(text, parse_float=_Number)


class ExactJSON:
    """Exact JSON for one document's life: floats whose shortest repr is their text stay floats
    (the C encoder then writes them back unchanged); only the rest keep their text, and when
    none did, dumps uses the C encoder instead of the pure-Python writer (10x faster)."""

    def __init__(self) -> None:
        self.raw_numbers = False

    def _float(self, text: str) -> Any:
        f = float(text)
        if repr(f) == text:
            return f
        self.raw_numbers = True
        return _Number(text)

    def loads(self, text: str | bytes) -> Any:
        return json.loads(text, parse_float=self._float)

    def dumps_compact(self, v: Any) -> str:
        if self.raw_numbers:
            return dumps_compact(v)
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps_terraform(doc: dict[str, Any]) -> str:
    """A state document in Terraform's own layout (see above); numbers from loads_exact stay exact."""
    out: list[str] = []
    _write(_terraform_layout(doc), "", out)
    out.append("\n")
    return "".join(out)


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
        write("".join(out))
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
    return dumps_terraform(doc)
