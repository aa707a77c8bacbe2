"""Talking to Terraform provider plugins: launch, handshake, AutoMTLS, protocol 5/6 clients, discovery.

Typical use (the refresh factory)::

    found = discovery.find_provider("registry.terraform.io/hashicorp/null", pinned, cli_search_paths)
    with launch_provider(found.binary, found.address.type) as client:   # ProviderClient
        schema = client.get_schema()                                   # kilolock.schema.ProviderSchema
        client.configure(config_msgpack)
        state = client.upgrade_resource_state("null_resource", version, raw_json)
        result = client.read_resource("null_resource", state, private)  # ReadResult

Module map: handshake (parse the stdout line) → process (spawn, drain, reap) → certs (AutoMTLS client
certificate) → spawn (the TLS choice, the start) → connection (channel, TLS fallback, StreamStdio,
Shutdown) → client (the RPCs, one implementation for both protocol versions) with convert (wire
messages → kilolock types, including the sensitive paths in ReadResource's undeclared field 6) and
wire (DynamicValue bytes, unknown fields) → launch (spawn, connect, hand back a client; early
launches). Under the client, rpc defines the channel it calls through; transport picks one:
h2channel (kl's native HTTP/2 client, the default) or grpcio_channel. discovery finds binaries;
logbridge maps plugin stderr to logging (``kilolock.provider.<type>``), masking the secrets of the
run that launched the plugin.

Importing this package does not import grpc; only grpcio_channel does, when grpcio is the transport.

Environment: KL_PROVIDER_TRANSPORT=native|grpcio chooses the client; KL_DISABLE_PLUGIN_TLS /
TF_DISABLE_PLUGIN_TLS turn AutoMTLS off; TF_LOG, TF_LOG_PROVIDER
or KL_LOG make providers log verbosely (otherwise kl asks them for warnings only).
"""
from __future__ import annotations

import os

# grpc core reads these once, when grpc is first imported (by grpcio_channel):
# INFO lines from its TLS and fork handlers would otherwise reach the user's terminal.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from typing import TYPE_CHECKING, Any

from kilolock.provider.diagnostics import Diagnostic, Severity
from kilolock.provider.errors import (
    PluginStartError,
    ProviderCallError,
    ProviderDiagnosticsError,
    ProviderError,
    ProviderNotFoundError,
)
from kilolock.provider.launch import launch_provider
from kilolock.provider.process import kill_all

if TYPE_CHECKING:
    from kilolock.provider.client import DEFAULT_TERRAFORM_VERSION, ProviderClient, ReadResult

# The client module loads the protocol stubs (protobuf), which a refresh imports only once its first
# plugin is starting (kilolock.provider.launch): these names load it on first use.
_FROM_CLIENT = ("DEFAULT_TERRAFORM_VERSION", "ProviderClient", "ReadResult")


def __getattr__(name: str) -> Any:
    if name in _FROM_CLIENT:
        from kilolock.provider import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_TERRAFORM_VERSION",
    "Diagnostic",
    "PluginStartError",
    "ProviderCallError",
    "ProviderClient",
    "ProviderDiagnosticsError",
    "ProviderError",
    "ProviderNotFoundError",
    "ReadResult",
    "Severity",
    "kill_all",
    "launch_provider",
]
