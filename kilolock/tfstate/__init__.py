"""Terraform state (format version 4): parsing, validation, addresses, and writing it back out.

Module map, each importing only those before it: checks (StateError, the path-naming checks) →
addresses (instance and provider addresses) → exactjson (numbers kept as their text, Go's
escaping) → parse (the validated document and its instances; OpenTofu's encrypted envelopes) →
streamed_index (the index of a state read from its text one instance at a time) → writer
(Terraform's byte-exact layout, `kl state pull` and `kl serve`'s GET) → version3 (the upgrade of a
version-3 state to 4, at import).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kilolock.tfstate.addresses import instance_address, modern_provider_addresses, parse_provider
from kilolock.tfstate.checks import StateError
from kilolock.tfstate.exactjson import ExactJSON, dumps_compact, loads_exact
from kilolock.tfstate.parse import (
    EnvelopeIds,
    Instance,
    State,
    decode_text,
    envelope_ids,
    is_encrypted_envelope,
    load_json,
    parse_state,
    private_bytes,
)

if TYPE_CHECKING:
    from kilolock.tfstate.streamed_index import index_state_text
    from kilolock.tfstate.version3 import upgrade_if_v3
    from kilolock.tfstate.writer import (
        StreamedResource,
        dumps_terraform,
        envelope_as_written,
        is_dynamic_wrapper,
        pretty_state,
        write_terraform_streamed,
    )

# Only `kl state import` reads a state's text streamed or upgrades version 3, and only a pull (or
# kl serve's GET) lays a state out again; a refresh needs none of them (the writer's
# is_dynamic_wrapper only for a value marked sensitive). Imported with the rest, the three made
# importing this package a third slower (-X importtime): each name loads its module on first use.
_FROM_WRITER = {"StreamedResource", "dumps_terraform", "envelope_as_written", "is_dynamic_wrapper", "pretty_state",
                "write_terraform_streamed"}


def __getattr__(name: str) -> Any:
    # Import statements, not importlib.import_module, which -X importtime does not report.
    if name in _FROM_WRITER:
        from kilolock.tfstate import writer

        value = getattr(writer, name)
    elif name == "index_state_text":
        from kilolock.tfstate import streamed_index

        value = streamed_index.index_state_text
    elif name == "upgrade_if_v3":
        from kilolock.tfstate import version3

        value = version3.upgrade_if_v3
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later reads find it without coming back here
    return value


__all__ = [
    "EnvelopeIds",
    "ExactJSON",
    "Instance",
    "State",
    "StateError",
    "StreamedResource",
    "decode_text",
    "dumps_compact",
    "dumps_terraform",
    "envelope_as_written",
    "envelope_ids",
    "index_state_text",
    "instance_address",
    "is_dynamic_wrapper",
    "is_encrypted_envelope",
    "load_json",
    "loads_exact",
    "modern_provider_addresses",
    "parse_provider",
    "parse_state",
    "pretty_state",
    "private_bytes",
    "upgrade_if_v3",
    "write_terraform_streamed",
]
