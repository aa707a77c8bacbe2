"""ProductionFactory (ADR 0006 layer 2): discover → launch → schema (cached) → configure → wrap.

One factory lives for one run. Schemas are cached in provider_schemas across runs and in the
factory within a run (two groups of one provider share a fetch); nothing is cached process-wide.
The run's secrets come with every ``open``: resolved env references and sensitive config values
are added to them, and the launched provider masks them in what it logs.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import TYPE_CHECKING, Any

import psycopg

from kilolock import codec, redact
from kilolock.errors import KlError
from kilolock.provider import launch_provider
from kilolock.provider.discovery import find_provider
from kilolock.redact import Redactor
from kilolock.refresh.client import OpenedProvider
from kilolock.refresh.encoding import EncodingClient
from kilolock.schema import ProviderSchema
from kilolock.sensitive import sensitive_paths, values_at
from kilolock.store import provider_configs, provider_schemas

if TYPE_CHECKING:
    from kilolock.provider import ProviderClient
    from kilolock.refresh.prelaunch import Prelaunched

log = logging.getLogger("kilolock.refresh.factory")


class ProviderConfigError(KlError):
    pass


def resolve_env_refs(value: Any, secrets: Redactor, where: str = "config") -> Any:
    """Replace every {"env": "NAME"} with the variable's value; the stored config keeps the reference."""
    return redact.resolve_env_refs(value, secrets, where, ProviderConfigError)


class ProductionFactory:
    def __init__(self, conn: psycopg.Connection, state_id: str | None, search_paths: tuple[str, ...] = (),
                 rpc_timeout: float | None = None, workdir: str | None = None, early: Prelaunched | None = None) -> None:
        self._conn = conn
        self._early = early  # providers started before the state was read (kilolock.refresh.prelaunch)
        self.used: list[tuple[str, str | None]] = []  # (binary, working directory) of each provider opened
        self._workdir = workdir  # providers run here, and ./.terraform/providers is looked for here
        self._state_id = state_id
        self._search_paths = search_paths
        self._rpc_timeout = rpc_timeout
        self._schemas: dict[tuple[str, str], tuple[ProviderSchema, bool]] = {}
        self._lock = threading.Lock()
        self.get_schema_calls = 0
        self.unavailable: ImportError | None = None  # why no provider can be started in this process at all

    def open(self, source: str, alias: str, secrets: Redactor) -> EncodingClient:
        stored = provider_configs.lookup(self._conn, self._state_id, source, alias)
        found = find_provider(source, stored.pinned_version if stored else None, self._search_paths, cwd=self._workdir)
        version = found.version or "unversioned"
        log.info("provider %s: using %s", source, found.describe())
        try:
            raw = self._early_client(found.binary) or launch_provider(found.binary, rpc_timeout=self._rpc_timeout,
                                                                      secrets=secrets, cwd=self._workdir)
        except ImportError as exc:
            # The protocol stubs (and grpc, where it is the transport) load with the first plugin
            # (kilolock.provider.launch): one that cannot load (a kl.pyz built for another system) is
            # kl's own failure, not this provider's; the caller reports it.
            self.unavailable = exc
            raise
        try:
            schema, cached = self._schema(source, found.version, raw)
            config = resolve_env_refs(stored.config if stored else {}, secrets,
                                      f"provider {source}" + (f".{alias}" if alias else "") + " config")
            self._configure(raw, schema, config, source, secrets)
            info = OpenedProvider(source, alias, version, found.binary, raw.protocol_version, cached, raw.transport)
            with self._lock:
                self.used.append((found.binary, self._workdir))
            return EncodingClient(raw, schema, info)
        except BaseException:
            raw.close()
            raise

    def _early_client(self, binary: str) -> ProviderClient | None:
        """The early start of BINARY in this run's working directory, once connected; None when
        there is none or it failed (the caller then launches it itself, and reports a failure)."""
        early = self._early.take(binary, self._workdir) if self._early is not None else None
        if early is None:
            return None
        try:
            client = early.client(self._rpc_timeout)
        except KlError as exc:
            log.info("provider %s: the early start failed (%s); starting it again", binary, exc)
            return None
        log.info("provider %s: started early, while the state was read", binary)
        return client

    def _schema(self, source: str, version: str | None, raw: ProviderClient) -> tuple[ProviderSchema, bool]:
        key = (source, version or "")
        with self._lock:
            if version and key in self._schemas:
                return self._schemas[key][0], True
            cached = provider_schemas.get(self._conn, source, version) if version else None
            # A schema cached before kl asked for identity schemas is fetched again, once.
            if cached is not None and cached.identity_schemas is not None:
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
