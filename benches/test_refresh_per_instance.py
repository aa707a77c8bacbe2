"""Per-instance cost of a refresh against the bare-grpcio floor, on one null 2.1.2 process.

kl: the orchestrator's whole read phase for a 2,000-instance state (load the version, group,
upgrade gate, encode, ReadResource, decode, compare, sensitivity), dry run, with the default 10
requests in flight. Floor: the same number of ReadResource calls through a bare grpcio stub from
10 threads, with prebuilt request bytes. Gate: kl within 1.5x of the floor, interleaved rounds."""
from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import msgpack
import psycopg

from kilolock import tfstate
from kilolock.provider._pb import tfplugin5_pb2 as pb
from kilolock.provider.client import GrpcProviderClient
from kilolock.redact import Redactor
from kilolock.refresh import orchestrator
from kilolock.refresh.client import ResourceClient
from kilolock.refresh.encoding import EncodingClient
from kilolock.refresh.factory import ProductionFactory
from kilolock.refresh.options import RefreshOptions
from kilolock.store import versions

REPO = Path(__file__).resolve().parents[1]
PLUGINS = Path(os.environ.get("KL_TEST_CACHE", Path.home() / ".cache" / "kilolock-test")) / "plugin-cache"

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
ROUNDS = 2 if QUICK else 5
PARALLELISM = 10
# The target is 1.5x (full mode). Quick mode, which CI runs on a shared 2-core machine where a
# round is a few seconds, gates at 2.0x: it catches regressions (a serialised group measured
# ~10x) without failing on scheduling noise, which moved single quick rounds between 1.2x and 2.0x.
GATE = 2.0 if QUICK else 1.5


class _KeepOpen:
    """A factory that hands out one already-open client and keeps it open between runs, so the
    measurement is the per-instance path, not process start-up."""

    def __init__(self, client: EncodingClient) -> None:
        self.client = client

    def open(self, source: str, alias: str, secrets: Redactor) -> ResourceClient:
        # The provider was launched before the run, so it masks with its own (empty) redactor, not
        # the run's SECRETS: the null provider has none to mask.
        outer = self.client

        class _NoClose:
            info = outer.info

            def __getattr__(self, name: str) -> Any:
                return getattr(outer, name)

            def close(self) -> None:
                pass

        return _NoClose()


def _bare_floor(channel: grpc.Channel, n: int, state: bytes) -> float:
    rpc = channel.unary_unary("/tfplugin5.Provider/ReadResource", request_serializer=lambda b: b, response_deserializer=None)
    request = pb.ReadResource.Request(type_name="null_resource", current_state=pb.DynamicValue(msgpack=state)).SerializeToString()
    remaining = iter(range(n))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if next(remaining, None) is None:
                    return
            rpc(request)

    threads = [threading.Thread(target=worker) for _ in range(PARALLELISM)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def test_per_instance_cost_within_the_grpc_floor(benchmark, bench_db, bench_summary):
    raw = (REPO / "tests" / "fixtures" / "states" / "big2000-v1.tfstate").read_bytes()
    with psycopg.connect(bench_db, autocommit=True) as conn:
        versions.write_version(conn, "per-instance", tfstate.parse_state(raw), raw, source="import", actor="bench")
        sid = versions.state_id(conn, "per-instance")
        client = ProductionFactory(conn, sid, (str(PLUGINS),)).open("registry.terraform.io/hashicorp/null", "", Redactor())
        try:
            raw_client = client._raw
            assert isinstance(raw_client, GrpcProviderClient), raw_client
            channel = raw_client.connection.channel  # the very connection kl uses
            state = msgpack.packb({"id": "1234567890123456789", "triggers": {"group": "g07", "n": "7", "revision": "1"}})
            n = sum(1 for r in tfstate.parse_state(raw).managed())
            factory = _KeepOpen(client)
            options = RefreshOptions(actor="bench", dry_run=True, provider_parallelism=PARALLELISM)

            def kl_run() -> float:
                t0 = time.perf_counter()
                res = orchestrator.run(conn, "per-instance", factory, options)
                assert res.status == "succeeded" and res.checked == n, res.error
                return time.perf_counter() - t0

            kl_run(), _bare_floor(channel, n, state)  # warm-up
            kl_times, floor_times = [], []
            for _ in range(ROUNDS):
                floor_times.append(_bare_floor(channel, n, state))
                kl_times.append(kl_run())
            benchmark.pedantic(kl_run, rounds=1, iterations=1)
        finally:
            client.close()
    kl_t, floor_t = statistics.median(kl_times), statistics.median(floor_times)
    ratio = kl_t / floor_t
    benchmark.extra_info.update(instances=n, kl_us_per_instance=round(kl_t / n * 1e6), floor_us_per_call=round(floor_t / n * 1e6),
                                ratio=round(ratio, 3))
    line = (f"refresh per instance, {PARALLELISM} in flight: kl {kl_t / n * 1e6:.0f} us, bare grpcio {floor_t / n * 1e6:.0f} us, "
            f"ratio {ratio:.2f} (gate {GATE})")
    bench_summary.append(line)
    print("\n" + line)
    assert ratio <= GATE, f"kl's per-instance cost is {ratio:.2f}x the bare grpcio floor (gate {GATE}x)"
