"""Terraform state (format version 4): parsing, validation and instance addresses.

The parsed form keeps every instance object as the dict Terraform wrote, so a state that goes
in comes back out with nothing lost; what this module adds is validation with a JSON path in
every error, and the addresses Terraform prints (``module.a["x"].null_resource.b[0]``).
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kilolock.errors import KlError

InstanceKey = int | str | None


# Serials are stored as PostgreSQL bigint; Terraform's own are uint64, but none reaches 2**63.
MAX_SERIAL = 2**63 - 1


class StateError(KlError):
    """The state file is not a Terraform state Kilolock can store; the message says where."""


# --- addresses ---------------------------------------------------------------------------------


# What hcl_quoted must escape besides the unprintable: nearly every key has none of it.
_HCL_PLAIN = re.compile(r'[^"\\$%]*')


def hcl_quoted(s: str) -> str:
    """A string as Terraform prints it inside an address: HCL quoted-template escaping."""
    if s.isprintable() and _HCL_PLAIN.fullmatch(s):
        return f'"{s}"'  # the character loop below cost a 2,000-key state's index a third of its time
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
    """``provider["registry.terraform.io/hashicorp/null"].alias`` split into its parts.

    A legacy address (Terraform 0.12's ``provider.null``, or 0.13's unresolved
    ``provider["registry.terraform.io/-/null"]``) is resolved here as Terraform 0.13 resolved it:
    ``source`` is the provider it means, ``legacy`` says the state spells it the old way.
    """

    source: str  # registry.terraform.io/hashicorp/null
    alias: str  # "" when not aliased
    module: str  # the module prefix, e.g. "module.child" ("" for root)
    legacy: bool = False

    @property
    def type(self) -> str:
        return self.source.rsplit("/", 1)[-1]

    @property
    def modern(self) -> str:
        """The address as Terraform 0.13+ writes it."""
        head = f"{self.module}." if self.module else ""
        return f'{head}provider["{self.source}"]' + (f".{self.alias}" if self.alias else "")


@dataclass(frozen=True, slots=True)  # slots: a 100,000-instance state has 100,000 of them
class Instance:
    """One resource instance of a state, with its place in the document."""

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

    @property
    def flatmap(self) -> dict[str, str] | None:
        """The legacy flatmap attributes, when the object has them instead of ``attributes``."""
        if "attributes" in self.obj:
            return None
        flat = self.obj.get("attributes_flat")
        return flat if isinstance(flat, dict) else None


@dataclass
class State:
    """A parsed state: the document and its instances."""

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


@dataclass(frozen=True)
class EnvelopeIds:
    """The serial and lineage an OpenTofu-encrypted state carries in the clear."""

    serial: int
    lineage: str


def envelope_ids(doc: dict[str, Any], origin: str = "state") -> EnvelopeIds | None:
    """What OpenTofu (1.7+) writes beside the ciphertext: the state's own ``serial`` and
    ``lineage``, in the clear, so that backends can order writes (internal/encryption/state.go,
    ``statedata``). None for an envelope without them (then kl numbers it); an envelope that has
    them with the wrong types is refused."""
    if "serial" not in doc and "lineage" not in doc:
        return None
    serial, lineage = doc.get("serial"), doc.get("lineage")
    if isinstance(serial, bool) or not isinstance(serial, int) or serial < 0 or serial > MAX_SERIAL:
        raise StateError(f"{origin}: OpenTofu-encrypted state: \"serial\" must be a whole number from 0 to {MAX_SERIAL}, "
                         f"not {serial if isinstance(serial, int) and not isinstance(serial, bool) else _kind(serial)}")
    if not isinstance(lineage, str) or not lineage:
        raise StateError(f"{origin}: OpenTofu-encrypted state: \"lineage\" must be a non-empty string")
    return EnvelopeIds(serial, lineage)


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


def is_backend_settings(doc: dict[str, Any]) -> bool:
    """``.terraform/terraform.tfstate``: where Terraform records which backend a working directory
    uses (a version-3 document with a ``backend`` object), not a state."""
    backend = doc.get("backend")
    return isinstance(backend, dict) and "type" in backend and "resources" not in doc


def _version_refusal(version: Any, terraform_version: Any) -> str:
    if version in (1, 2, 3):
        writer = (f"stamped Terraform {terraform_version}" if isinstance(terraform_version, str) and terraform_version
                  else "from Terraform 0.11 or older")
        if version == 3:
            return (f"state format version 3 ({writer}) is not supported here, only 4: `kl state import` upgrades "
                    "it to version 4 as Terraform does")
        return (f"state format version {version} ({writer}) is not supported, only 3 and 4: Terraform 0.12+ upgrades "
                "it (`terraform refresh` or `terraform apply` writes version 4); import that file")
    return f"state format version {version} is not supported, only 4"


def upgrade_if_v3(doc: dict[str, Any], origin: str = "state") -> tuple[dict[str, Any], bool]:
    """A version-3 state as version 4 (what `kl state import` stores); any other document as is.
    Returns (document, whether it was upgraded)."""
    if doc.get("version") == 3 and not is_backend_settings(doc) and not is_encrypted_envelope(doc):
        return upgrade_v3(doc, origin), True
    return doc, False


def _expect(cond: bool, path: str, msg: str) -> None:
    if not cond:
        raise StateError(f"{path}: {msg}")


def _expect_type(v: Any, types: type | tuple[type, ...], path: str, what: str) -> None:
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)))
    if not ok:
        raise StateError(f"{path}: expected {what}, got {_kind(v)}")


# Terraform 0.12 wrote provider configurations as traversals: provider.aws, provider.google.beta,
# module.net.provider.aws (modules had no instance keys before 0.13).
_NAME = r"[A-Za-z_][A-Za-z0-9_-]*"
_LEGACY_PROVIDER = re.compile(rf"((?:module\.{_NAME}\.)*)provider\.({_NAME})(?:\.({_NAME}))?")
LEGACY_NAMESPACE = "-"


def implied_source(type_: str) -> str:
    """The provider an unqualified type name means (Terraform's ImpliedProviderForUnqualifiedType):
    hashicorp's on the public registry, except ``terraform``, which is built into Terraform."""
    if type_ == "terraform":
        return "terraform.io/builtin/terraform"
    return f"registry.terraform.io/hashicorp/{type_}"


def parse_provider(s: str, path: str = "provider") -> ProviderRef:
    """Parse an AbsProviderConfig string: ``[module.x.]provider["host/ns/type"][.alias]``, or the
    legacy ``[module.x.]provider.type[.alias]``."""
    head, sep, rest = s.partition('provider["')
    if not sep:
        legacy = _LEGACY_PROVIDER.fullmatch(s)
        _expect(legacy is not None, path,
                f'provider address {s!r} is not of the form provider["HOST/NAMESPACE/TYPE"] (or provider.TYPE, as Terraform 0.12 wrote it)')
        assert legacy is not None
        module, type_, alias = legacy.group(1).removesuffix("."), legacy.group(2), legacy.group(3) or ""
        return ProviderRef(source=implied_source(type_), alias=alias, module=module, legacy=True)
    module = head.removesuffix(".")
    _expect(head == "" or head.endswith("."), path, f"provider address {s!r} has a malformed module prefix")
    source, sep, tail = rest.partition('"]')
    _expect(bool(sep) and source.count("/") == 2 and all(source.split("/")), path,
            f"provider address {s!r}: source must be HOST/NAMESPACE/TYPE")
    alias = ""
    if tail:
        _expect(tail.startswith(".") and len(tail) > 1, path, f"provider address {s!r} has trailing text {tail!r}")
        alias = tail[1:]
    host, namespace, type_ = source.split("/")
    if namespace == LEGACY_NAMESPACE and host == "registry.terraform.io":
        # Terraform 0.13 wrote what it could not resolve in the legacy namespace; later releases
        # refuse it until `terraform state replace-provider`. kl resolves it as 0.13 did.
        return ProviderRef(source=implied_source(type_), alias=alias, module=module, legacy=True)
    return ProviderRef(source=source, alias=alias, module=module)


def modern_provider_addresses(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], set[tuple[int, int]]]:
    """The document with every legacy provider address written as Terraform 0.13+ writes it.

    Returns (document, {old address: new address}, (resource, instance) positions of the objects
    whose resource was rewritten). Only the resources that change are copied; ``doc`` is not
    modified. Positions are unchanged, so they index ``doc`` and the result alike."""
    rewrites: dict[str, str] = {}
    positions: set[tuple[int, int]] = set()
    resources = doc.get("resources") or []
    out_resources = list(resources)
    for ri, res in enumerate(resources):
        ref = parse_provider(res["provider"])
        if not ref.legacy:
            continue
        rewrites[res["provider"]] = ref.modern
        out_resources[ri] = {**res, "provider": ref.modern}
        positions.update((ri, ii) for ii in range(len(res.get("instances") or [])))
    if not rewrites:
        return doc, {}, set()
    return {**doc, "resources": out_resources}, rewrites, positions


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
    if is_backend_settings(doc):
        backend = doc["backend"].get("type")
        kind = f'the "{backend}" backend' if isinstance(backend, str) and backend else "a backend"
        raise StateError(
            f"{origin}: this is Terraform's backend settings file (.terraform/terraform.tfstate, for {kind}), not a "
            "state: the state is kept by that backend; `terraform state pull > FILE` writes it to a file kl can import"
        )
    _check_top(doc, origin)
    resources = doc.get("resources", [])
    _expect_type(resources, list, f"{origin}.resources", "an array")

    index = _InstanceIndex(keep_objects)
    for ri, res in enumerate(resources):
        rpath = f"{origin}.resources[{ri}]"
        _check_resource(res, rpath)
        for ii, obj in enumerate(res["instances"]):
            index.add(res, ri, ii, obj, rpath)
    if not keep_objects:
        return State(raw={k: v for k, v in doc.items() if k != "resources"}, instances=index.instances)
    return State(raw=doc, instances=index.instances)


def _check_top(doc: dict[str, Any], origin: str) -> None:
    version = doc.get("version")
    _expect("version" in doc, f"{origin}.version", "missing; not a Terraform state file")
    _expect_type(version, int, f"{origin}.version", "a number")
    if version != 4:
        raise StateError(f"{origin}.version: {_version_refusal(version, doc.get('terraform_version'))}")
    for key in ("serial", "lineage"):
        _expect(key in doc, f"{origin}.{key}", "missing")
    _expect_type(doc["serial"], int, f"{origin}.serial", "a number")
    _expect(doc["serial"] >= 0, f"{origin}.serial", "must not be negative")
    _expect(doc["serial"] <= MAX_SERIAL, f"{origin}.serial", f"must be at most {MAX_SERIAL}")
    _expect_type(doc["lineage"], str, f"{origin}.lineage", "a string")
    _expect(doc["lineage"] != "", f"{origin}.lineage", "must not be empty")
    if "terraform_version" in doc:
        _expect_type(doc["terraform_version"], str, f"{origin}.terraform_version", "a string")
    if "outputs" in doc:
        _expect_type(doc["outputs"], dict, f"{origin}.outputs", "an object")
        for oname, out in doc["outputs"].items():
            _expect_type(out, dict, f"{origin}.outputs.{oname}", "an object")
            _expect("value" in out, f"{origin}.outputs.{oname}", "missing value")


def _check_resource(res: Any, rpath: str) -> None:
    """A resource's own fields (its instances are checked one by one: _InstanceIndex.add)."""
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


class _InstanceIndex:
    """The instances of a state, checked and indexed one at a time."""

    def __init__(self, keep_objects: bool) -> None:
        self.keep_objects = keep_objects
        self.instances: list[Instance] = []
        self.seen: set[str | tuple[str, str]] = set()  # an address alone for a current object: half the memory
        self.owned = _Owned()

    def add(self, res: dict[str, Any], ri: int, ii: int, obj: Any, rpath: str) -> None:
        # Every check is a plain test first and its message is built only when it fails: the
        # messages, made for every instance, were half of indexing a big state.
        if type(obj) is not dict:
            _expect_type(obj, dict, self._path(rpath, ii), "an object")
        if "attributes" in obj or "attributes_flat" not in obj:
            if type(obj.get("attributes")) is not dict:
                ipath = self._path(rpath, ii)
                _expect("attributes" in obj, f"{ipath}.attributes", "missing")
                _expect_type(obj["attributes"], dict, f"{ipath}.attributes", "an object")
        else:
            # Flatmap (the pre-0.12 form, still written by tools such as Terraformer): the
            # provider's UpgradeResourceState turns it into an object at the first refresh.
            ipath = self._path(rpath, ii)
            flat = obj["attributes_flat"]
            _expect_type(flat, dict, f"{ipath}.attributes_flat", "an object")
            for fkey, fvalue in flat.items():
                _expect_type(fvalue, str, f"{ipath}.attributes_flat.{fkey}", "a string")
        if "schema_version" in obj and type(obj["schema_version"]) is not int:
            _expect_type(obj["schema_version"], int, f"{self._path(rpath, ii)}.schema_version", "a number")
        key = obj.get("index_key")
        if key is not None and type(key) is not int and type(key) is not str:
            _expect(isinstance(key, (int, str)) and not isinstance(key, bool),
                    f"{self._path(rpath, ii)}.index_key", f"expected a number or a string, got {_kind(key)}")
        deposed = obj.get("deposed", "")
        if type(deposed) is not str:
            _expect_type(deposed, str, f"{self._path(rpath, ii)}.deposed", "a string")
        if "sensitive_attributes" in obj and type(obj["sensitive_attributes"]) is not list:
            _expect_type(obj["sensitive_attributes"], list, f"{self._path(rpath, ii)}.sensitive_attributes", "an array")
        if "status" in obj and obj["status"] != "tainted":
            _expect(False, f"{self._path(rpath, ii)}.status", f"unknown status {obj['status']!r}")
        mode, type_, name, module = res["mode"], res["type"], res["name"], res.get("module", "")
        address = instance_address(module, mode, type_, name, key)
        identity = (address, deposed) if deposed else address
        if identity in self.seen:
            _expect(False, self._path(rpath, ii), f"duplicate instance {address}" + (f" (deposed {deposed})" if deposed else ""))
        self.seen.add(identity)
        if self.keep_objects:
            self.instances.append(Instance(address, deposed, module, mode, type_, name, key, res["provider"], ri, ii, obj))
        else:
            owned = self.owned
            self.instances.append(Instance(address, owned(deposed), owned(module), owned(mode), owned(type_), owned(name),
                                           owned(key), owned(res["provider"]), ri, ii, _NO_OBJECT))

    @staticmethod
    def _path(rpath: str, ii: int) -> str:
        return f"{rpath}.instances[{ii}]"


class _NotStreamable(Exception):
    """The text is not laid out as index_state_text reads it (or has an error): parse it whole."""


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_STREAM_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def index_state_text(text: str, origin: str = "state") -> State | None:
    """What ``parse_state(text, origin, keep_objects=False)`` gives, for a version-4 state whose
    resources each list their "instances" last (as Terraform and OpenTofu write them), parsed one
    instance at a time: the document is never held whole beside its text (an import's peak was the
    two). None for any other text, including one with an error: the caller parses it whole, which
    reports what is wrong exactly as before."""
    try:
        return _index_streamed(text, origin)
    except (_NotStreamable, StateError, ValueError, RecursionError, IndexError):
        return None


def _index_streamed(text: str, origin: str) -> State:
    scan = _STREAM_DECODER.raw_decode
    index = _InstanceIndex(keep_objects=False)

    def space(text: str, i: int) -> re.Match[str]:
        found = _JSON_SPACE.match(text, i)
        assert found is not None  # the pattern matches the empty string
        return found

    def value(i: int, depth: int) -> tuple[Any, int]:
        v, i = scan(text, i)
        if _nested_deeper_than(v, MAX_NESTING - depth) if isinstance(v, (dict, list)) else False:
            raise _NotStreamable
        return v, i

    def members(i: int, on_key: Callable[[str, int], int]) -> int:
        """An object's members from just after its "{": ON_KEY(key, index of the value) reads
        each value and returns where it ends; returns where the object ends."""
        i = space(text, i).end()
        if text[i] == "}":
            return i + 1
        while True:
            if text[i] != '"':
                raise _NotStreamable
            key, i = scan(text, i)
            i = space(text, i).end()
            if text[i] != ":":
                raise _NotStreamable
            i = on_key(key, space(text, i + 1).end())
            i = space(text, i).end()
            if text[i] == "}":
                return i + 1
            if text[i] != ",":
                raise _NotStreamable
            i = space(text, i + 1).end()

    def elements(i: int, on_item: Callable[[int, int], int]) -> int:
        """An array's elements from just after its "[": ON_ITEM(n, index) reads element n."""
        i = space(text, i).end()
        if text[i] == "]":
            return i + 1
        n = 0
        while True:
            i = space(text, on_item(n, i)).end()
            if text[i] == "]":
                return i + 1
            if text[i] != ",":
                raise _NotStreamable
            i = space(text, i + 1).end()
            n += 1

    def resource(ri: int, i: int) -> int:
        if text[i] != "{":
            raise _NotStreamable
        res: dict[str, Any] = {}
        rpath = f"{origin}.resources[{ri}]"

        def on_key(key: str, j: int) -> int:
            if "instances" in res:  # a field after the instances: they were indexed without it
                raise _NotStreamable
            if key != "instances":
                res[key], j = value(j, 4)
                return j
            if text[j] != "[":
                raise _NotStreamable
            res["instances"] = []
            _check_resource(res, rpath)

            def on_item(ii: int, k: int) -> int:
                obj, k = value(k, 5)
                index.add(res, ri, ii, obj, rpath)
                return k

            return elements(j + 1, on_item)

        i = members(i + 1, on_key)
        if "instances" not in res:
            raise _NotStreamable
        return i

    top: dict[str, Any] = {}
    streamed = [False]

    def on_top_key(key: str, j: int) -> int:
        if key != "resources":
            top[key], j = value(j, 2)
            return j
        if streamed[0] or text[j] != "[":  # a second "resources" replaces the first in a parse
            raise _NotStreamable
        streamed[0] = True
        return elements(j + 1, resource)

    i = space(text, 0).end()
    if text[i] != "{":
        raise _NotStreamable
    i = members(i + 1, on_top_key)
    if space(text, i).end() != len(text) or top.get("version") != 4 or is_encrypted_envelope(top) or is_backend_settings(top):
        raise _NotStreamable
    _check_top(top, origin)
    return State(raw=top, instances=index.instances)


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
    out the same way (README, "What kl reads")."""
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


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


# What json.dumps(s, ensure_ascii=False) gives for a str, without building an encoder per call
# (which was most of a big pull's time: it writes every key and string value this way).
_encode_string: Callable[[str], str] = json.encoder.encode_basestring


def _go_string(s: str) -> str:
    return _encode_string(s).translate(_GO_ESCAPES)


_GO_ESCAPED = re.compile("[<>&\u2028\u2029]")


def _go_escaped(text: str) -> str:
    """JSON text with Go's escapes of what only a string can hold (so the whole text at once, not
    string by string: a translate per string was a fifth of a big pull's time)."""
    return text.translate(_GO_ESCAPES) if _GO_ESCAPED.search(text) else text


def _py_string(text: str) -> str:
    return _encode_string(text)


def _write_compact(v: Any, out: list[str], quote: Callable[[str], str] = _py_string) -> None:
    """Compact JSON of V onto OUT, numbers as written; QUOTE writes strings and keys (Python's
    escaping, or Go's json.Marshal's for a layout Go wrote)."""
    if isinstance(v, dict):
        out.append("{")
        for n, (k, item) in enumerate(v.items()):
            if n:
                out.append(",")
            out.append(quote(k))
            out.append(":")
            _write_compact(item, out, quote)
        out.append("}")
    elif isinstance(v, list):
        out.append("[")
        for n, item in enumerate(v):
            if n:
                out.append(",")
            _write_compact(item, out, quote)
        out.append("]")
    elif isinstance(v, _Number):
        out.append(str.__str__(v))
    elif isinstance(v, str):
        out.append(quote(v))
    else:
        out.append(json.dumps(v, ensure_ascii=False))


def dumps_compact(v: Any) -> str:
    """Compact JSON of a value from loads_exact, numbers exactly as they were written."""
    out: list[str] = []
    _write_compact(v, out)
    return "".join(out)


# Decoded `private` texts: a provider writes the same few for every instance of a type (null:
# "bnVsbA=="; SDKv2: its schema version and timeouts), and a refresh decodes one per read. Only
# short texts, and only so many: a dict read is atomic under the GIL, so threads share it as is.
_PRIVATE_MEMO: dict[str, bytes] = {}
_PRIVATE_MEMO_TEXT = 512
_PRIVATE_MEMO_ENTRIES = 1024


def private_bytes(obj: dict[str, Any]) -> bytes:
    """An instance object's `private` (base64 in state) as the bytes the provider gave."""
    text = obj.get("private")
    if not text:
        return b""
    known = _PRIVATE_MEMO.get(text) if type(text) is str else None
    if known is not None:
        return known
    import base64
    import binascii

    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise StateError("instance private data is not valid base64") from None
    if type(text) is str and len(text) <= _PRIVATE_MEMO_TEXT and len(_PRIVATE_MEMO) < _PRIVATE_MEMO_ENTRIES:
        _PRIVATE_MEMO[text] = decoded
    return decoded


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


_EXACT_DECODER = json.JSONDecoder(parse_float=_Number)


def loads_exact(text: str | bytes) -> Any:
    """Parse JSON keeping every non-integer number as its text (integers are exact in Python)."""
    if isinstance(text, str) and not text.startswith("\ufeff"):
        return _EXACT_DECODER.decode(text)  # json.loads would build a decoder per call (the pull makes one per instance)
    return json.loads(text, parse_float=_Number)


class ExactJSON:
    """Exact JSON for one document's life: floats whose shortest repr is their text stay floats
    (the C encoder then writes them back unchanged); only the rest keep their text, and when
    none did, dumps uses the C encoder instead of the pure-Python writer (10x faster)."""

    def __init__(self) -> None:
        self.raw_numbers = False
        # One decoder for the document's life: json.loads with parse_float builds a new one per
        # call, which cost more than the parsing when a state is read a piece at a time.
        self._decoder = json.JSONDecoder(parse_float=self._float)

    def _float(self, text: str) -> Any:
        f = float(text)
        if repr(f) == text:
            return f
        self.raw_numbers = True
        return _Number(text)

    def loads(self, text: str | bytes) -> Any:
        if isinstance(text, str) and not text.startswith("\ufeff"):
            return self._decoder.decode(text)
        return json.loads(text, parse_float=self._float)  # its checks and encoding detection, as before

    def dumps_compact(self, v: Any) -> str:
        if self.raw_numbers:
            return dumps_compact(v)
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


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


# --- reading version 3 (Terraform 0.11 and older; tools such as Terraformer) -------------------
#
# Terraform 1.x still reads these: it upgrades the document to version 4 in memory (statefile
# version3_upgrade.go) and leaves the flatmap attributes for each provider's UpgradeResourceState.
# kl does the same at import, so what it stores is the version-4 document Terraform would write.


def upgrade_v3(doc: dict[str, Any], origin: str = "state") -> dict[str, Any]:
    """A version-3 state document as the version-4 document Terraform upgrades it to."""
    _expect_type(doc.get("serial", 0), int, f"{origin}.serial", "a number")
    _expect(doc.get("serial", 0) >= 0, f"{origin}.serial", "must not be negative")
    _expect(doc.get("serial", 0) <= MAX_SERIAL, f"{origin}.serial", f"must be at most {MAX_SERIAL}")
    modules = doc.get("modules") or []
    _expect_type(modules, list, f"{origin}.modules", "an array")
    outputs: dict[str, Any] = {}
    resources: list[dict[str, Any]] = []
    for mi, mod in enumerate(modules):
        mpath = f"{origin}.modules[{mi}]"
        _expect_type(mod, dict, mpath, "an object")
        path = mod.get("path")
        _expect(isinstance(path, list) and bool(path) and path[0] == "root" and all(isinstance(p, str) for p in path),
                f"{mpath}.path", 'expected a module path starting with "root"')
        for name in path[1:]:
            _expect(re.fullmatch(_NAME, name) is not None, f"{mpath}.path", f"{name!r} is not a valid module name")
        module = ".".join(f"module.{name}" for name in path[1:])
        by_resource: dict[tuple[str, str, str], dict[str, Any]] = {}
        old_resources = mod.get("resources") or {}
        _expect_type(old_resources, dict, f"{mpath}.resources", "an object")
        for key, old in old_resources.items():
            rpath = f"{mpath}.resources.{key}"
            _expect_type(old, dict, rpath, "an object")
            mode, type_, name, index = _v3_resource_key(key, rpath)
            res = by_resource.get((mode, type_, name))
            if res is None:
                res = {"module": module, "mode": mode, "type": type_, "name": name,
                       "provider": _v3_provider(old.get("provider"), module, type_, rpath), "instances": []}
                if not module:
                    del res["module"]
                by_resource[(mode, type_, name)] = res
            if old.get("primary") is not None:
                res["instances"].append(_v3_object(old["primary"], index, "", f"{rpath}.primary"))
            deposed = old.get("deposed") or []
            _expect_type(deposed, list, f"{rpath}.deposed", "an array")
            for di, obj in enumerate(deposed):
                # Terraform numbers migrated deposed objects 00000001, 00000002, ...: deterministic.
                res["instances"].append(_v3_object(obj, index, f"{di + 1:08x}", f"{rpath}.deposed[{di}]"))
        resources.extend(by_resource.values())
        if len(path) == 1:
            old_outputs = mod.get("outputs") or {}
            _expect_type(old_outputs, dict, f"{mpath}.outputs", "an object")
            for oname, out in old_outputs.items():
                _expect_type(out, dict, f"{mpath}.outputs.{oname}", "an object")
                value = out.get("value")
                new_out: dict[str, Any] = {"value": value, "type": _simplified(_implied_type(value))}
                if out.get("sensitive"):
                    new_out["sensitive"] = True
                outputs[oname] = new_out
    # Terraform's normalize(): resources by module, mode, type, name; instances by key, then deposed.
    resources.sort(key=lambda r: (r.get("module", "").encode(), r["mode"].encode(), r["type"].encode(), r["name"].encode()))
    for res in resources:
        res["instances"].sort(key=lambda o: (o.get("index_key") is not None, o.get("index_key") or 0, o.get("deposed", "")))
    return {"version": 4, "terraform_version": doc.get("terraform_version") or "0.0.0", "serial": doc.get("serial", 0),
            "lineage": doc.get("lineage", ""), "outputs": outputs, "resources": resources}


def _v3_resource_key(key: str, path: str) -> tuple[str, str, str, int | None]:
    parts = key.split(".")
    mode = "managed"
    if len(parts) > 2 and parts[0] == "data":
        mode, parts = "data", parts[1:]
    _expect(2 <= len(parts) <= 3 and all(parts), path, f"{key!r} is not a resource address (TYPE.NAME or TYPE.NAME.INDEX)")
    index = None
    if len(parts) == 3:
        _expect(parts[2].isdigit(), path, f"{key!r}: the index {parts[2]!r} is not a number")
        index = int(parts[2])
    return mode, parts[0], parts[1], index


def _v3_provider(old: Any, module: str, type_: str, path: str) -> str:
    """The legacy provider address Terraform's upgrade writes (kl modernises it at a refresh)."""
    if old is not None:
        _expect_type(old, str, f"{path}.provider", "a string")
    old = old or ""
    if "provider." in old:
        parse_provider(old, f"{path}.provider")
        return str(old)
    # Terraform 0.11's module-local form "aws" or "aws.alias"; none: implied by the type's prefix.
    local, _, alias = (old or type_.split("_", 1)[0]).partition(".")
    _expect(re.fullmatch(_NAME, local) is not None and (not alias or re.fullmatch(_NAME, alias) is not None),
            f"{path}.provider", f"{old!r} is not a provider reference")
    head = f"{module}." if module else ""
    return f"{head}provider.{local}" + (f".{alias}" if alias else "")


def _v3_object(old: Any, index: int | None, deposed: str, path: str) -> dict[str, Any]:
    import base64

    _expect_type(old, dict, path, "an object")
    attributes = old.get("attributes") or {}
    _expect_type(attributes, dict, f"{path}.attributes", "an object")
    flat = {}
    for k, v in attributes.items():
        _expect_type(v, str, f"{path}.attributes.{k}", "a string")
        flat[k] = v
    if old.get("id") and not flat.get("id"):
        _expect_type(old["id"], str, f"{path}.id", "a string")
        flat["id"] = old["id"]
    meta = old.get("meta") or {}
    _expect_type(meta, dict, f"{path}.meta", "an object")
    schema_version, private = 0, dict(meta)
    raw_version = meta.get("schema_version")
    # The pre-0.12 SDK kept the schema version in meta, as a string; Terraform promotes it.
    numeric = isinstance(raw_version, (int, float)) and not isinstance(raw_version, bool) and raw_version >= 0
    if numeric or (isinstance(raw_version, str) and raw_version.isdigit()):
        schema_version = int(raw_version or 0)
        del private["schema_version"]
    obj: dict[str, Any] = {}
    if index is not None:
        obj["index_key"] = index
    if old.get("tainted") is True:
        obj["status"] = "tainted"
    if deposed:
        obj["deposed"] = deposed
    obj["schema_version"] = schema_version
    obj["attributes_flat"] = flat
    if private:
        # Go's json.Marshal of the remaining meta (sorted keys, compact, HTML-safe), base64 in state.
        text = json.dumps(private, sort_keys=True, separators=(",", ":"), ensure_ascii=False).translate(_GO_ESCAPES)
        obj["private"] = base64.b64encode(text.encode()).decode("ascii")
    return obj


def _implied_type(value: Any) -> Any:
    """cty's type of a JSON value (ctyjson.ImpliedType): arrays are tuples, objects objects."""
    if value is None:
        return "dynamic"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return ["tuple", [_implied_type(v) for v in value]]
    return ["object", {k: _implied_type(v) for k, v in value.items()}]


def _simplified(type_: Any) -> Any:
    """Before 0.12 outputs were strings, lists and maps: a tuple or object whose elements share one
    type reads as a list or map of it, as Terraform's upgrade decides."""
    if isinstance(type_, list) and type_[0] == "tuple" and type_[1]:
        first = type_[1][0]
        if all(t == first for t in type_[1]):
            return ["list", _simplified(first)]
    if isinstance(type_, list) and type_[0] == "object" and type_[1]:
        types = list(type_[1].values())
        if all(t == types[0] for t in types):
            return ["map", _simplified(types[0])]
    return type_
