"""What the orchestrator holds: a provider client that speaks JSON, and the factory that opens one.

The production implementations are EncodingClient (kilolock.refresh.encoding) over the gRPC
clients, opened by ProviderFactory (kilolock.refresh.factory) from a source of processes
(kilolock.refresh.sources). Tests replace them with plain JSON fakes; nothing here knows about
msgpack or processes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kilolock.errors import KlError
from kilolock.redact import Redactor
from kilolock.schema import AttributePath, Schema


class ResourceError(KlError):
    """A per-resource failure: recorded against the address, the run goes on (unless fail-fast)."""


class ThrottledError(ResourceError):
    """The provider's API throttled the call (its diagnostics say so): retried after a pause,
    a failure only once the instance's --rpc-timeout is used up."""


@dataclass(slots=True)  # not frozen: one per instance read, and a frozen __init__ costs 3x
class ReadOutcome:
    """One instance's read, in JSON: what the orchestrator splices into the state."""

    new_state: bytes | None  # canonical JSON of the object now; None: the object is gone
    private: bytes = b""
    sensitive_paths: tuple[AttributePath, ...] = ()  # sent by the provider (ReadResource field 6)
    identity: bytes | None = None  # canonical JSON, when the provider returns one


@dataclass(frozen=True)
class ListedObject:
    """One object a provider listed (ListResource), in JSON."""

    identity: bytes  # canonical JSON under the type's identity schema
    display_name: str


class ListingError(KlError):
    """A listing cannot be made: the provider lists no such type, or its list config is wrong."""


@dataclass(frozen=True)
class OpenedProvider:
    """A provider a run opened: which one, which binary, which protocol, whether its schema was cached."""

    source: str
    alias: str
    version: str
    binary: str
    protocol_version: int
    schema_from_cache: bool
    transport: str  # which client carries its calls: "native" (the extension's HTTP/2 client) or "grpcio"


class AsyncReader(Protocol):
    """ResourceClient.read_resource from an asyncio event loop: opened in the loop that uses it,
    closed there (aclose)."""

    # Which client carries the calls: "native" (the extension's HTTP/2 client) or "grpcio".
    transport: str

    async def read_resource(self, type_name: str, prior: bytes, private: bytes, identity: bytes | None) -> ReadOutcome: ...

    async def aclose(self) -> None: ...


class ResourceClient(Protocol):
    info: OpenedProvider

    def resource_schema(self, type_name: str) -> Schema:
        """The live schema of a managed resource type; ResourceError when the provider lacks it."""

    def canonicalize(self, type_name: str, attributes: bytes) -> bytes | None:
        """Canonical JSON of attributes under the live schema; None when they do not fit it."""

    def upgrade_resource_state(self, type_name: str, version: int, raw_attributes: bytes) -> bytes:
        """UpgradeResourceState with the stored JSON; returns canonical JSON."""

    def upgrade_flatmap(self, type_name: str, version: int, flatmap: dict[str, str]) -> bytes:
        """UpgradeResourceState with legacy flatmap attributes (RawState.flatmap); returns canonical JSON."""

    def identity_schema_version(self, type_name: str) -> int | None:
        """The provider's identity schema version for the type; None when it has no identity schema."""

    def upgrade_resource_identity(self, type_name: str, version: int, raw_identity: bytes) -> bytes:
        """UpgradeResourceIdentity with the stored identity JSON; returns canonical JSON."""

    def read_resource(self, type_name: str, prior: bytes, private: bytes, identity: bytes | None) -> ReadOutcome:
        """ReadResource with canonical prior JSON (and identity JSON, under the current identity version)."""

    def sensitive_paths(self, type_name: str, value: bytes) -> list[AttributePath]:
        """Paths of schema-sensitive attributes present in value (canonical JSON)."""

    def async_reader(self) -> AsyncReader | None:
        """An AsyncReader for the running event loop; None when this client reads only from threads."""

    def stop(self) -> None:
        """StopProvider: interrupt in-flight calls (cancellation only)."""

    def shut_down(self, *, at_once: bool = False) -> None:
        """End the provider process while calls may be in flight, which then fail: go-plugin's
        Shutdown, then SIGKILL; ``at_once``: SIGKILL alone. For the calls StopProvider did not end."""

    def close(self) -> None:
        """Shut the provider process down."""


class ClientFactory(Protocol):
    def open(self, source: str, alias: str, secrets: Redactor) -> ResourceClient:
        """Discover, launch, fetch (or reuse) the schema, configure; raise KlError on failure.
        ``secrets`` is the run's redactor: the provider masks it in what it logs, and the factory
        adds the secrets it learns on the way (resolved env references, sensitive config)."""
