"""``ProviderClient``: the calls a refresh makes, over protocol 5 or 6 through one implementation.

The two protocol versions differ only in RPC and message names, captured in a ``_Dialect``. The
client moves bytes: DynamicValue msgpack in and out, raw state JSON in; it never decodes either.
It is safe to call from many threads at once (grpc channels are), which the refresh relies on.
"""
from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import grpc

from kilolock.provider import convert, h2channel
from kilolock.provider._pb import tfplugin5_pb2, tfplugin6_pb2
from kilolock.provider.certs import process_client_certificate
from kilolock.provider.connection import MAX_MESSAGE_BYTES, PluginConnection, open_aio_channel
from kilolock.provider.diagnostics import Diagnostic, errors_of
from kilolock.provider.errors import ProviderCallError, ProviderDiagnosticsError
from kilolock.provider.h2channel import H2Calls
from kilolock.provider.wire import (
    DynamicNull,
    dynamic_value_bytes,
    message_field,
    read_resource_request,
    string_field,
    undeclared_field_payloads,
)
from kilolock.schema import AttributePath, ProviderSchema, Schema

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs 3.11

# Sent as Configure.terraform_version. Providers rarely look at it; we report the Terraform whose
# refresh semantics kl follows (sensitive paths as of 1.8).
DEFAULT_TERRAFORM_VERSION = "1.8.5"
_log = logging.getLogger(__name__)
_SENSITIVE_PATHS_FIELD = 6


# Slotted rather than frozen, as ReadOutcome: one is made per instance read, and a frozen
# dataclass's __init__ (object.__setattr__ per field) costs three times as much.
@dataclass(slots=True)
class ReadResult:
    """A ReadResource answer as kl uses it."""

    new_state: bytes | None  # cty msgpack; None when the object no longer exists
    private: bytes
    diagnostics: tuple[Diagnostic, ...]  # warnings only: errors raise ProviderDiagnosticsError
    new_identity: bytes | None
    # The undeclared field 6 of ReadResource.Response: the ADR's repeated AttributePath of dynamic
    # sensitive paths, in the order sent. Usually empty.
    sensitive_paths: tuple[AttributePath, ...] = ()
    deferred_reason: int | None = None


class ProviderClient(abc.ABC):
    """What the refresh needs from one provider process, whatever its protocol version."""

    name: str
    protocol_version: int

    @abc.abstractmethod
    def get_schema(self) -> ProviderSchema: ...

    @abc.abstractmethod
    def get_identity_schemas(self) -> dict[str, Schema]:
        """Resource identity schemas by resource type; {} when the provider has none."""

    @abc.abstractmethod
    def validate_config(self, config_msgpack: bytes) -> tuple[Diagnostic, ...]: ...

    @abc.abstractmethod
    def configure(self, config_msgpack: bytes, terraform_version: str = DEFAULT_TERRAFORM_VERSION) -> tuple[Diagnostic, ...]: ...

    @abc.abstractmethod
    def upgrade_resource_state(self, type_name: str, version: int, raw_state_json: bytes,
                               flatmap: dict[str, str] | None = None) -> bytes | None:
        """With ``flatmap``, the state is sent as RawState.flatmap (the pre-0.12 form) instead of JSON."""

    @abc.abstractmethod
    def upgrade_resource_identity(self, type_name: str, version: int, raw_identity_json: bytes) -> bytes | None:
        """UpgradeResourceIdentity (protocol 5.9/6.9): the identity stored under identity schema
        ``version``, as JSON, to the provider's current identity version; cty msgpack back."""

    @abc.abstractmethod
    def read_resource(
        self,
        type_name: str,
        current_state: bytes,
        private: bytes = b"",
        *,
        provider_meta: bytes | None = None,
        current_identity: bytes | None = None,
        timeout: float | None = None,
    ) -> ReadResult: ...

    def async_reads(self, native: bool = True) -> AsyncReads | None:
        """ReadResource from an asyncio event loop (see AsyncReads); None: only the calls above.
        ``native``: through the extension's HTTP/2 client where it is built (else grpc.aio)."""
        return None

    @abc.abstractmethod
    def stop(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class _Dialect:
    """The generated module and method names of one plugin protocol version (5 or 6)."""

    pb: ModuleType
    service: str
    get_schema: str
    validate: str
    configure: str
    stop: str

    @property
    def validate_request(self) -> Any:
        return getattr(self.pb, self.validate).Request

    @property
    def configure_request(self) -> Any:
        return getattr(self.pb, self.configure).Request


_DIALECTS = {
    5: _Dialect(tfplugin5_pb2, "tfplugin5.Provider", "GetSchema", "PrepareProviderConfig", "Configure", "Stop"),
    6: _Dialect(tfplugin6_pb2, "tfplugin6.Provider", "GetProviderSchema", "ValidateProviderConfig", "ConfigureProvider", "StopProvider"),
}
_MESSAGE_FOR_RPC = {"GetSchema": "GetProviderSchema", "GetProviderSchema": "GetProviderSchema"}


class GrpcProviderClient(ProviderClient):
    def __init__(self, connection: PluginConnection, rpc_timeout: float | None = None) -> None:
        self._conn = connection
        # A provider that hangs (a wedged API client, a lost network) must not hold a run forever.
        self._rpc_timeout = rpc_timeout
        self.name = connection.name
        self.protocol_version = connection.protocol_version
        self._d = _DIALECTS[connection.protocol_version]
        pb = self._d.pb
        self._rpc_get_schema = self._unary(self._d.get_schema, pb.GetProviderSchema.Response.FromString)
        self._rpc_identity = self._unary("GetResourceIdentitySchemas", pb.GetResourceIdentitySchemas.Response.FromString)
        self._rpc_validate = self._unary(self._d.validate, getattr(pb, self._d.validate).Response.FromString)
        self._rpc_configure = self._unary(self._d.configure, getattr(pb, self._d.configure).Response.FromString)
        self._rpc_upgrade = self._unary("UpgradeResourceState", pb.UpgradeResourceState.Response.FromString)
        self._rpc_upgrade_identity = self._unary("UpgradeResourceIdentity", pb.UpgradeResourceIdentity.Response.FromString)
        self._rpc_stop = self._unary(self._d.stop, getattr(pb, self._d.stop).Response.FromString)
        self._caps = pb.ClientCapabilities(deferral_allowed=False, write_only_attributes_allowed=True)
        # Reads send bytes made by wire.read_resource_request, not a message built per read.
        self._rpc_read = self._conn.channel.unary_unary(f"/{self._d.service}/ReadResource", request_serializer=None,
                                                        response_deserializer=pb.ReadResource.Response.FromString)
        self._caps_field = message_field(5, self._caps)
        self._type_fields: dict[str, bytes] = {}  # ReadResource.Request field 1, per resource type

    @property
    def connection(self) -> PluginConnection:
        return self._conn

    def _unary(self, method: str, deserializer: Callable[[bytes], Any] | None) -> grpc.UnaryUnaryMultiCallable[Any, Any]:
        return self._conn.channel.unary_unary(
            f"/{self._d.service}/{method}",
            request_serializer=_serialize,
            response_deserializer=deserializer,
        )

    def _call(self, rpc: str, fn: grpc.UnaryUnaryMultiCallable[Any, Any], request: Any, timeout: float | None = None) -> Any:
        timeout = self._rpc_timeout if timeout is None else timeout
        try:
            return fn(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise self._call_error(rpc, exc, timeout) from None

    def _call_error(self, rpc: str, exc: grpc.RpcError, timeout: float | None = None) -> ProviderCallError:
        code = exc.code()
        details = exc.details()
        proc = self._conn.process
        proc.wait(0.2)  # a crash shows up as UNAVAILABLE just before the exit status does
        if not proc.alive():
            tail = [line for line in proc.stderr_tail() if line][-5:]
            extra = ("; stderr: " + " | ".join(tail)) if tail else ""
            return ProviderCallError(f"provider {self.name}: the plugin exited during {rpc} ({proc.exit_description()}){extra}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            within = f" within {timeout:g}s" if timeout is not None else " in time"
            return ProviderCallError(f"provider {self.name}: {rpc} did not answer{within}")
        if code == grpc.StatusCode.UNAVAILABLE:
            return ProviderCallError(f"provider {self.name}: plugin did not respond to {rpc}: {details}")
        return ProviderCallError(f"provider {self.name}: {rpc} failed with {code.name}: {details}")

    def _check(self, rpc: str, what: str, diags: tuple[Diagnostic, ...]) -> tuple[Diagnostic, ...]:
        errors = errors_of(diags)
        if errors:
            text = "; ".join(d.describe() for d in errors)
            raise ProviderDiagnosticsError(f"provider {self.name}: {rpc}{what}: {text}", diags)
        return diags

    # -- the calls --

    def get_schema(self) -> ProviderSchema:
        resp = self._call(self._d.get_schema, self._rpc_get_schema, self._d.pb.GetProviderSchema.Request())
        self._check(self._d.get_schema, "", convert.diagnostics(resp.diagnostics))
        if not resp.HasField("provider"):
            raise ProviderCallError(f"provider {self.name}: {self._d.get_schema} returned no provider schema")
        return convert.provider_schema(resp, self.protocol_version)

    def get_identity_schemas(self) -> dict[str, Schema]:
        try:
            resp = self._rpc_identity(self._d.pb.GetResourceIdentitySchemas.Request(), timeout=self._rpc_timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return {}  # providers older than protocol 5.9/6.9, as Terraform treats them
            raise self._call_error("GetResourceIdentitySchemas", exc, self._rpc_timeout) from None
        self._check("GetResourceIdentitySchemas", "", convert.diagnostics(resp.diagnostics))
        return convert.identity_schemas(resp)

    def validate_config(self, config_msgpack: bytes) -> tuple[Diagnostic, ...]:
        req = self._d.validate_request(config=self._d.pb.DynamicValue(msgpack=config_msgpack))
        resp = self._call(self._d.validate, self._rpc_validate, req)
        return self._check(self._d.validate, "", convert.diagnostics(resp.diagnostics))

    def configure(self, config_msgpack: bytes, terraform_version: str = DEFAULT_TERRAFORM_VERSION) -> tuple[Diagnostic, ...]:
        req = self._d.configure_request(
            terraform_version=terraform_version,
            config=self._d.pb.DynamicValue(msgpack=config_msgpack),
            client_capabilities=self._caps,
        )
        resp = self._call(self._d.configure, self._rpc_configure, req)
        return self._check(self._d.configure, "", convert.diagnostics(resp.diagnostics))

    def upgrade_resource_state(self, type_name: str, version: int, raw_state_json: bytes,
                               flatmap: dict[str, str] | None = None) -> bytes | None:
        pb = self._d.pb
        raw = pb.RawState(flatmap=flatmap) if flatmap is not None else pb.RawState(json=raw_state_json)
        req = pb.UpgradeResourceState.Request(type_name=type_name, version=version, raw_state=raw)
        resp = self._call("UpgradeResourceState", self._rpc_upgrade, req)
        self._check("UpgradeResourceState", f" {type_name}", convert.diagnostics(resp.diagnostics))
        return self._dynamic(resp, "upgraded_state", "UpgradeResourceState")

    def upgrade_resource_identity(self, type_name: str, version: int, raw_identity_json: bytes) -> bytes | None:
        pb = self._d.pb
        req = pb.UpgradeResourceIdentity.Request(type_name=type_name, version=version,
                                                 raw_identity=pb.RawState(json=raw_identity_json))
        resp = self._call("UpgradeResourceIdentity", self._rpc_upgrade_identity, req)
        self._check("UpgradeResourceIdentity", f" {type_name}", convert.diagnostics(resp.diagnostics))
        if not (resp.HasField("upgraded_identity") and resp.upgraded_identity.HasField("identity_data")):
            return None
        return self._dynamic(resp.upgraded_identity, "identity_data", "UpgradeResourceIdentity")

    def read_resource(
        self,
        type_name: str,
        current_state: bytes,
        private: bytes = b"",
        *,
        provider_meta: bytes | None = None,
        current_identity: bytes | None = None,
        timeout: float | None = None,
    ) -> ReadResult:
        req = self._read_request(type_name, current_state, private, provider_meta, current_identity)
        return self._read_result(type_name, self._call("ReadResource", self._rpc_read, req, timeout))

    def async_reads(self, native: bool = True) -> AsyncReads:
        return AsyncReads(self, native)

    def _read_request(self, type_name: str, current_state: bytes, private: bytes, provider_meta: bytes | None,
                      current_identity: bytes | None) -> bytes:
        type_field = self._type_fields.get(type_name)
        if type_field is None:
            type_field = self._type_fields.setdefault(type_name, string_field(1, type_name))
        return read_resource_request(type_field, current_state, private, self._caps_field, provider_meta, current_identity)

    def _read_result(self, type_name: str, resp: Any) -> ReadResult:
        diags = self._check("ReadResource", f" {type_name}", convert.diagnostics(resp.diagnostics)) if resp.diagnostics else ()
        identity = None
        if resp.HasField("new_identity") and resp.new_identity.HasField("identity_data"):
            identity = self._dynamic(resp.new_identity, "identity_data", "ReadResource")
        return ReadResult(
            new_state=self._dynamic(resp, "new_state", "ReadResource"),
            private=resp.private,
            diagnostics=diags,
            new_identity=identity,
            sensitive_paths=self._sensitive_paths(resp),
            deferred_reason=resp.deferred.reason if resp.HasField("deferred") else None,
        )

    def _sensitive_paths(self, resp: Any) -> tuple[AttributePath, ...]:
        try:
            return convert.undeclared_attribute_paths(undeclared_field_payloads(resp, _SENSITIVE_PATHS_FIELD), self._d.pb.AttributePath)
        except ValueError as exc:
            raise ProviderCallError(f"provider {self.name}: ReadResource: malformed sensitive paths (field 6): {exc}") from None

    def _dynamic(self, msg: Any, field: str, rpc: str) -> bytes | None:
        try:
            return dynamic_value_bytes(getattr(msg, field)) if msg.HasField(field) else None
        except DynamicNull:
            return None
        except ValueError as exc:
            raise ProviderCallError(f"provider {self.name}: {rpc}: {exc}") from None

    def stop(self) -> None:
        resp = self._call(self._d.stop, self._rpc_stop, getattr(self._d.pb, self._d.stop).Request(), timeout=10.0)
        if resp.Error:
            raise ProviderCallError(f"provider {self.name}: {self._d.stop} failed: {resp.Error}")

    def close(self) -> None:
        self._conn.close()


class AsyncReads:
    """ReadResource for a refresh that keeps many reads in flight from one event loop: through the
    native HTTP/2 client (h2channel) where the extension is built, else through grpc.aio. Per
    call, grpc.aio costs about two thirds of the CPU of the blocking API, whose reader threads also
    contend for the GIL with each other and with grpc's own threads; the native client less again.

    Opened inside the loop that will use it (the channel binds to it) and closed there; the
    request bytes and the conversion of the answer are the blocking client's, so the two paths
    cannot differ in what they send or how they read what comes back.
    """

    def __init__(self, client: GrpcProviderClient, native: bool = True) -> None:
        self._client = client
        self._read_path = f"/{client._d.service}/ReadResource"
        self._h2 = _h2_calls(client.connection) if native else None
        self._channel: grpc.aio.Channel | None = None
        if self._h2 is None:
            self._channel = open_aio_channel(client.connection)
            pb = client._d.pb
            self._rpc_read = self._channel.unary_unary(self._read_path, request_serializer=None,
                                                       response_deserializer=pb.ReadResource.Response.FromString)

    @property
    def transport(self) -> str:
        """Which client carries the reads: "native" (the extension's HTTP/2) or "grpcio"."""
        return "native" if self._h2 is not None else "grpcio"

    async def read_resource(self, type_name: str, current_state: bytes, private: bytes = b"", *,
                            provider_meta: bytes | None = None, current_identity: bytes | None = None,
                            timeout: float | None = None) -> ReadResult:
        c = self._client
        req = c._read_request(type_name, current_state, private, provider_meta, current_identity)
        timeout = c._rpc_timeout if timeout is None else timeout
        try:
            if self._h2 is not None:
                resp = c._d.pb.ReadResource.Response.FromString(await self._h2.call(self._read_path, req, timeout))
            else:
                resp = await self._rpc_read(req, timeout=timeout)
        except grpc.RpcError as exc:
            # The error's wording waits briefly for a crashed plugin's exit status: off the loop.
            raise await asyncio.to_thread(c._call_error, "ReadResource", exc, timeout) from None
        return c._read_result(type_name, resp)

    async def aclose(self) -> None:
        if self._h2 is not None:
            self._h2.close()
        if self._channel is not None:
            await self._channel.close(None)


def _h2_calls(connection: PluginConnection) -> H2Calls | None:
    """The native HTTP/2 client to this plugin, when it is built: over TLS where the grpcio
    channel uses AutoMTLS (the same certificates), else plaintext as that channel is."""
    native = h2channel.native_module()
    if native is None:
        return None
    hs = connection.process.handshake
    assert hs is not None
    tls = None
    if connection.tls:
        assert hs.server_cert_der is not None
        cert = process_client_certificate()
        tls = (hs.server_cert_der, cert.cert_pem, cert.key_pem)
    try:
        return H2Calls(native, hs.grpc_target, MAX_MESSAGE_BYTES, tls)
    except OSError as exc:
        _log.info("the native HTTP/2 client could not connect to provider %s (%s); reading through grpc.aio",
                  connection.name, exc)
        return None


def _serialize(msg: Any) -> bytes:
    return bytes(msg.SerializeToString())
