"""The refresh seam's fakes (ResourceClient, ClientFactory): a provider that answers ReadResource
from a dict, records every call, and can be made slow, failing or deaf to StopProvider. For the
orchestrator's and the refresh service's tests against a real database; the real providers are
exercised end to end elsewhere."""
from __future__ import annotations

import json
import threading
import time

from kilolock import schema as sch
from kilolock.redact import Redactor
from kilolock.refresh.client import OpenedProvider, ReadOutcome, ResourceError

NULL = "registry.terraform.io/hashicorp/null"


def canon(v) -> bytes:
    return json.dumps(v, sort_keys=True, separators=(",", ":")).encode()


class FakeClient:
    """Answers ReadResource from `world` (id -> attributes, None = gone, Exception = fail)."""

    def __init__(self, factory: FakeFactory, source: str, alias: str) -> None:
        self.f = factory
        self.info = OpenedProvider(source, alias, "2.1.2", "/fake/terraform-provider-null", 5, False, "grpcio")
        self.closed = False

    def resource_schema(self, type_name):
        if type_name not in self.f.schema_versions:
            raise ResourceError(f"provider has no resource type {type_name}")
        block = sch.Block(attributes=(sch.Attribute("id", b'"string"', computed=True),
                                      sch.Attribute("secret", b'"string"', optional=True, sensitive=True),
                                      sch.Attribute("triggers", b'["map","string"]', optional=True)))
        return sch.Schema(self.f.schema_versions[type_name], block)

    def canonicalize(self, type_name, attributes):
        value = json.loads(attributes)
        return None if "legacy_field" in value else canon(value)

    def upgrade_resource_state(self, type_name, version, raw):
        self.f.calls.append(("upgrade", json.loads(raw).get("id")))
        value = json.loads(raw)
        if value.get("id") in self.f.fail_upgrade:
            raise ResourceError("upgrade failed: provider said no")
        value.pop("legacy_field", None)
        return canon(value)

    def upgrade_flatmap(self, type_name, version, flatmap):
        self.f.calls.append(("upgrade_flatmap", flatmap.get("id")))
        if flatmap.get("id") in self.f.fail_upgrade:
            raise ResourceError(f"cannot upgrade {flatmap}")
        triggers = {k.removeprefix("triggers."): v for k, v in flatmap.items() if k.startswith("triggers.") and k != "triggers.%"}
        return canon({"id": flatmap.get("id"), "secret": flatmap.get("secret"), "triggers": triggers or None})

    def identity_schema_version(self, type_name):
        return None  # identity is tested against the real test provider (test_testprovider.py)

    def upgrade_resource_identity(self, type_name, version, raw_identity):
        raise AssertionError("no identity schema, no identity upgrade")

    def read_resource(self, type_name, prior, private, identity):
        value = json.loads(prior)
        ident = value.get("id")
        with self.f.lock:
            self.f.calls.append(("read", ident))
            self.f.in_flight += 1
            self.f.max_in_flight = max(self.f.max_in_flight, self.f.in_flight)
        try:
            if isinstance(self.f.world.get(ident), Exception):
                raise self.f.world[ident]  # failures answer at once; only good reads are slow
            if self.f.delay:
                # A read deaf to Stop (one blocked where Stop cannot reach it) ends only when its
                # provider is shut down.
                ended = self.f.shut if self.f.deaf_to_stop else self.f.stopped
                deadline = time.monotonic() + self.f.delay
                while time.monotonic() < deadline and not ended.is_set():
                    time.sleep(0.005)
                if ended.is_set():
                    raise ResourceError("provider stopped")
            if self.f.on_read:
                self.f.on_read(ident)
            new = self.f.world.get(ident, value)
            if isinstance(new, Exception):
                raise new
            return ReadOutcome(new_state=None if new is None else canon(new), private=b"p:" + ident.encode())
        finally:
            with self.f.lock:
                self.f.in_flight -= 1

    def sensitive_paths(self, type_name, value):
        return [(sch.GetAttr("secret"),)] if "secret" in json.loads(value) else []

    def async_reader(self):
        return None  # reads from threads; the async path is exercised against real providers

    def stop(self):
        self.f.stop_calls += 1
        self.f.stopped.set()

    def shut_down(self, *, at_once=False):
        self.f.shut_downs.append(at_once)
        self.f.shut.set()

    def close(self):
        self.closed = True
        self.f.closed += 1


class FakeFactory:
    def __init__(self, world=None, schema_versions=None):
        self.world = world or {}
        self.schema_versions = schema_versions or {"null_resource": 0}
        self.calls: list = []
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.delay = 0.0
        self.on_read = None
        self.fail_upgrade: set[str] = set()
        self.stop_calls = 0
        self.closed = 0
        self.opened: list[tuple[str, str]] = []
        self.stopped = threading.Event()
        self.deaf_to_stop = False
        self.shut = threading.Event()
        self.shut_downs: list[bool] = []  # at_once, per shut_down
        self.fail_open: Exception | None = None
        self.secrets: list[Redactor] = []

    def open(self, source, alias, secrets):
        self.secrets.append(secrets)
        if self.fail_open:
            raise self.fail_open
        self.opened.append((source, alias))
        return FakeClient(self, source, alias)

    def reads(self):
        return [c for c in self.calls if c[0] == "read"]
