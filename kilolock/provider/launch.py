"""Start a provider binary and hand back a ``ProviderClient`` for whichever protocol it speaks.

The plugin is spawned before the protocol stubs (and grpc, where grpcio is the transport) are
imported: a Go binary takes tens of milliseconds to print its handshake (more with AutoMTLS, when
it generates its own key), and the imports take about as long, so the two overlap. Nothing here
imports grpc. The spawn and the TLS choice are kilolock.provider.spawn's, below the connection and
the client; this module is above them, and only puts them together.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from typing import TYPE_CHECKING

from kilolock.provider import tlsmemo
from kilolock.provider.spawn import DEFAULT_START_TIMEOUT, choose_tls, spawn_plugin
from kilolock.redact import Redactor

if TYPE_CHECKING:
    from kilolock.provider.client import ProviderClient
    from kilolock.provider.connection import PluginConnection

_log = logging.getLogger("kilolock.provider.connection")  # where the TLS fallback has always logged

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
    name = name or provider_name_from_binary(binary)
    secrets = Redactor() if secrets is None else secrets
    choice = choose_tls(binary, tls)
    if choice.remembered is not None:
        _log.info("AutoMTLS with %s failed in an earlier run (%s, remembered in %s); using plaintext gRPC on a "
                  "private 0700 unix socket directory", binary, choice.remembered, tlsmemo.memo_path())
    process = spawn_plugin(binary, name, choice, start_timeout, secrets, cwd)
    try:
        # While the plugin starts.
        from kilolock.provider.client import GrpcProviderClient
        from kilolock.provider.connection import connect_spawned
    except BaseException:
        process.kill()
        raise
    conn = connect_spawned(process, choice, start_timeout=start_timeout, secrets=secrets, cwd=cwd)
    return GrpcProviderClient(conn, rpc_timeout=rpc_timeout)


class EarlyLaunch:
    """A provider started before anyone asked for it: spawned now, and connected (handshake,
    AutoMTLS, health probe) on a thread of its own while the caller does other work (a refresh
    imports psycopg and reads the state meanwhile). ``client`` hands it over once; ``discard``
    closes one nobody took."""

    def __init__(self, binary: str, *, secrets: Redactor, cwd: str | None,
                 start_timeout: float = DEFAULT_START_TIMEOUT) -> None:
        self.binary, self.cwd = binary, cwd
        self._secrets, self._start_timeout = secrets, start_timeout
        self._choice = choose_tls(binary, None)
        self._process = spawn_plugin(binary, provider_name_from_binary(binary), self._choice, start_timeout, secrets, cwd)
        self._conn: PluginConnection | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._connect, name=f"kl-early-{self._process.spec.name}", daemon=True)
        self._thread.start()

    def _connect(self) -> None:
        try:
            from kilolock.provider.connection import connect_spawned

            self._conn = connect_spawned(self._process, self._choice, start_timeout=self._start_timeout,
                                         secrets=self._secrets, cwd=self.cwd)
        except BaseException as exc:  # noqa: BLE001 - handed to whoever takes it (ImportError included)
            self._process.kill()
            self._error = exc

    def client(self, rpc_timeout: float | None = None) -> ProviderClient:
        """The connected client (waiting for the connection); raises what connecting raised."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._conn is not None
        from kilolock.provider.client import GrpcProviderClient

        return GrpcProviderClient(self._conn, rpc_timeout=rpc_timeout)

    def discard(self) -> None:
        self._thread.join()
        if self._conn is not None:
            self._conn.close()
        else:
            self._process.kill()
