"""Starting a plugin process, with or without AutoMTLS: the TLS choice and the spawn.

The low half of a launch, shared by ``launch`` (which spawns, then connects) and ``connection``
(which spawns again without TLS when AutoMTLS fails, and records that failure here). It imports no
protocol stubs and no grpc, so a plugin starts before those load.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from kilolock.provider import tlsmemo, transport
from kilolock.provider.certs import process_client_certificate
from kilolock.provider.process import LaunchSpec, PluginProcess
from kilolock.redact import Redactor

DEFAULT_START_TIMEOUT = 60.0  # go-plugin's StartTimeout

# Binaries whose TLS handshake already failed in this process: later launches go straight to the
# fallback instead of paying for a doomed start (tlsmemo remembers it across processes).
tls_failed_here: set[str] = set()


def tls_disabled_by_env() -> bool:
    return bool(os.environ.get("KL_DISABLE_PLUGIN_TLS") or os.environ.get("TF_DISABLE_PLUGIN_TLS"))


@dataclass(frozen=True)
class TlsChoice:
    """Whether a launch offers AutoMTLS, over which transport, and why not when it does not."""

    offered: bool  # the plugin was started with a client certificate (AutoMTLS)
    transport: str  # kilolock.provider.transport: "native" or "grpcio"
    # AutoMTLS was skipped because it failed before with this binary under this client (tlsmemo's
    # client id). grpcio's version is known only once grpc is loaded: the connection checks it
    # then, and tries TLS on a mismatch.
    remembered: str | None = None


def choose_tls(binary: str, tls: bool | None) -> TlsChoice:
    """``tls`` given: exactly that. None: AutoMTLS unless the environment turns it off or it is
    known to fail with this binary (in this process, or remembered from an earlier run under the
    same client). Raises KlError for an unknown KL_PROVIDER_TRANSPORT."""
    chosen = transport.chosen()
    if tls is not None:
        return TlsChoice(tls, chosen)
    if tls_disabled_by_env() or binary in tls_failed_here:
        return TlsChoice(False, chosen)
    remembered = tlsmemo.failed_with(binary)
    if remembered is None:
        return TlsChoice(True, chosen)
    if chosen == "native":  # its version is known without importing anything
        return TlsChoice(False, chosen, remembered) if remembered == transport.client_id(chosen) else TlsChoice(True, chosen)
    return TlsChoice(False, chosen, remembered) if remembered.startswith("grpcio ") else TlsChoice(True, chosen)


def spawn_plugin(binary: str, name: str, choice: TlsChoice, start_timeout: float, secrets: Redactor,
                 cwd: str | None) -> PluginProcess:
    cert_pem = process_client_certificate().cert_pem if choice.offered else None
    return PluginProcess.spawn(LaunchSpec(binary, name, cert_pem, start_timeout, secrets, cwd))
