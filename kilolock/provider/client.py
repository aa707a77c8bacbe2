"""``ProviderClient``: the calls a refresh makes, over protocol 5 or 6 through one implementation.

The two protocol versions differ only in RPC and message names, captured in a ``_Dialect``. The
client moves bytes: DynamicValue msgpack in and out, raw state JSON in; it never decodes either.
It serializes and parses the messages with the generated protobuf classes and hands the bytes to
the connection's channel (kilolock.provider.rpc: the native HTTP/2 client or grpcio). It is safe
to call from many threads at once (both channels are), which the refresh relies on.
"""
from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Generator
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from kilolock.provider import convert
from kilolock.provider._pb import tfplugin5_pb2, tfplugin6_pb2
from kilolock.provider.connection import PluginConnection
from kilolock.provider.diagnostics import Diagnostic, errors_of
from kilolock.provider.errors import ListingUnsupported, ProviderCallError, ProviderDiagnosticsError
from kilolock.provider.h2channel import H2Calls, NativeChannel
from kilolock.provider.rpc import RpcError, StatusCode
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

    from kilolock.provider.grpcio_channel import AioCalls

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


@dataclass(frozen=True)
class ListEvent:
    """One ListResource event: an object the provider sees, or (identity None) only diagnostics."""

    identity: bytes | None  # cty msgpack under the type's identity schema
    display_name: str
    diagnostics: tuple[Diagnostic, ...]  # warnings only: an error ends the listing (ProviderDiagnosticsError)


class ProviderClient(abc.ABC):
    """What the refresh needs from one provider process, whatever its protocol version."""

    name: str
    protocol_version: int
    transport: str  # which client carries the calls: "native" or "grpcio" (kilolock.provider.transport)

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

    @abc.abstractmethod
    def validate_list_config(self, type_name: str, config_msgpack: bytes, limit: int) -> tuple[Diagnostic, ...]:
        """ValidateListResourceConfig (protocol 5.10/6.10); ListingUnsupported when the provider
        does not implement it."""

    @abc.abstractmethod
    def list_resource(self, type_name: str, config_msgpack: bytes, limit: int) -> Generator[ListEvent, None, None]:
        """ListResource (protocol 5.10/6.10), a server stream read as it comes: at most ``limit``
        events (0: the provider's own end). Closing the iterator early cancels the call.
        ListingUnsupported when the provider does not implement it."""

    def async_reads(self) -> AsyncReads | None:
        """ReadResource from an asyncio event loop (see AsyncReads); None: only the calls above."""
        return None

    @abc.abstractmethod
    def stop(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def kill(self) -> None:
        """SIGKILL the plugin now, whatever it is doing (its calls in flight fail); close() still
        cleans up after it. For a cancellation that cannot wait for close()'s Shutdown."""

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
        self.transport = connection.transport
        self._d = _DIALECTS[connection.protocol_version]
        pb = self._d.pb
        self._channel = connection.channel
        self._caps = pb.ClientCapabilities(deferral_allowed=False, write_only_attributes_allowed=True)
        self._read_path = self._path("ReadResource")
        # Reads send bytes made by wire.read_resource_request, not a message built per read.
        self._caps_field = message_field(5, self._caps)
        self._type_fields: dict[str, bytes] = {}  # ReadResource.Request field 1, per resource type

    @property
    def connection(self) -> PluginConnection:
        return self._conn

    def _path(self, method: str) -> str:
        return f"/{self._d.service}/{method}"

    def _call(self, rpc: str, request: Any, answer: type[Any], timeout: float | None = None) -> Any:
        """``rpc`` of this dialect with ``request`` (a message); the answer parsed as ``answer``."""
        return self._parse(rpc, answer, self._send(rpc, self._path(rpc), request.SerializeToString(), timeout))

    def _send(self, rpc: str, path: str, data: bytes, timeout: float | None) -> bytes:
        """The answer's bytes to ``data`` sent to ``path``; a ProviderCallError naming ``rpc``."""
        timeout = self._rpc_timeout if timeout is None else timeout
        try:
            return self._channel.unary(path, data, timeout)
        except RpcError as exc:
            raise self._call_error(rpc, exc, timeout) from None

    def _parse(self, rpc: str, answer: type[Any], data: bytes) -> Any:
        try:
            return answer.FromString(data)
        except DecodeError as exc:
            raise ProviderCallError(f"provider {self.name}: {rpc} answered with a malformed message: {exc}") from None

    def _call_error(self, rpc: str, exc: RpcError, timeout: float | None = None) -> ProviderCallError:
        code, details = exc.code, exc.details
        proc = self._conn.process
        proc.wait(0.2)  # a crash shows up as UNAVAILABLE just before the exit status does
        if not proc.alive():
            tail = [line for line in proc.stderr_tail() if line][-5:]
            extra = ("; stderr: " + " | ".join(tail)) if tail else ""
            return ProviderCallError(f"provider {self.name}: the plugin exited during {rpc} ({proc.exit_description()}){extra}")
        if code == StatusCode.DEADLINE_EXCEEDED:
            within = f" within {timeout:g}s" if timeout is not None else " in time"
            return ProviderCallError(f"provider {self.name}: {rpc} did not answer{within}")
        if code == StatusCode.UNAVAILABLE:
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
        pb = self._d.pb
        resp = self._call(self._d.get_schema, pb.GetProviderSchema.Request(), pb.GetProviderSchema.Response)
        self._check(self._d.get_schema, "", convert.diagnostics(resp.diagnostics))
        if not resp.HasField("provider"):
            raise ProviderCallError(f"provider {self.name}: {self._d.get_schema} returned no provider schema")
        return convert.provider_schema(resp, self.protocol_version)

    def get_identity_schemas(self) -> dict[str, Schema]:
        pb, rpc = self._d.pb, "GetResourceIdentitySchemas"
        try:
            data = self._channel.unary(self._path(rpc), pb.GetResourceIdentitySchemas.Request().SerializeToString(),
                                       self._rpc_timeout)
        except RpcError as exc:
            if exc.code == StatusCode.UNIMPLEMENTED:
                return {}  # providers older than protocol 5.9/6.9, as Terraform treats them
            raise self._call_error(rpc, exc, self._rpc_timeout) from None
        resp = self._parse(rpc, pb.GetResourceIdentitySchemas.Response, data)
        self._check("GetResourceIdentitySchemas", "", convert.diagnostics(resp.diagnostics))
        return convert.identity_schemas(resp)

    def validate_config(self, config_msgpack: bytes) -> tuple[Diagnostic, ...]:
        req = self._d.validate_request(config=self._d.pb.DynamicValue(msgpack=config_msgpack))
        resp = self._call(self._d.validate, req, getattr(self._d.pb, self._d.validate).Response)
        return self._check(self._d.validate, "", convert.diagnostics(resp.diagnostics))

    def configure(self, config_msgpack: bytes, terraform_version: str = DEFAULT_TERRAFORM_VERSION) -> tuple[Diagnostic, ...]:
        req = self._d.configure_request(
            terraform_version=terraform_version,
            config=self._d.pb.DynamicValue(msgpack=config_msgpack),
            client_capabilities=self._caps,
        )
        resp = self._call(self._d.configure, req, getattr(self._d.pb, self._d.configure).Response)
        return self._check(self._d.configure, "", convert.diagnostics(resp.diagnostics))

    def upgrade_resource_state(self, type_name: str, version: int, raw_state_json: bytes,
                               flatmap: dict[str, str] | None = None) -> bytes | None:
        pb = self._d.pb
        raw = pb.RawState(flatmap=flatmap) if flatmap is not None else pb.RawState(json=raw_state_json)
        req = pb.UpgradeResourceState.Request(type_name=type_name, version=version, raw_state=raw)
        resp = self._call("UpgradeResourceState", req, pb.UpgradeResourceState.Response)
        self._check("UpgradeResourceState", f" {type_name}", convert.diagnostics(resp.diagnostics))
        return self._dynamic(resp, "upgraded_state", "UpgradeResourceState")

    def upgrade_resource_identity(self, type_name: str, version: int, raw_identity_json: bytes) -> bytes | None:
        pb = self._d.pb
        req = pb.UpgradeResourceIdentity.Request(type_name=type_name, version=version,
                                                 raw_identity=pb.RawState(json=raw_identity_json))
        resp = self._call("UpgradeResourceIdentity", req, pb.UpgradeResourceIdentity.Response)
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
        return self._read_result(type_name, self._send("ReadResource", self._read_path, req, timeout))

    def validate_list_config(self, type_name: str, config_msgpack: bytes, limit: int) -> tuple[Diagnostic, ...]:
        pb, rpc = self._d.pb, "ValidateListResourceConfig"
        req = pb.ValidateListResourceConfig.Request(
            type_name=type_name, config=pb.DynamicValue(msgpack=config_msgpack),
            # Terraform sends these as values too: a number, and false for include_resource_object.
            include_resource_object=pb.DynamicValue(msgpack=b"\xc2"), limit=pb.DynamicValue(msgpack=_msgpack_int(limit)))
        try:
            data = self._channel.unary(self._path(rpc), req.SerializeToString(), self._rpc_timeout)
        except RpcError as exc:
            raise self._listing_error(rpc, exc) from None
        resp = self._parse(rpc, pb.ValidateListResourceConfig.Response, data)
        return self._check(rpc, f" {type_name}", convert.diagnostics(resp.diagnostics))

    def list_resource(self, type_name: str, config_msgpack: bytes, limit: int) -> Generator[ListEvent, None, None]:
        pb, rpc = self._d.pb, "ListResource"
        req = pb.ListResource.Request(type_name=type_name, config=pb.DynamicValue(msgpack=config_msgpack),
                                      include_resource_object=False, limit=limit)
        events = self._channel.stream(self._path(rpc), req.SerializeToString())
        sent = 0
        try:
            for data in events:
                event = self._list_event(type_name, self._parse(rpc, pb.ListResource.Event, data))
                yield event
                if event.identity is not None:
                    sent += 1
                    if limit and sent >= limit:  # the provider should have stopped here: we do
                        return
        except RpcError as exc:
            raise self._listing_error(rpc, exc) from None
        finally:
            events.close()  # cancels the call when the reader stops early

    def _list_event(self, type_name: str, msg: Any) -> ListEvent:
        diags = self._check("ListResource", f" {type_name}", convert.diagnostics(msg.diagnostic)) if msg.diagnostic else ()
        identity = None
        if msg.HasField("identity") and msg.identity.HasField("identity_data"):
            identity = self._dynamic(msg.identity, "identity_data", "ListResource")
        return ListEvent(identity, msg.display_name, diags)

    def _listing_error(self, rpc: str, exc: RpcError) -> ProviderCallError:
        if exc.code == StatusCode.UNIMPLEMENTED:
            return ListingUnsupported(f"provider {self.name} does not implement {rpc} "
                                      "(plugin protocol 5.10/6.10, Terraform 1.14): it cannot list objects")
        return self._call_error(rpc, exc, self._rpc_timeout)

    def async_reads(self) -> AsyncReads:
        return AsyncReads(self)

    def _read_request(self, type_name: str, current_state: bytes, private: bytes, provider_meta: bytes | None,
                      current_identity: bytes | None) -> bytes:
        type_field = self._type_fields.get(type_name)
        if type_field is None:
            type_field = self._type_fields.setdefault(type_name, string_field(1, type_name))
        return read_resource_request(type_field, current_state, private, self._caps_field, provider_meta, current_identity)

    def _read_result(self, type_name: str, data: bytes) -> ReadResult:
        resp = self._parse("ReadResource", self._d.pb.ReadResource.Response, data)
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
        stop = getattr(self._d.pb, self._d.stop)
        resp = self._call(self._d.stop, stop.Request(), stop.Response, timeout=10.0)
        if resp.Error:
            raise ProviderCallError(f"provider {self.name}: {self._d.stop} failed: {resp.Error}")

    def close(self) -> None:
        self._conn.close()

    def kill(self) -> None:
        self._conn.process.kill()


def _msgpack_int(n: int) -> bytes:
    """A non-negative whole number as cty msgpack encodes a number (the smallest form)."""
    if n < 0x80:
        return bytes((n,))
    return b"\xcf" + n.to_bytes(8, "big")


class AsyncReads:
    """ReadResource for a refresh that keeps many reads in flight from one event loop: over the
    connection's native HTTP/2 client (h2channel.H2Calls, sharing its connection), or through
    grpc.aio where grpcio is the transport (a second channel, grpcio_channel.AioCalls). Per call,
    grpc.aio costs about two thirds of the CPU of grpcio's blocking API, whose reader threads also
    contend for the GIL with each other and with grpc's own threads; the native client less again.

    Opened inside the loop that will use it and closed there; the request bytes and the
    conversion of the answer are the blocking client's, so the two paths cannot differ in what
    they send or how they read what comes back.
    """

    def __init__(self, client: GrpcProviderClient) -> None:
        self._client = client
        channel = client.connection.channel
        self._calls: H2Calls | AioCalls
        if isinstance(channel, NativeChannel):
            self._calls = H2Calls(channel)
        else:
            from kilolock.provider.grpcio_channel import AioCalls, GrpcioChannel

            assert isinstance(channel, GrpcioChannel)
            self._calls = AioCalls(channel)
        self.transport = channel.transport

    async def read_resource(self, type_name: str, current_state: bytes, private: bytes = b"", *,
                            provider_meta: bytes | None = None, current_identity: bytes | None = None,
                            timeout: float | None = None) -> ReadResult:
        c = self._client
        req = c._read_request(type_name, current_state, private, provider_meta, current_identity)
        timeout = c._rpc_timeout if timeout is None else timeout
        try:
            data = await self._calls.call(c._read_path, req, timeout)
        except RpcError as exc:
            # The error's wording waits briefly for a crashed plugin's exit status: off the loop.
            raise await asyncio.to_thread(c._call_error, "ReadResource", exc, timeout) from None
        return c._read_result(type_name, data)

    async def aclose(self) -> None:
        await self._calls.aclose()
