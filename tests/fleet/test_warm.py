"""WarmProviders (kilolock.fleet.warm) as pure logic: what makes a process unfit for reuse, the cap
and the idle timeout, and per-run redaction. The real processes are in tests/fleet/test_fleet_warm.py."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kilolock import schema as sch
from kilolock.fleet.warm import RunRedactor, WarmProviders, _Process, _WarmClient
from kilolock.provider.client import ReadResult
from kilolock.provider.diagnostics import Diagnostic, Severity
from kilolock.provider.errors import ProviderCallError, ProviderDiagnosticsError
from kilolock.redact import MASK, Redactor
from kilolock.refresh.client import OpenedProvider, ResourceError, ThrottledError
from kilolock.refresh.encoding import EncodingClient

BLOCK = sch.Block(attributes=(sch.Attribute("id", b'"string"', computed=True),))
SCHEMA = sch.ProviderSchema(5, sch.Schema(0, sch.Block()), {"thing": sch.Schema(0, BLOCK)})
INFO = OpenedProvider("registry.terraform.io/x/stub", "", "1.0.0", "/bin/stub", 5, False, "native")


class StubProvider:
    """A raw client whose next read answers with the prior or raises ``fail``."""

    name = "stub"
    protocol_version = 5

    def __init__(self) -> None:
        self.fail: BaseException | None = None
        self.garbage = False
        self.closed = False
        self.stopped = False
        self.killed = False

    def read_resource(self, type_name: str, current_state: bytes, private: bytes = b"", **_: Any) -> ReadResult:
        if self.fail is not None:
            raise self.fail
        return ReadResult(b"\xc1 not msgpack" if self.garbage else current_state, private, (), None, ())

    def async_reads(self) -> StubAsyncReads:
        return StubAsyncReads(self)

    def stop(self) -> None:
        self.stopped = True

    def close(self) -> None:
        self.closed = True

    def kill(self) -> None:
        self.killed = True


class StubAsyncReads:
    """The stub's reads for the event loop: the same answers, awaited."""

    transport = "stub"

    def __init__(self, raw: StubProvider) -> None:
        self._raw = raw

    async def read_resource(self, type_name: str, current_state: bytes, private: bytes = b"", **kw: Any) -> ReadResult:
        return self._raw.read_resource(type_name, current_state, private, **kw)

    async def aclose(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def open_one(pool: WarmProviders, key: tuple[str, ...] = ("k",)) -> tuple[_WarmClient, StubProvider, _Process]:
    found = pool.checkout(key)
    if found is None:
        raw = StubProvider()
        found = _Process(key, raw, SCHEMA, "1.0.0", "/bin/stub", RunRedactor())  # type: ignore[arg-type]
    client = EncodingClient(found.raw, found.schema, INFO)
    return _WarmClient(client, found, pool), found.raw, found  # type: ignore[return-value]


def read(client: _WarmClient, path: str = "threads") -> None:
    prior = client.canonicalize("thing", b'{"id":"x"}')
    assert prior is not None
    if path == "threads":
        client.read_resource("thing", prior, b"", None)
        return

    async def through_the_loop() -> None:
        reader = client.async_reader()
        assert reader is not None
        try:
            await reader.read_resource("thing", prior, b"", None)
        finally:
            await reader.aclose()

    asyncio.run(through_the_loop())


@pytest.mark.parametrize("fail, reused", [
    (ProviderDiagnosticsError("provider stub: ReadResource thing: Invalid thing", ()), True),
    (ProviderDiagnosticsError("provider stub: ReadResource thing: reading thing", (
        Diagnostic(Severity.ERROR, "reading thing", "api error Throttling: Rate exceeded"),)), True),
    (ProviderCallError("provider stub: ReadResource: DEADLINE_EXCEEDED after 600s (the plugin hung)"), False),
    (ProviderCallError("provider stub: ReadResource: UNAVAILABLE (the plugin exited with 2)"), False),
    (RuntimeError("a bug"), False),
])
@pytest.mark.parametrize("path", ["threads", "async"])
def test_what_a_failed_call_says_about_reusing_the_process(fail, reused, path):
    pool = WarmProviders()
    client, raw, _ = open_one(pool)
    raw.fail = fail
    with pytest.raises((ResourceError, RuntimeError)) as caught:
        read(client, path)
    if isinstance(fail, ProviderDiagnosticsError) and fail.diagnostics:
        assert caught.type is ThrottledError
    client.close()
    again, _, _ = open_one(pool)
    assert (again._warm.raw is raw) is reused
    assert raw.closed is not reused


@pytest.mark.parametrize("path", ["threads", "async"])
def test_a_malformed_answer_or_a_stop_makes_a_process_unfit(path):
    pool = WarmProviders()
    client, raw, _ = open_one(pool)
    raw.garbage = True
    with pytest.raises(ResourceError, match="invalid object"):
        read(client, path)
    client.close()
    assert raw.closed and pool.idle() == 0 and pool.dropped == 1

    client, raw, _ = open_one(pool)
    read(client)
    client.stop()  # a cancelled run: providers do not come back from StopProvider
    client.close()
    assert raw.stopped and raw.closed and pool.idle() == 0


@pytest.mark.parametrize("at_once", [False, True])
def test_a_process_shut_down_by_a_cancel_is_never_reused(at_once):
    pool = WarmProviders()
    client, raw, _ = open_one(pool)
    client.shut_down(at_once=at_once)  # a call Stop did not end: close()'s Shutdown, or SIGKILL first
    assert raw.closed and raw.killed is at_once
    client.close()
    again, _, _ = open_one(pool)
    assert again._warm.raw is not raw and pool.dropped == 1


def test_idle_processes_are_capped_and_time_out():
    clock = Clock()
    pool = WarmProviders(max_idle=2, idle_s=60.0, clock=clock)
    opened = [open_one(pool, (f"k{n}",)) for n in range(3)]
    for client, _, _ in opened:
        client.close()
        clock.now += 10
    raws = [raw for _, raw, _ in opened]
    assert raws[0].closed and not raws[1].closed and not raws[2].closed and pool.idle() == 2  # the oldest idle went
    clock.now += 35  # k1 idle for 55 s, k2 for 45 s
    assert pool.reap() == 0
    clock.now += 10  # k1 65 s, k2 55 s
    assert pool.reap() == 1 and raws[1].closed and not raws[2].closed
    client, raw, _ = open_one(pool, ("k2",))
    assert raw is raws[2]
    pool.close()
    client.close()  # a run ending after the pool closed: shut down, not kept
    assert raw.closed and pool.idle() == 0


def test_a_warm_process_masks_its_config_secrets_always_and_a_runs_secrets_only_during_that_run():
    own = RunRedactor()
    own.add("config-token-1")
    first, second = Redactor(), Redactor()
    first.add("run-one-secret")
    second.add("run-two-secret")
    line = "config-token-1 run-one-secret run-two-secret"
    own.run = first
    assert own.redact(line) == f"{MASK} {MASK} run-two-secret"
    own.run = None  # idle
    assert own.redact(line) == f"{MASK} run-one-secret run-two-secret"
    own.run = second
    assert own.redact(line) == f"{MASK} run-one-secret {MASK}"
    assert second.redact("run-one-secret") == "run-one-secret"  # one run never learns another's
