"""A launched plugin plus its gRPC channel: AutoMTLS, readiness probe, StreamStdio, ordered close.

AutoMTLS is on unless ``KL_DISABLE_PLUGIN_TLS`` (or Terraform's own ``TF_DISABLE_PLUGIN_TLS``) is
set. go-plugin servers always present a P-521 certificate. Under TLS 1.2 (providers built with old
Go, e.g. null 2.1.2) grpcio completes the handshake. Under TLS 1.3, which every current Go
negotiates, the server must sign with ecdsa_secp521r1_sha512, and grpcio's BoringSSL does not offer
that signature algorithm, nor can it be configured (grpc/grpc#41089): the server answers
handshake_failure. kl then starts the provider again without ``PLUGIN_CLIENT_CERT``: plaintext gRPC
over a unix socket in a private 0700 directory (PLUGIN_UNIX_SOCKET_DIR) that only kl's user can
reach, logs it at INFO, and skips the attempt for that binary from then on: for the rest of the
process, and in later runs through ``tlsmemo`` (keyed by the binary's path, size and mtime and the
grpcio version).
Every plugin gets such a private socket directory, TLS or not (go-plugin < 1.5 ignores it and uses
$TMPDIR, where the socket is still closed to other users by its mode).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Literal, overload

# grpc's C core prints a line on stderr for every failed TLS handshake, and the AutoMTLS fallback
# below makes that routine; kl reports it through logging instead. Only a default: an operator's
# own GRPC_VERBOSITY wins, and it must be set before grpc is first imported to take effect.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc
import grpc.aio
from google.protobuf import empty_pb2

from kilolock.provider import launch, tlsmemo
from kilolock.provider._pb import grpc_controller_pb2, grpc_health_pb2, grpc_stdio_pb2
from kilolock.provider.certs import der_to_pem, process_client_certificate
from kilolock.provider.errors import PluginStartError
from kilolock.provider.launch import DEFAULT_START_TIMEOUT, TlsChoice, choose_tls, spawn_plugin
from kilolock.provider.process import PluginProcess
from kilolock.redact import Redactor

_log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # provider schemas exceed grpc's 4 MiB default
_PROBE_TIMEOUT = 10.0
_SHUTDOWN_GRACE = 2.0  # go-plugin's Kill waits 2 s before SIGKILL


class PluginConnection:
    def __init__(self, process: PluginProcess, channel: grpc.Channel, tls: bool) -> None:
        assert process.handshake is not None
        self.process = process
        self.channel = channel
        self.tls = tls
        self.protocol_version = process.handshake.protocol_version
        self.name = process.spec.name
        self._closed = False
        self._close_lock = threading.Lock()
        self._stdio_call: grpc.CallIterator[Any] | None = None
        self._stdio_thread = threading.Thread(target=self._drain_stdio, name=f"kl-{self.name}-stdio", daemon=True)

    def start_stdio(self) -> None:
        self._stdio_thread.start()

    def _drain_stdio(self) -> None:
        stream = self.channel.unary_stream(
            "/plugin.GRPCStdio/StreamStdio",
            request_serializer=empty_pb2.Empty.SerializeToString,
            response_deserializer=grpc_stdio_pb2.StdioData.FromString,
        )
        try:
            call = stream(empty_pb2.Empty())
            self._stdio_call = call
            for item in call:
                channel = "stderr" if item.channel == grpc_stdio_pb2.StdioData.STDERR else "stdout"
                text = self.process.spec.secrets.redact(item.data.decode("utf-8", "replace").rstrip())
                self.process.logger.info("plugin %s: %s", channel, text)
        except grpc.RpcError as exc:
            # UNIMPLEMENTED from old go-plugin servers, CANCELLED/UNAVAILABLE at close: all normal.
            self.process.logger.debug("StreamStdio ended: %s", exc.code())

    def close(self) -> None:
        """Shutdown → close the channel → wait up to 2 s → SIGKILL; idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + _SHUTDOWN_GRACE  # one 2 s budget for Shutdown and the exit
        try:
            if self.process.alive():
                shutdown = self.channel.unary_unary(
                    "/plugin.GRPCController/Shutdown",
                    request_serializer=grpc_controller_pb2.Empty.SerializeToString,
                    response_deserializer=grpc_controller_pb2.Empty.FromString,
                )
                try:
                    shutdown(grpc_controller_pb2.Empty(), timeout=_SHUTDOWN_GRACE)
                except grpc.RpcError as exc:
                    code = exc.code()
                    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                        self.process.logger.debug("Shutdown answered %s; killing", code)
        finally:
            self.channel.close()
            if not self.process.wait(max(0.1, deadline - time.monotonic())):
                self.process.logger.debug("plugin did not exit within %gs of Shutdown; sending SIGKILL", _SHUTDOWN_GRACE)
            self.process.kill()


def open_aio_channel(connection: PluginConnection) -> grpc.aio.Channel:
    """A second channel to the plugin, for grpc.aio: bound to the event loop running when it is
    made, which must also close it. Same target and credentials as ``connection.channel``."""
    return _open_channel(connection.process, connection.tls, aio=True)


@overload
def _open_channel(process: PluginProcess, tls: bool) -> grpc.Channel: ...
@overload
def _open_channel(process: PluginProcess, tls: bool, aio: Literal[True]) -> grpc.aio.Channel: ...
def _open_channel(process: PluginProcess, tls: bool, aio: bool = False) -> grpc.Channel | grpc.aio.Channel:
    hs = process.handshake
    assert hs is not None
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if not tls:
        return (grpc.aio.insecure_channel if aio else grpc.insecure_channel)(hs.grpc_target, options=options)
    assert hs.server_cert_der is not None
    cert = process_client_certificate()
    creds = grpc.ssl_channel_credentials(
        root_certificates=der_to_pem(hs.server_cert_der),
        private_key=cert.key_pem,
        certificate_chain=cert.cert_pem,
    )
    options.append(("grpc.ssl_target_name_override", "localhost"))
    return (grpc.aio.secure_channel if aio else grpc.secure_channel)(hs.grpc_target, creds, options=options)


def _probe(channel: grpc.Channel) -> grpc.RpcError | None:
    """Health.Check("plugin"), the service go-plugin registers; proves the channel works."""
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=grpc_health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=grpc_health_pb2.HealthCheckResponse.FromString,
    )
    try:
        check(grpc_health_pb2.HealthCheckRequest(service="plugin"), timeout=_PROBE_TIMEOUT, wait_for_ready=False)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            return None
        return exc
    return None


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
    if choice.remembered_grpcio is not None and choice.remembered_grpcio != grpc.__version__:
        # The failure was remembered under another grpcio, which may verify what this one cannot:
        # this plugin was started without TLS on that memory alone, so start it again and try.
        process.kill()
        _log.info("AutoMTLS with %s failed under grpcio %s; trying again under %s", binary, choice.remembered_grpcio,
                  grpc.__version__)
        choice = TlsChoice(True)
        process = spawn_plugin(binary, name, choice, start_timeout, secrets, cwd)
    want_tls = choice.offered
    try:
        hs = process.wait_for_handshake()
        use_tls = want_tls and hs.server_cert_der is not None
        if want_tls and not use_tls:
            process.logger.info("%s offered no server certificate (no AutoMTLS support); using plaintext on a private socket", binary)
        channel = _open_channel(process, use_tls)
        failure = _probe(channel)
    except BaseException:
        process.kill()
        raise
    if failure is None:
        if use_tls and tlsmemo.failed_with(binary) is not None:
            tlsmemo.forget(binary)  # it works under this grpcio
        conn = PluginConnection(process, channel, use_tls)
        conn.start_stdio()
        return conn
    channel.close()
    alive = process.alive()
    detail = failure.details()
    process.kill()
    if use_tls and alive:
        launch.tls_failed_here.add(binary)
        tlsmemo.remember_failure(binary, grpc.__version__)
        # Expected with every current Go provider (P-521 certificate under TLS 1.3, which grpcio
        # cannot verify: README "Provider transport"), so INFO, not a warning on every run.
        _log.info(
            "grpcio could not complete AutoMTLS with %s (%s); falling back to plaintext gRPC on a private "
            "0700 unix socket directory (set KL_DISABLE_PLUGIN_TLS=1 to skip the attempt; remembered in %s)",
            binary,
            detail,
            tlsmemo.memo_path(),
        )
        return connect(binary, name, tls=False, start_timeout=start_timeout, secrets=secrets, cwd=cwd)
    raise PluginStartError(f"{binary} completed the handshake but does not answer gRPC ({process.exit_description()}): {detail}")
