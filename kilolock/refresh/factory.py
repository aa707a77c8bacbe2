"""ProviderFactory: discover → a process from the factory's source → schema (cached) → configure → wrap.

One factory lives for one run. Schemas are cached in provider_schemas across runs and in the
factory within a run (two groups of one provider share a fetch); nothing is cached process-wide.
The run's secrets come with every ``open``: resolved env references and sensitive config values
are added to them, and the provider masks them in what it logs. Where the process comes from
(launched, started early, kept warm) is the source's business (kilolock.refresh.sources); the rest
of an open is written here once.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from typing import TYPE_CHECKING, Any

import psycopg

from kilolock import codec
from kilolock.provider.discovery import find_provider
from kilolock.redact import Redactor
from kilolock.refresh.client import OpenedProvider, ResourceClient
from kilolock.refresh.encoding import EncodingClient
from kilolock.refresh.sources import Launch, ProcessSource, ProviderConfigError, Wanted
from kilolock.schema import ProviderSchema
from kilolock.sensitive import sensitive_paths, values_at
from kilolock.store import provider_configs, provider_schemas

if TYPE_CHECKING:
    from kilolock.provider import ProviderClient


class ProviderFactory:
    def __init__(self, conn: psycopg.Connection, state_id: str | None, search_paths: tuple[str, ...] = (),
                 rpc_timeout: float | None = None, workdir: str | None = None, source: ProcessSource | None = None,
                 *, list_schemas: bool = False) -> None:
        self._conn = conn
        # A discovery needs the list resource schemas, which a schema cached by an older kl lacks.
        self._list_schemas = list_schemas
        self._source: ProcessSource = source if source is not None else Launch()
        self.used: list[tuple[str, str | None]] = []  # (binary, working directory) of each provider opened
        self._workdir = workdir  # providers run here, and ./.terraform/providers is looked for here
        self._state_id = state_id
        self._search_paths = search_paths
        self._rpc_timeout = rpc_timeout
        self._schemas: dict[tuple[str, str], tuple[ProviderSchema, bool]] = {}
        self._lock = threading.Lock()
        self.get_schema_calls = 0
        self.unavailable: ImportError | None = None  # why no provider can be started in this process at all

    def open(self, source: str, alias: str, secrets: Redactor) -> ResourceClient:
        stored = provider_configs.lookup(self._conn, self._state_id, source, alias)
        found = find_provider(source, stored.pinned_version if stored else None, self._search_paths, cwd=self._workdir)
        want = Wanted(source, alias, found, stored.config if stored else {}, secrets, self._workdir, self._rpc_timeout)
        try:
            lease = self._source.lease(want)
        except ImportError as exc:
            # The protocol stubs (and grpc, where it is the transport) load with the first plugin
            # (kilolock.provider.launch): one that cannot load (a kl.pyz built for another system) is
            # kl's own failure, not this provider's; the caller reports it.
            self.unavailable = exc
            raise
        raw = lease.raw
        try:
            if lease.schema is not None:
                schema, cached = lease.schema, True
                learn_config_secrets(schema, want.config(), secrets)
            else:
                schema, cached = self._schema(source, found.version, raw)
                config = want.config()
                for keeper in lease.keepers:
                    learn_config_secrets(schema, config, keeper)
                self._configure(raw, schema, config, source, secrets)
            info = OpenedProvider(source, alias, found.version or "unversioned", found.binary, raw.protocol_version,
                                  cached, raw.transport)
            client = lease.wrap(EncodingClient(raw, schema, info), schema)
        except BaseException:
            raw.close()
            raise
        with self._lock:
            self.used.append((found.binary, self._workdir))
        return client

    def _schema(self, source: str, version: str | None, raw: ProviderClient) -> tuple[ProviderSchema, bool]:
        key = (source, version or "")
        with self._lock:
            if version and key in self._schemas:
                return self._schemas[key][0], True
            cached = provider_schemas.get(self._conn, source, version) if version else None
            # A schema cached before kl asked for identity schemas is fetched again, once (and one
            # cached before kl read list resource schemas, once a discovery needs them).
            if cached is not None and cached.identity_schemas is not None and (
                    not self._list_schemas or cached.list_resource_schemas is not None):
                self._schemas[key] = (cached, True)
                return cached, True
            schema = dataclasses.replace(raw.get_schema(), identity_schemas=raw.get_identity_schemas())
            self.get_schema_calls += 1
            if version:  # an unversioned binary could be anything tomorrow: never cache it
                provider_schemas.put(self._conn, source, version, schema)
                self._schemas[key] = (schema, False)
            return schema, False

    def _configure(self, raw: ProviderClient, schema: ProviderSchema, config: dict[str, Any], source: str,
                   secrets: Redactor) -> None:
        try:
            wire = codec.compile_block(schema.provider.block).encode(json.dumps(config).encode())
        except codec.CodecError as exc:
            raise ProviderConfigError(f"provider {source} config does not fit its schema: {exc}") from None
        # Before the provider sees them, so its log lines and diagnostics about them come out masked.
        learn_config_secrets(schema, config, secrets)
        raw.validate_config(wire)
        raw.configure(wire)


def learn_config_secrets(schema: ProviderSchema, config: dict[str, Any], secrets: Redactor) -> None:
    """The values the provider's schema marks sensitive in CONFIG are secrets of the run."""
    for value in values_at(config, sensitive_paths(schema.provider.block, config)):
        secrets.add_value(value)
