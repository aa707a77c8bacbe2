"""A launched plugin plus its gRPC channel: AutoMTLS, readiness probe, StreamStdio, ordered close.

The channel is kl's native HTTP/2 client where the extension is built, else grpcio
(kilolock.provider.transport). AutoMTLS is on unless ``KL_DISABLE_PLUGIN_TLS`` (or Terraform's own
``TF_DISABLE_PLUGIN_TLS``) is set. go-plugin servers always present a P-521 certificate. The native
client (rustls with aws-lc) completes the handshake under TLS 1.2 and 1.3. grpcio completes it
only under TLS 1.2 (providers built with old Go, e.g. null 2.1.2): under TLS 1.3, which every
current Go negotiates, the server must sign with ecdsa_secp521r1_sha512, which grpcio's BoringSSL
neither offers nor can be configured to (grpc/grpc#41089), and the server answers
handshake_failure. When AutoMTLS fails, kl starts the provider again without
``PLUGIN_CLIENT_CERT``: plaintext gRPC over a unix socket in a private 0700 directory
(PLUGIN_UNIX_SOCKET_DIR) that only kl's user can reach, logs it at INFO, and skips the attempt for
that binary from then on: for the rest of the process, and in later runs through ``tlsmemo``
(keyed by the binary's path, size and mtime and the client's id).
Every plugin gets such a private socket directory, TLS or not (go-plugin < 1.5 ignores it and uses
$TMPDIR, where the socket is still closed to other users by its mode).
"""
from __future__ import annotations

import logging
import threading
import time

from kilolock.provider import spawn, tlsmemo, transport
from kilolock.provider._pb import grpc_controller_pb2, grpc_health_pb2, grpc_stdio_pb2
from kilolock.provider.certs import process_client_certificate
from kilolock.provider.errors import PluginStartError
from kilolock.provider.process import PluginProcess
from kilolock.provider.rpc import Channel, RpcError, StatusCode
from kilolock.provider.spawn import DEFAULT_START_TIMEOUT, TlsChoice, choose_tls, spawn_plugin
from kilolock.redact import Redactor

_log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # provider schemas exceed grpc's 4 MiB default
_PROBE_TIMEOUT = 10.0
_SHUTDOWN_GRACE = 2.0  # go-plugin's Kill waits 2 s before SIGKILL


class PluginConnection:
    def __init__(self, process: PluginProcess, channel: Channel, tls: bool) -> None:
        assert process.handshake is not None
        self.process = process
        self.channel = channel
        self.tls = tls
        self.protocol_version = process.handshake.protocol_version
        self.name = process.spec.name
        self._closed = False
        self._close_lock = threading.Lock()
        self._stdio_thread = threading.Thread(target=self._drain_stdio, name=f"kl-{self.name}-stdio", daemon=True)

    def start_stdio(self) -> None:
        self._stdio_thread.start()

    @property
    def transport(self) -> str:
        """Which client carries the calls: "native" or "grpcio"."""
        return self.channel.transport

    def _drain_stdio(self) -> None:
        try:
            for data in self.channel.stream("/plugin.GRPCStdio/StreamStdio", b""):  # google.protobuf.Empty
                item = grpc_stdio_pb2.StdioData.FromString(data)
                channel = "stderr" if item.channel == grpc_stdio_pb2.StdioData.STDERR else "stdout"
                text = self.process.spec.secrets.redact(item.data.decode("utf-8", "replace").rstrip())
                self.process.logger.info("plugin %s: %s", channel, text)
        except RpcError as exc:
            # UNIMPLEMENTED from old go-plugin servers, CANCELLED/UNAVAILABLE at close: all normal.
            self.process.logger.debug("StreamStdio ended: %s", exc.code.name)
        except Exception as exc:  # noqa: BLE001 - a malformed message ends the log stream, not the run
            self.process.logger.debug("StreamStdio ended: %s", exc)

    def close(self) -> None:
        """Shutdown → close the channel → wait up to 2 s → SIGKILL; idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + _SHUTDOWN_GRACE  # one 2 s budget for Shutdown and the exit
        try:
            if self.process.alive():
                try:
                    self.channel.unary("/plugin.GRPCController/Shutdown", grpc_controller_pb2.Empty().SerializeToString(),
                                       timeout=_SHUTDOWN_GRACE)
                except RpcError as exc:
                    if exc.code not in (StatusCode.UNAVAILABLE, StatusCode.CANCELLED):
                        self.process.logger.debug("Shutdown answered %s; killing", exc.code.name)
        finally:
            self.channel.close()
            if not self.process.wait(max(0.1, deadline - time.monotonic())):
                self.process.logger.debug("plugin did not exit within %gs of Shutdown; sending SIGKILL", _SHUTDOWN_GRACE)
            self.process.kill()


def _probe(channel: Channel) -> RpcError | None:
    """Health.Check("plugin"), the service go-plugin registers; proves the channel works."""
    request = grpc_health_pb2.HealthCheckRequest(service="plugin").SerializeToString()
    try:
        channel.unary("/grpc.health.v1.Health/Check", request, timeout=_PROBE_TIMEOUT)
    except RpcError as exc:
        if exc.code == StatusCode.UNIMPLEMENTED:
            return None
        return exc
    return None


def _open_checked(process: PluginProcess, transport_name: str, use_tls: bool) -> tuple[Channel | None, str]:
    """A channel that answered the probe, or None and why not."""
    hs = process.handshake
    assert hs is not None
    tls = None
    if use_tls:
        assert hs.server_cert_der is not None
        cert = process_client_certificate()
        tls = (hs.server_cert_der, cert.cert_pem, cert.key_pem)
    try:
        channel = transport.open_channel(transport_name, hs.grpc_target, MAX_MESSAGE_BYTES, tls)
    except OSError as exc:
        return None, str(exc)
    failure = _probe(channel)
    if failure is None:
        return channel, ""
    channel.close()
    return None, failure.details


def connect(binary: str, name: str, *, tls: bool | None = None, start_timeout: float = DEFAULT_START_TIMEOUT,
            secrets: Redactor | None = None, cwd: str | None = None) -> PluginConnection:
    """Launch ``binary`` and return a working connection (TLS unless disabled or impossible).
    ``secrets`` are masked in whatever the plugin writes (None: it knows no secrets); ``cwd`` is
    the plugin's working directory (None: kl's)."""
    secrets = Redactor() if secrets is None else secrets
    choice = choose_tls(binary, tls)
    process = spawn_plugin(binary, name, choice, start_timeout, secrets, cwd)
    return connect_spawned(process, choice, start_timeout=start_timeout, secrets=secrets, cwd=cwd)


def connect_spawned(process: PluginProcess, choice: TlsChoice, *, start_timeout: float, secrets: Redactor,
                    cwd: str | None) -> PluginConnection:
    """A working connection to a plugin ``spawn_plugin`` started with ``choice``; on a failed
    AutoMTLS attempt the plugin is started again without TLS."""
    binary, name = process.spec.binary, process.spec.name
    client = transport.client_id(choice.transport)
    if choice.remembered is not None and choice.remembered != client:
        # The failure was remembered under another grpcio, which may verify what this one cannot:
        # this plugin was started without TLS on that memory alone, so start it again and try.
        process.kill()
        _log.info("AutoMTLS with %s failed under %s; trying again under %s", binary, choice.remembered, client)
        choice = TlsChoice(True, choice.transport)
        process = spawn_plugin(binary, name, choice, start_timeout, secrets, cwd)
    want_tls = choice.offered
    try:
        hs = process.wait_for_handshake()
        use_tls = want_tls and hs.server_cert_der is not None
        if want_tls and not use_tls:
            process.logger.info("%s offered no server certificate (no AutoMTLS support); using plaintext on a private socket", binary)
        channel, detail = _open_checked(process, choice.transport, use_tls)
    except BaseException:
        process.kill()
        raise
    if channel is not None:
        if use_tls and tlsmemo.failed_with(binary) is not None:
            tlsmemo.forget(binary)  # it works under this client
        conn = PluginConnection(process, channel, use_tls)
        conn.start_stdio()
        return conn
    alive = process.alive()
    process.kill()
    if use_tls and alive:
        spawn.tls_failed_here.add(binary)
        tlsmemo.remember_failure(binary, client)
        # Expected with every current Go provider under grpcio (P-521 certificate under TLS 1.3,
        # which grpcio cannot verify: docs/refresh.md "Provider transport and logs"), so INFO, not a warning on every run.
        _log.info(
            "%s could not complete AutoMTLS with %s (%s); falling back to plaintext gRPC on a private "
            "0700 unix socket directory (set KL_DISABLE_PLUGIN_TLS=1 to skip the attempt; remembered in %s)",
            client,
            binary,
            detail,
            tlsmemo.memo_path(),
        )
        return connect(binary, name, tls=False, start_timeout=start_timeout, secrets=secrets, cwd=cwd)
    raise PluginStartError(f"{binary} completed the handshake but does not answer gRPC ({process.exit_description()}): {detail}")
