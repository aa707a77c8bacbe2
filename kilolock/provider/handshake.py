"""go-plugin's one-line stdout handshake: ``CORE|APP|NETWORK|ADDRESS|PROTOCOL|SERVERCERT[|MUX]``."""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from kilolock.provider.errors import PluginStartError

SUPPORTED_PROTOCOLS = (6, 5)
# go-plugin loads a server certificate only when the field is longer than this.
_MIN_CERT_FIELD = 50


@dataclass(frozen=True)
class Handshake:
    """What the plugin's go-plugin handshake line says: protocol, where to connect, its certificate."""

    protocol_version: int
    network: str  # "unix" or "tcp"
    address: str
    server_cert_der: bytes | None

    @property
    def grpc_target(self) -> str:
        return f"unix:{self.address}" if self.network == "unix" else self.address


def _shown(field: str) -> str:
    """A field echoed in an error: quoted (control characters escaped) and shortened, since the
    line is whatever the binary printed, up to the launcher's 64 KiB cap."""
    return repr(field if len(field) <= 40 else field[:40] + "...")


def parse_handshake(line: str, binary: str) -> Handshake:
    """Validate one handshake line; every failure names the binary and what was wrong."""
    text = line.strip()
    parts = text.split("|")
    if len(parts) < 4:
        shown = text if len(text) <= 120 else text[:120] + "..."
        raise PluginStartError(f"{binary} is not a Terraform provider plugin: its first output line was {shown!r}, not a go-plugin handshake")
    core, app, network, address = parts[:4]
    if core != "1":
        raise PluginStartError(f"{binary} speaks go-plugin core protocol {_shown(core)}; kl supports only 1")
    # ASCII digits only: str.isdigit() also accepts superscripts such as "²", which int() rejects.
    if not (app.isascii() and app.isdigit() and len(app) < 10) or int(app) not in SUPPORTED_PROTOCOLS:
        raise PluginStartError(f"{binary} speaks plugin protocol {_shown(app)}; kl supports protocols 5 and 6 (Terraform >= 0.12 providers)")
    if network not in ("unix", "tcp"):
        raise PluginStartError(f"{binary} offered an unknown network {_shown(network)} in its handshake")
    if not address or not address.isprintable():
        raise PluginStartError(f"{binary} offered no usable {network} address in its handshake: {_shown(address)}")
    rpc = parts[4] if len(parts) > 4 else "netrpc"
    if rpc != "grpc":
        named = rpc if rpc.isprintable() and len(rpc) <= 40 else _shown(rpc)
        raise PluginStartError(f"{binary} speaks {named}, the pre-0.12 plugin RPC; kl needs a gRPC provider (protocol 5 or 6)")
    cert_field = parts[5] if len(parts) > 5 else ""
    cert = None
    if len(cert_field) > _MIN_CERT_FIELD:
        try:
            cert = base64.b64decode(cert_field + "=" * (-len(cert_field) % 4), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise PluginStartError(f"{binary} sent a server certificate that is not valid base64: {exc}") from None
    return Handshake(protocol_version=int(app), network=network, address=address, server_cert_der=cert)
