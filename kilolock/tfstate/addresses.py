"""The addresses Terraform prints: resource instances (``module.a["x"].null_resource.b[0]``) and
provider configurations (``provider["registry.terraform.io/hashicorp/null"].alias``), legacy forms
included."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kilolock.tfstate.checks import _expect

InstanceKey = int | str | None


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


# Terraform 0.12 wrote provider configurations as traversals: provider.aws, provider.google.beta,
# module.net.provider.aws (modules had no instance keys before 0.13).
_NAME = r"[A-Za-z_][A-Za-z0-9_-]*"
# Terraform reads them with HCL's traversal parser, which skips spaces, tabs, newlines and comments
# between the names and dots (its own fixtures hold "provider. null"). Each alternative can match a
# given text in one way only (a line comment runs to the end of its line, a block comment stops at
# its first "*/"), so a string that does not match fails in linear time.
_GAP = r"(?:[ \t]|\r?\n|/\*(?:[^*]|\*(?!/))*\*/|(?:#|//)[^\n]*(?=\n|\Z))*"
_LEGACY_PROVIDER = re.compile(
    rf"{_GAP}((?:module{_GAP}\.{_GAP}{_NAME}{_GAP}\.{_GAP})*)provider{_GAP}\.{_GAP}({_NAME})(?:{_GAP}\.{_GAP}({_NAME}))?{_GAP}")
_LEGACY_MODULE = re.compile(rf"module{_GAP}\.{_GAP}({_NAME})")
LEGACY_NAMESPACE = "-"


def implied_source(type_: str) -> str:
    """The provider an unqualified type name means (Terraform's ImpliedProviderForUnqualifiedType):
    hashicorp's on the public registry, except ``terraform``, which is built into Terraform."""
    if type_ == "terraform":
        return "terraform.io/builtin/terraform"
    return f"registry.terraform.io/hashicorp/{type_}"


def parse_provider(s: str, path: str = "provider") -> ProviderRef:
    """Parse an AbsProviderConfig string: ``[module.x.]provider["host/ns/type"][.alias]``, or the
    legacy ``[module.x.]provider.type[.alias]`` (with whatever HCL skips between its parts)."""
    head, sep, rest = s.partition('provider["')
    if not sep:
        legacy = _LEGACY_PROVIDER.fullmatch(s)
        _expect(legacy is not None, path,
                f'provider address {s!r} is not of the form provider["HOST/NAMESPACE/TYPE"] (or provider.TYPE, as Terraform 0.12 wrote it)')
        assert legacy is not None
        module = ".".join(f"module.{name}" for name in _LEGACY_MODULE.findall(legacy.group(1)))
        type_, alias = legacy.group(2), legacy.group(3) or ""
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
