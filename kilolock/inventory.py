"""What a user writes to ask for part of the fleet's inventory (`kl resources`, /api/v1/resources),
read once for both: a type glob, a provider source, ``PATH=VALUE`` conditions, and the page cursor
(store/inventory.filters makes the store's filters of them). Each reader raises UsageError with
one line naming what is wrong."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kilolock import schema as sch
from kilolock.errors import UsageError


def type_glob(text: str) -> str:
    """Resource type names with * and ? (aws_s3_*)."""
    if not text or any(not (c.isalnum() or c in "_-*?") for c in text):
        raise UsageError(f"{text!r} is not a resource type glob (letters, digits, _ and the wildcards * ?)")
    return text


def provider_source(text: str) -> str:
    """HOST/NAMESPACE/TYPE, or NAMESPACE/TYPE on the public registry, or TYPE, which Terraform reads
    as hashicorp's: the full source."""
    from kilolock.tfstate.addresses import implied_source

    parts = text.split("/")
    if len(parts) > 3 or not all(p and all(c.isalnum() or c in "._-" for c in p) for p in parts):
        raise UsageError(f"{text!r} is not a provider source (HOST/NAMESPACE/TYPE, NAMESPACE/TYPE or TYPE)")
    if len(parts) == 1:
        return implied_source(text)
    return text if len(parts) == 3 else f"registry.terraform.io/{text}"


def where(text: str) -> tuple[sch.AttributePath, list[str]]:
    """``PATH=VALUE``: an attribute path as Terraform writes one (tags.env, tags["env"],
    rule[0].cidr) and a value (attrsearch.loose_values): the path and the JSON texts it matches."""
    from kilolock import attrsearch

    split = attrsearch.split_assignment(text)
    if split is None or not split[0]:
        raise UsageError(f"{text!r}: write PATH=VALUE, e.g. tags.env=prod or port=80")
    try:
        path = sch.path_parse(split[0])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return path, attrsearch.loose_values(split[1])


def cursor_after(row: Mapping[str, Any]) -> str:
    """The cursor of the page after ROW (the last one of a page): opaque to clients."""
    import base64
    import json

    key = [row["state"], row["address"], row["deposed"] or ""]
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def read_cursor(text: str) -> tuple[str, str, str]:
    key = _decode_cursor(text, 3)
    return key[0], key[1], key[2]


def _decode_cursor(text: str, fields: int) -> list[str]:
    import base64
    import binascii
    import json

    try:
        key = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error):
        key = None
    if not (isinstance(key, list) and len(key) == fields and all(isinstance(k, str) for k in key)):
        raise UsageError(f"cursor {text!r} is not one this API gave (next_cursor of the previous page)")
    return key


# A duplicate group's place in the API's pages: what the caller sees of it (its claims' hash
# stands for its claims, some of which may be in states it may not read).
DUPLICATE_KEY = ("provider", "type", "confidence", "key", "claims_hash")


def duplicates_cursor_after(group: Mapping[str, Any]) -> str:
    import base64
    import json

    return base64.urlsafe_b64encode(json.dumps([group[k] for k in DUPLICATE_KEY]).encode()).decode().rstrip("=")


def read_duplicates_cursor(text: str) -> list[str]:
    return _decode_cursor(text, len(DUPLICATE_KEY))
