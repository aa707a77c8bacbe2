"""Per-call overhead of ReadResource through kl's client versus a bare grpcio stub, same bytes,
same provider process (null 2.1.2). The bare stub is the floor; the gate is a ratio measured in
this run (rounds interleaved, medians), never a wall-clock number. KL_BENCH_QUICK=1 for CI."""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import msgpack
import pytest

from kilolock.provider import launch_provider
from kilolock.provider._pb import tfplugin5_pb2 as pb
from kilolock.provider.connection import MAX_MESSAGE_BYTES
from kit.providers import BY_TYPE, require

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
CALLS = 300 if QUICK else 1500
ROUNDS = 5 if QUICK else 7
IN_FLIGHT = 32
# Target 1.5x (full mode; measured 1.06-1.10 serial, 0.99-1.35 with 32 in flight). CI's quick
# mode gates at 2.0x: quick rounds on a shared 2-core machine swing by a third; a regression such
# as a per-call re-parse or a lock held across calls costs far more.
GATE = 2.0 if QUICK else 1.5

STATE = msgpack.packb({"id": "4711", "triggers": {"a": "b", "c": "d"}})


@pytest.fixture(scope="module")
def setup():
    client = launch_provider(require(BY_TYPE["null"]), tls=False)
    client.configure(b"\x80")
    target = client.connection.process.handshake.grpc_target  # type: ignore[attr-defined]
    channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
    bare = channel.unary_unary(
        "/tfplugin5.Provider/ReadResource",
        request_serializer=pb.ReadResource.Request.SerializeToString,
        response_deserializer=pb.ReadResource.Response.FromString,
    )
    caps = pb.ClientCapabilities(deferral_allowed=False, write_only_attributes_allowed=True)

    def bare_call() -> None:
        req = pb.ReadResource.Request(type_name="null_resource", current_state=pb.DynamicValue(msgpack=STATE), private=b"", client_capabilities=caps)
        resp = bare(req)
        assert resp.new_state.msgpack

    def ours_call() -> None:
        assert client.read_resource("null_resource", STATE, b"").new_state

    yield bare_call, ours_call
    channel.close()
    client.close()


def _serial(fn: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


def _in_flight(pool: ThreadPoolExecutor, fn: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for f in [pool.submit(fn) for _ in range(n)]:
        f.result()
    return (time.perf_counter() - start) / n


def _interleaved(measure: Callable[[Callable[[], None]], float], bare: Callable[[], None], ours: Callable[[], None]) -> tuple[float, float]:
    measure(bare), measure(ours)  # warm-up: connections, caches
    b, o = [], []
    for _ in range(ROUNDS):
        b.append(measure(bare))
        o.append(measure(ours))
    return statistics.median(b), statistics.median(o)


def test_serial_read_overhead(setup, benchmark) -> None:
    bare, ours = setup
    floor, mine = _interleaved(lambda fn: _serial(fn, CALLS), bare, ours)
    ratio = mine / floor
    benchmark.extra_info.update({"bare_ms": round(floor * 1e3, 4), "ours_ms": round(mine * 1e3, 4), "ratio": round(ratio, 3)})
    benchmark.pedantic(ours, rounds=CALLS, iterations=1)
    print(f"\nserial ReadResource: bare {floor*1e3:.3f} ms/call, kl {mine*1e3:.3f} ms/call, ratio {ratio:.2f}")
    assert ratio < GATE, f"kl's client costs {ratio:.2f}x a bare grpcio call (gate {GATE}x)"


def test_in_flight_read_overhead(setup, benchmark) -> None:
    bare, ours = setup
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        floor, mine = _interleaved(lambda fn: _in_flight(pool, fn, CALLS * 2), bare, ours)
        ratio = mine / floor
        benchmark.extra_info.update({"bare_ms": round(floor * 1e3, 4), "ours_ms": round(mine * 1e3, 4), "ratio": round(ratio, 3), "in_flight": IN_FLIGHT})
        benchmark.pedantic(lambda: _in_flight(pool, ours, IN_FLIGHT), rounds=max(3, CALLS // IN_FLIGHT), iterations=1)
    print(f"\n{IN_FLIGHT} in flight: bare {floor*1e3:.3f} ms/call, kl {mine*1e3:.3f} ms/call, ratio {ratio:.2f}")
    assert ratio < GATE, f"kl's client costs {ratio:.2f}x a bare grpcio call with {IN_FLIGHT} in flight (gate {GATE}x)"
