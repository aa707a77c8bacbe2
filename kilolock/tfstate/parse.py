"""A version-4 state parsed and validated, with a JSON path in every error, and its instances indexed.

The parsed form keeps every instance object as the dict Terraform wrote, so a state that goes
in comes back out with nothing lost. OpenTofu's encrypted envelopes are recognised here (and
their serial and lineage read), never parsed further.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kilolock.tfstate.addresses import InstanceKey, instance_address, parse_provider
from kilolock.tfstate.checks import MAX_SERIAL, StateError, _expect, _expect_type, _kind


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
