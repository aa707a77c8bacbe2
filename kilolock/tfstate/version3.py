"""Reading version 3 (Terraform 0.11 and older; tools such as Terraformer).

Terraform 1.x still reads these: it upgrades the document to version 4 in memory (statefile
version3_upgrade.go) and leaves the flatmap attributes for each provider's UpgradeResourceState.
kl does the same at import, so what it stores is the version-4 document Terraform would write.
"""
from __future__ import annotations

import json
import re
from typing import Any

from kilolock.tfstate.addresses import _NAME, parse_provider
from kilolock.tfstate.checks import MAX_SERIAL, _expect, _expect_type
from kilolock.tfstate.exactjson import _GO_ESCAPES
from kilolock.tfstate.parse import is_backend_settings, is_encrypted_envelope


def upgrade_if_v3(doc: dict[str, Any], origin: str = "state") -> tuple[dict[str, Any], bool]:
    """A version-3 state as version 4 (what `kl state import` stores); any other document as is.
    Returns (document, whether it was upgraded)."""
    if doc.get("version") == 3 and not is_backend_settings(doc) and not is_encrypted_envelope(doc):
        return upgrade_v3(doc, origin), True
    return doc, False


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
