"""The factory's one open path (kilolock.refresh.factory) and its sources of processes
(kilolock.refresh.sources, and the warm pool's in kilolock.fleet.warm), with fake processes and a
fake store: which source serves an open, what is fetched and configured, who learns the config's
secrets, and what is closed on a failure. The real providers are in test_prelaunch_real.py,
tests/fleet/test_fleet_warm.py and the end-to-end refresh tests."""
from __future__ import annotations

import json
from typing import Any

import pytest

from kilolock import schema as sch
from kilolock.errors import KlError
from kilolock.fleet.warm import WarmProviders, _WarmClient
from kilolock.provider.discovery import FoundProvider, ProviderAddress
from kilolock.redact import MASK, Redactor
from kilolock.refresh import factory as factory_mod
from kilolock.refresh import sources
from kilolock.refresh.encoding import EncodingClient
from kilolock.refresh.factory import ProviderFactory
from kilolock.refresh.sources import Launch, NewProcess, Prelaunch, ProviderConfigError, Wanted
from kilolock.store import provider_configs, provider_schemas

SOURCE = "registry.terraform.io/x/fake"
BINARY = "/plugins/terraform-provider-fake_v1.0.0"
PROVIDER_BLOCK = sch.Block(attributes=(sch.Attribute("region", b'"string"', optional=True),
                                       sch.Attribute("token", b'"string"', optional=True, sensitive=True)))
THING = sch.Block(attributes=(sch.Attribute("id", b'"string"', computed=True),))
SCHEMA = sch.ProviderSchema(5, sch.Schema(0, PROVIDER_BLOCK), {"thing": sch.Schema(0, THING)}, identity_schemas={})


class FakeProcess:
    """A provider process as the factory sees it: what it was asked, and whether it was closed."""

    name = "fake"
    protocol_version = 5
    transport = "native"

    def __init__(self, fail_configure: BaseException | None = None) -> None:
        self.schema_calls = 0
        self.configured: list[bytes] = []
        self.closed = False
        self.fail_configure = fail_configure

    def get_schema(self) -> sch.ProviderSchema:
        self.schema_calls += 1
        return SCHEMA

    def get_identity_schemas(self) -> dict[str, sch.Schema]:
        return {}

    def validate_config(self, wire: bytes) -> None:
        pass

    def configure(self, wire: bytes) -> None:
        if self.fail_configure is not None:
            raise self.fail_configure
        self.configured.append(wire)

    def close(self) -> None:
        self.closed = True


class FakeSource:
    """A source handing out new fake processes, recording what it was asked for."""

    def __init__(self, fail: BaseException | None = None, **process: Any) -> None:
        self.wanted: list[Wanted] = []
        self.processes: list[FakeProcess] = []
        self._fail, self._process = fail, process

    def lease(self, want: Wanted) -> NewProcess:
        self.wanted.append(want)
        if self._fail is not None:
            raise self._fail
        self.processes.append(FakeProcess(**self._process))
        return NewProcess(self.processes[-1])  # type: ignore[arg-type]


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The factory's store and discovery, faked: one stored config, a schema cache, one binary."""
    held: dict[str, Any] = {"config": {"region": "eu", "token": "stored-token-value"}, "schemas": {}}

    def lookup(conn: Any, state_id: Any, source: str, alias: str) -> provider_configs.ProviderConfig:
        return provider_configs.ProviderConfig(source, alias, held["config"], None, False)

    monkeypatch.setattr(provider_configs, "lookup", lookup)
    monkeypatch.setattr(provider_schemas, "get", lambda conn, source, version: held["schemas"].get((source, version)))
    monkeypatch.setattr(provider_schemas, "put", lambda conn, source, version, ps: held["schemas"].__setitem__((source, version), ps))
    found = FoundProvider(ProviderAddress("registry.terraform.io", "x", "fake"), "1.0.0", BINARY, "/plugins")
    monkeypatch.setattr(factory_mod, "find_provider", lambda *a, **kw: found)
    return held


def make(source: Any, workdir: str | None = "/work/dir") -> ProviderFactory:
    return ProviderFactory(None, "state-id", (), rpc_timeout=30.0, workdir=workdir, source=source)  # type: ignore[arg-type]


def config_sent(process: FakeProcess) -> dict[str, Any]:
    sent: dict[str, Any] = json.loads(factory_mod.codec.compile_block(PROVIDER_BLOCK).decode(process.configured[-1]))
    return sent


def test_a_new_process_is_given_its_schema_and_config_and_wrapped_in_the_codecs_client(store):
    source = FakeSource()
    factory = make(source)
    secrets = Redactor()
    client = factory.open(SOURCE, "", secrets)
    process = source.processes[0]
    assert isinstance(client, EncodingClient)
    assert (process.schema_calls, config_sent(process)) == (1, {"region": "eu", "token": "stored-token-value"})
    assert client.info.schema_from_cache is False and client.info.binary == BINARY and client.info.version == "1.0.0"
    assert factory.used == [(BINARY, "/work/dir")] and factory.get_schema_calls == 1
    assert secrets.redact("stored-token-value") == MASK  # sensitive in the schema: a secret of the run
    want = source.wanted[0]
    assert (want.source, want.found.binary, want.workdir, want.rpc_timeout, want.secrets) == (SOURCE, BINARY, "/work/dir", 30.0, secrets)

    again = factory.open(SOURCE, "other", Redactor())  # a second group of the provider: the run's schema
    assert again.info.schema_from_cache is True and source.processes[1].schema_calls == 0


def test_a_schema_cached_without_list_schemas_serves_a_refresh_and_is_fetched_again_for_a_discovery(store):
    import dataclasses

    store["schemas"][(SOURCE, "1.0.0")] = SCHEMA  # cached by a kl that did not read list schemas
    refresh = FakeSource()
    assert make(refresh).open(SOURCE, "", Redactor()).info.schema_from_cache is True
    discovery = FakeSource()
    factory = ProviderFactory(None, "state-id", (), source=discovery, list_schemas=True)  # type: ignore[arg-type]
    assert factory.open(SOURCE, "", Redactor()).info.schema_from_cache is False
    assert discovery.processes[0].schema_calls == 1
    # What a fetch by this kl caches (list schemas known, none here) serves the next discovery.
    store["schemas"][(SOURCE, "1.0.0")] = dataclasses.replace(SCHEMA, list_resource_schemas={})
    again = ProviderFactory(None, "state-id", (), source=FakeSource(), list_schemas=True)  # type: ignore[arg-type]
    assert again.open(SOURCE, "", Redactor()).info.schema_from_cache is True


def test_a_configured_process_is_neither_fetched_nor_configured_again(store):
    process = FakeProcess()

    class Configured:
        def lease(self, want: Wanted) -> NewProcess:
            return NewProcess(process, schema=SCHEMA)  # type: ignore[arg-type]

    secrets = Redactor()
    client = make(Configured()).open(SOURCE, "", secrets)
    assert (process.schema_calls, process.configured) == (0, [])
    assert client.info.schema_from_cache is True
    assert secrets.redact("stored-token-value") == MASK  # the run still learns what the config holds


def test_a_failure_after_the_process_started_closes_it(store):
    source = FakeSource(fail_configure=KlError("provider fake: Configure: bad region"))
    factory = make(source)
    with pytest.raises(KlError, match="bad region"):
        factory.open(SOURCE, "", Redactor())
    assert source.processes[0].closed and factory.used == []


def test_a_protocol_stack_that_cannot_load_is_kept_for_the_caller(store):
    factory = make(FakeSource(fail=ImportError("no grpc here")))
    with pytest.raises(ImportError):
        factory.open(SOURCE, "", Redactor())
    assert isinstance(factory.unavailable, ImportError)


def test_a_launch_that_fails_is_reported_before_a_config_that_does_not_resolve(store):
    # A new process needs its config only once it is configured: the launch's failure is the one told.
    store["config"] = {"token": {"env": "KL_TEST_UNSET_TOKEN"}}
    with pytest.raises(KlError, match="plugin exited"):
        make(FakeSource(fail=KlError("provider fake: the plugin exited"))).open(SOURCE, "", Redactor())
    source = FakeSource()
    with pytest.raises(ProviderConfigError, match="KL_TEST_UNSET_TOKEN is not set"):
        make(source).open(SOURCE, "", Redactor())
    assert source.processes[0].closed


def test_launch_starts_the_binary_in_the_runs_directory(store, monkeypatch):
    launched: list[tuple[str, dict[str, Any]]] = []

    def launch(binary: str, **kw: Any) -> FakeProcess:
        launched.append((binary, kw))
        return FakeProcess()

    monkeypatch.setattr(sources, "launch_provider", launch)
    secrets = Redactor()
    make(Launch()).open(SOURCE, "", secrets)
    assert launched == [(BINARY, {"rpc_timeout": 30.0, "secrets": secrets, "cwd": "/work/dir"})]


class FakeEarly:
    """A process started early: its client, or the failure connecting it raised."""

    def __init__(self, binary: str, cwd: str, fail: BaseException | None = None) -> None:
        self.binary, self.cwd, self.fail = binary, cwd, fail
        self.process = FakeProcess()

    def client(self, rpc_timeout: float | None = None) -> FakeProcess:
        if self.fail is not None:
            raise self.fail
        return self.process


class FakePrelaunched:
    def __init__(self, *early: FakeEarly) -> None:
        self.waiting = list(early)

    def take(self, binary: str, cwd: str | None) -> FakeEarly | None:
        for e in self.waiting:
            if (e.binary, e.cwd) == (binary, cwd):
                self.waiting.remove(e)
                return e
        return None


@pytest.mark.parametrize("early, taken", [
    (FakeEarly(BINARY, "/work/dir"), True),
    (FakeEarly(BINARY, "/elsewhere"), False),  # another directory: relative paths would resolve elsewhere
    (FakeEarly("/plugins/terraform-provider-other", "/work/dir"), False),
    (FakeEarly(BINARY, "/work/dir", fail=KlError("handshake timed out")), False),  # started again
])
def test_prelaunch_takes_the_early_start_of_the_very_binary_and_directory_else_launches(store, monkeypatch, early, taken):
    launched: list[FakeProcess] = []

    def launch(binary: str, **kw: Any) -> FakeProcess:
        launched.append(FakeProcess())
        return launched[-1]

    monkeypatch.setattr(sources, "launch_provider", launch)
    prelaunched = FakePrelaunched(early)
    client = make(Prelaunch(prelaunched)).open(SOURCE, "", Redactor())  # type: ignore[arg-type]
    assert isinstance(client, EncodingClient)
    assert (early.process.configured != [], len(launched)) == ((True, 0) if taken else (False, 1))
    assert (early not in prelaunched.waiting) is (early.binary == BINARY and early.cwd == "/work/dir")


def test_prelaunch_passes_on_an_early_start_that_cannot_load_the_protocol(store, monkeypatch):
    monkeypatch.setattr(sources, "launch_provider", lambda binary, **kw: pytest.fail("launched again"))
    factory = make(Prelaunch(FakePrelaunched(FakeEarly(BINARY, "/work/dir", fail=ImportError("no stubs")))))  # type: ignore[arg-type]
    with pytest.raises(ImportError):
        factory.open(SOURCE, "", Redactor())
    assert factory.unavailable is not None


def test_the_warm_source_launches_once_and_hands_the_configured_process_to_the_next_run(store, monkeypatch):
    launched: list[tuple[FakeProcess, Redactor]] = []

    def launch(binary: str, **kw: Any) -> FakeProcess:
        launched.append((FakeProcess(), kw["secrets"]))
        return launched[-1][0]

    monkeypatch.setattr(sources, "launch_provider", launch)
    monkeypatch.setenv("KL_TEST_REGION", "env-region-value")
    store["config"] = {"region": {"env": "KL_TEST_REGION"}, "token": "stored-token-value"}
    pool = WarmProviders()
    first_run = Redactor()
    client = pool.factory(None, "state-id", workdir="/work/dir").open(SOURCE, "", first_run)  # type: ignore[arg-type]
    assert isinstance(client, _WarmClient) and pool.launched == 1
    process, own = launched[0]
    assert len(process.configured) == 1 and client.info.schema_from_cache is False
    # The process's own redactor masks its config (an env value, a sensitive one) while idle too.
    assert own.redact("env-region-value stored-token-value") == f"{MASK} {MASK}"
    client.close()
    assert pool.idle() == 1 and not process.closed

    second_run = Redactor()
    again = pool.factory(None, "state-id", workdir="/work/dir").open(SOURCE, "", second_run)  # type: ignore[arg-type]
    assert len(launched) == 1 and pool.reused == 1 and len(process.configured) == 1  # not configured again
    assert again.info.schema_from_cache is True
    assert second_run.redact("env-region-value stored-token-value") == f"{MASK} {MASK}"
    again.close()

    # Another config is another process; so is another directory.
    store["config"] = {"region": "us"}
    pool.factory(None, "state-id", workdir="/work/dir").open(SOURCE, "", Redactor()).close()  # type: ignore[arg-type]
    pool.factory(None, "state-id", workdir="/other").open(SOURCE, "", Redactor()).close()  # type: ignore[arg-type]
    assert len(launched) == 3 and pool.launched == 3
    pool.close()
    assert all(p.closed for p, _ in launched)


def test_the_warm_source_needs_the_config_before_it_picks_a_process(store, monkeypatch):
    monkeypatch.setattr(sources, "launch_provider", lambda binary, **kw: pytest.fail("launched"))
    store["config"] = {"token": {"env": "KL_TEST_UNSET_TOKEN"}}
    with pytest.raises(ProviderConfigError, match="KL_TEST_UNSET_TOKEN is not set"):
        WarmProviders().factory(None, "state-id").open(SOURCE, "", Redactor())  # type: ignore[arg-type]
