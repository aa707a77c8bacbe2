"""Start a provider binary and hand back a ``ProviderClient`` for whichever protocol it speaks."""
from __future__ import annotations

import os
import re

from kilolock.provider.client import GrpcProviderClient, ProviderClient
from kilolock.provider.connection import DEFAULT_START_TIMEOUT, connect
from kilolock.redact import Redactor

_NAME = re.compile(r"terraform-provider-([A-Za-z0-9-]+)")


def provider_name_from_binary(path: str) -> str:
    """``terraform-provider-null_v2.1.2_x4`` → ``null``; other names are used as they are."""
    base = os.path.basename(path)
    m = _NAME.match(base)
    return m.group(1) if m else base


def launch_provider(
    binary: str,
    name: str | None = None,
    *,
    tls: bool | None = None,
    start_timeout: float = DEFAULT_START_TIMEOUT,
    rpc_timeout: float | None = None,
    secrets: Redactor | None = None,
    cwd: str | None = None,
) -> ProviderClient:
    """Launch, handshake, connect; ``tls=None`` follows KL_DISABLE_PLUGIN_TLS (AutoMTLS by default).
    ``rpc_timeout`` is the deadline of every call the client makes, in seconds (None: no deadline).
    ``secrets``: the run's redactor, masking what the plugin logs and what errors quote of it.
    ``cwd``: the plugin's working directory (None: kl's), where relative paths in resources resolve."""
    conn = connect(binary, name or provider_name_from_binary(binary), tls=tls, start_timeout=start_timeout,
                   secrets=secrets, cwd=cwd)
    return GrpcProviderClient(conn, rpc_timeout=rpc_timeout)
