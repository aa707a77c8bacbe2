"""Per-instance cost of a refresh against the bare-grpcio floor, on one null 2.1.2 process.

kl: the orchestrator's whole read phase for a 2,000-instance state (load the version, group,
upgrade gate, encode, ReadResource, decode, compare, sensitivity), dry run, with the default 10
requests in flight. Floor: the same number of ReadResource calls through a bare grpcio stub from
10 threads, with prebuilt request bytes, on a plain grpc channel of its own to the very plugin
process kl reads from (same target, same AutoMTLS certificates). Gate: kl within 1.3x of the floor
(the issue's target; quick mode 1.5x), interleaved rounds.

Measured (full mode, medians of 5 interleaved rounds, per instance): on an idle machine before
session 7's cuts, kl 595 us, floor 406 us, 1.47x; kl with reads answered at once 169 us. On the same
machine at load 2-7 (another job's terraform using 1.7 cores): before the cuts 1.28x / 1.35x /
1.31x, after them 1.59x / 1.43x / 1.32x / 1.43x / 1.16x / 1.62x / 1.31x / 1.28x (kl 373-635 us,
floor 287-484 us; CPU kl 280-430 us, floor 185-295 us, kl ~95-135 us above it in every run; reads
answered at once 66-88 us). A loaded machine moves the ratio by more than the cuts do, so the gate
stays where it was; the full gate is for an idle machine. The
cuts: indexing the state (parse_state) 11.3 -> 4.5 us per instance on this state (7.0 -> 3.6 us on
20,000 null instances), the ReadResource request built as bytes 2.8 -> 1.1 us, a stored object's
private data decoded once per distinct text 1.3 -> 0.3 us. What is left of kl's own work, measured
one phase at a time: loading the version ~15-24 us wall per instance (most of it PostgreSQL
rendering the pieces), indexing 4.5, the stored attributes 3, and everything per read that is not
the RPC (codec both ways, request, response, compare, sensitivity, bookkeeping) 16-18 us of Python
run serially. Under ten reader threads that Python costs ~4x as much: per read, kl's reader threads
used ~100 us more CPU than the floor's (297 vs 203 us; in the grpc call itself 216 vs 203), the
rest of the process ~40 us more (the load, grpc's own threads): the Python around each call,
which shares the GIL and the caches with grpc's threads, is where the gap is.

Session 8: reads of a group this big now come from one asyncio event loop through grpc.aio (the
orchestrator's async path; threads remain for small groups). Quick mode, one helper's tests running
(load ~2), two runs: kl 415 / 425 us against the floor's 316 / 306 us, 1.31x / 1.39x (threads in the
same runs 448 / 503 us); kl's CPU 245 us per instance against 327-348 us through threads, 0.71x /
0.75x, the gate below. The loop is not busy all the time at 10 in flight (CPU 245 of 415 us): the
loop and the provider take turns, and 20 in flight measured 0.63 s against 0.73 s for the 2,000
reads (auto grows there when it pays). What is left per read is grpc.aio's own call (its _invoke,
~120 us of the loop's time under cProfile) and kl's Python around it (~60 us).

Is the floor fair? Against the same provider in one run: 10 threads 353 us, 20 threads 404 us,
one thread keeping 10 calls in flight with grpc futures 348 us (with 15 us of Python per answer:
328 us), single rounds spread 230-520 us on the loaded machine: 10 threads is as fast as the
sync API gets, and the medians of interleaved rounds are what makes the ratio stable.

Session 9: the loop's calls go through kl's native HTTP/2 client (kilolock.provider.h2channel). Quick
mode, quiet machine (a slower one than session 8's: its bare baselines took twice as long), same
run: kl 338 us per instance against the floor's 341 us, 0.99x (the target, 1.3x, is met); kl's CPU
180 us against the floor's 308; kl's loop through grpc.aio 472 us, CPU 397 us, so the native
client's CPU is 0.45x grpc.aio's (the gate below); threads 481 us, CPU 445 us. The wall time is
now the provider's: null 2.1.2 spends ~230-260 us of CPU per ReadResource (read from /proc), kl
~70-90 us in a bare loop of reads (h2channel, protobuf, asyncio) and ~180 us with everything a
refresh does per instance, so two cores hold ~200 us per read whatever kl saves.

Session 10: the provider transport carries every call, not only the loop's reads: kl's native client
(the default) or grpcio (KL_PROVIDER_TRANSPORT=grpcio), chosen when the provider is launched. So the
variants through grpcio ("kl's loop through grpc.aio", "kl through grpcio threads") read from a second
null process opened with KL_PROVIDER_TRANSPORT=grpcio: kl with grpcio as its whole transport, as
before the native client, which keeps the loop-over-threads gate comparing one transport with
itself. "kl through native threads" (no gate) is the default transport's blocking path, the one small
groups take.

And what `--provider-parallelism auto` (the default) costs where more in flight cannot help: a
provider on the same machine answers in well under a millisecond, so kl's own CPU sets the pace.
Auto against a fixed 10 on the same 20,000-instance state (KL_BENCH_QUICK=1: 10,000), same open
provider, interleaved rounds: once measured 1.12x (threads that a probe had added stayed on after
auto levelled off, each answer waking another one); the target is within 5%. Through the event loop
(session 8, quick mode, 10,000 instances): auto 3.30 s (max 23/25 in flight) against a fixed 10's
3.87 s, 0.85x: one loop's turns with the provider leave room that more reads in flight fill."""
from __future__ import annotations

import json
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import msgpack
import psycopg

from kilolock import tfstate
from kilolock.provider._pb import tfplugin5_pb2 as pb
from kilolock.provider.certs import der_to_pem, process_client_certificate
from kilolock.provider.client import GrpcProviderClient
from kilolock.provider.connection import PluginConnection
from kilolock.redact import Redactor
from kilolock.refresh import orchestrator
from kilolock.refresh.client import ReadOutcome, ResourceClient
from kilolock.refresh.encoding import EncodingClient
from kilolock.refresh.factory import ProviderFactory
from kilolock.refresh.inflight import Parallelism
from kilolock.refresh.options import RefreshOptions
from kilolock.store import states, writes

REPO = Path(__file__).resolve().parents[1]
PLUGINS = Path(os.environ.get("KL_TEST_CACHE", Path.home() / ".cache" / "kilolock-test")) / "plugin-cache"

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
ROUNDS = 2 if QUICK else 5
PARALLELISM = 10
# Through grpc the ratio measured 1.16-1.62x on a loaded machine (see the docstring); through the
# native client 0.99x (session 9), so full mode gates at the target, 1.3x, and quick mode, which CI
# runs on a shared 2-core machine where a round is a few seconds, at 1.5x: a return to grpc.aio
# (~1.4x) or to threads (~1.4-1.6x) fails there, scheduling noise should not.
GATE = 1.5 if QUICK else 1.3
# kl's CPU reading through its event loop with grpc.aio over reading through threads, both with grpcio
# as the provider transport (the fallback without the native client), medians of interleaved rounds:
# measured 0.71-0.75x (quick mode, load ~2), 0.93x at load 4 (where ten runnable threads win a bigger
# share of a contended machine than one loop does), 0.89x on session 9's quiet machine. The fallback
# must at least not cost more than threads.
LOOP_CPU_GATE = 1.0
# kl's CPU reading through the native HTTP/2 client (the default provider transport) over reading
# through grpc.aio (KL_PROVIDER_TRANSPORT=grpcio), both from the event loop, medians of interleaved
# rounds: 0.45x (session 9, quick mode, quiet machine).
NATIVE_CPU_GATE = 0.75


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


class _NoRpc:
    """An open client whose reads answer at once with what was sent: everything kl does per
    instance except the call itself."""

    def __init__(self, client: EncodingClient) -> None:
        self._client = client
        self.info = client.info

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def async_reader(self) -> None:
        return None  # the threads' path: its answers come at once, there is nothing to wait for

    def read_resource(self, type_name: str, prior: bytes, private: bytes, identity: bytes | None) -> ReadOutcome:
        wire = self._client._encode_prior(type_name, prior)  # the encode and decode a real read makes
        return ReadOutcome(new_state=self._client._decode(type_name, wire, "ReadResource"), private=private)


def _null_state(instances: int) -> bytes:
    """`count = N` of null_resource as Terraform 1.8 writes it (the shape test_big_state uses)."""
    rng = random.Random(instances)
    return json.dumps({
        "version": 4, "terraform_version": "1.8.5", "serial": 1, "lineage": f"0a0a0a0a-0000-4000-8000-{instances:012d}",
        "outputs": {},
        "resources": [{
            "mode": "managed", "type": "null_resource", "name": "r",
            "provider": 'provider["registry.terraform.io/hashicorp/null"]',
            "instances": [{"index_key": n, "schema_version": 0, "sensitive_attributes": [],
                           "attributes": {"id": str(rng.getrandbits(63)), "triggers": {"group": f"g{n % 16:02d}", "n": str(n)}},
                           "private": "bnVsbA=="}
                          for n in range(instances)],
        }],
    }, indent=2).encode()


def _grpc_channel(connection: PluginConnection) -> grpc.Channel:
    """A plain grpc channel to the plugin process behind ``connection``: its target, and its
    AutoMTLS certificates when the connection uses them. kl's own channel may be its native client."""
    hs = connection.process.handshake
    assert hs is not None
    if not connection.tls:
        return grpc.insecure_channel(hs.grpc_target)
    assert hs.server_cert_der is not None
    cert = process_client_certificate()
    creds = grpc.ssl_channel_credentials(root_certificates=der_to_pem(hs.server_cert_der), private_key=cert.key_pem,
                                         certificate_chain=cert.cert_pem)
    return grpc.secure_channel(hs.grpc_target, creds, options=[("grpc.ssl_target_name_override", "localhost")])


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
        writes.store_document(conn, "per-instance", tfstate.parse_state(raw), raw, source="import", actor="bench")
        sid = states.state_id(conn, "per-instance")
        for variable in ("KL_READ_PATH", "KL_PROVIDER_TRANSPORT"):
            assert variable not in os.environ, f"the bench measures kl's own choice: unset {variable}"

        def open_null() -> EncodingClient:
            opened = ProviderFactory(conn, sid, (str(PLUGINS),)).open("registry.terraform.io/hashicorp/null", "", Redactor())
            assert isinstance(opened, EncodingClient)  # a launched process: the codec's client, not wrapped
            return opened

        client = open_null()
        grpcio_client = None
        channel = None
        try:
            assert client.info.transport == "native", f"kl's default transport is {client.info.transport!r}: is the extension built?"
            os.environ["KL_PROVIDER_TRANSPORT"] = "grpcio"
            try:
                grpcio_client = open_null()  # a second null process, every call of it through grpcio
            finally:
                del os.environ["KL_PROVIDER_TRANSPORT"]
            assert grpcio_client.info.transport == "grpcio", grpcio_client.info
            raw_client = client._raw
            assert isinstance(raw_client, GrpcProviderClient), raw_client
            channel = _grpc_channel(raw_client.connection)  # to the very plugin process kl reads from
            state = msgpack.packb({"id": "1234567890123456789", "triggers": {"group": "g07", "n": "7", "revision": "1"}})
            n = sum(1 for r in tfstate.parse_state(raw).managed())
            factory, grpcio_factory = _KeepOpen(client), _KeepOpen(grpcio_client)
            options = RefreshOptions(actor="bench", dry_run=True, provider_parallelism=PARALLELISM)

            def kl_run(through: Any = factory) -> float:
                t0 = time.perf_counter()
                res = orchestrator.run(conn, "per-instance", through, options)
                assert res.status == "succeeded" and res.checked == n, res.error
                return time.perf_counter() - t0

            def cpu(fn: Callable[[], float]) -> tuple[float, float]:
                before = os.times()
                elapsed = fn()
                after = os.times()
                return elapsed, (after.user + after.system) - (before.user + before.system)

            def kl_with(env: dict[str, str], through: Any = factory) -> Callable[[], float]:
                def run() -> float:
                    os.environ.update(env)
                    try:
                        return kl_run(through)
                    finally:
                        for variable in env:
                            del os.environ[variable]
                return run

            # The grpcio variants: the provider's transport is chosen at launch, so they read from
            # grpcio_client's process (the variable is set for the run as well, as a user would).
            grpcio = {"KL_PROVIDER_TRANSPORT": "grpcio"}
            kl_threads = kl_with({**grpcio, "KL_READ_PATH": "threads"}, grpcio_factory)
            kl_aio = kl_with(grpcio, grpcio_factory)
            kl_native_threads = kl_with({"KL_READ_PATH": "threads"})
            kl_run(), kl_threads(), kl_aio(), kl_native_threads(), _bare_floor(channel, n, state)  # warm-up
            kl_runs, thread_runs, aio_runs, native_thread_runs, floor_runs, no_rpc = [], [], [], [], [], []
            for _ in range(ROUNDS):
                floor_runs.append(cpu(lambda: _bare_floor(channel, n, state)))
                kl_runs.append(cpu(kl_run))
                thread_runs.append(cpu(kl_threads))
                aio_runs.append(cpu(kl_aio))
                native_thread_runs.append(cpu(kl_native_threads))
                # Where the rest goes: the same run with every read answered at once (no RPC), i.e.
                # loading and parsing the version, grouping, the codec, the bookkeeping: kl's own work.
                no_rpc.append(kl_run(_KeepOpen(_NoRpc(client))))  # type: ignore[arg-type]
            benchmark.pedantic(kl_run, rounds=1, iterations=1)
        finally:
            if channel is not None:
                channel.close()
            if grpcio_client is not None:
                grpcio_client.close()
            client.close()
    kl_t, floor_t = statistics.median(t for t, _ in kl_runs), statistics.median(t for t, _ in floor_runs)
    kl_cpu, floor_cpu = statistics.median(c for _, c in kl_runs), statistics.median(c for _, c in floor_runs)
    threads_t, threads_cpu = statistics.median(t for t, _ in thread_runs), statistics.median(c for _, c in thread_runs)
    aio_t, aio_cpu = statistics.median(t for t, _ in aio_runs), statistics.median(c for _, c in aio_runs)
    nthreads_t = statistics.median(t for t, _ in native_thread_runs)
    nthreads_cpu = statistics.median(c for _, c in native_thread_runs)
    ratio = kl_t / floor_t
    cpu_ratio = aio_cpu / threads_cpu
    native_cpu_ratio = kl_cpu / aio_cpu
    benchmark.extra_info.update(instances=n, kl_us_per_instance=round(kl_t / n * 1e6), floor_us_per_call=round(floor_t / n * 1e6),
                                ratio=round(ratio, 3), kl_cpu_us=round(kl_cpu / n * 1e6), floor_cpu_us=round(floor_cpu / n * 1e6),
                                kl_threads_us=round(threads_t / n * 1e6), kl_threads_cpu_us=round(threads_cpu / n * 1e6),
                                kl_grpc_aio_us=round(aio_t / n * 1e6), kl_grpc_aio_cpu_us=round(aio_cpu / n * 1e6),
                                kl_native_threads_us=round(nthreads_t / n * 1e6), kl_native_threads_cpu_us=round(nthreads_cpu / n * 1e6),
                                kl_without_rpc_us=round(statistics.median(no_rpc) / n * 1e6))
    line = (f"refresh per instance, {PARALLELISM} in flight: kl {kl_t / n * 1e6:.0f} us, bare grpcio {floor_t / n * 1e6:.0f} us, "
            f"ratio {ratio:.2f} (gate {GATE}); CPU kl {kl_cpu / n * 1e6:.0f} us, bare {floor_cpu / n * 1e6:.0f} us; "
            f"kl's loop through grpc.aio {aio_t / n * 1e6:.0f} us, CPU {aio_cpu / n * 1e6:.0f} us (native's CPU {native_cpu_ratio:.2f}x, "
            f"gate {NATIVE_CPU_GATE}); kl through grpcio threads {threads_t / n * 1e6:.0f} us, CPU {threads_cpu / n * 1e6:.0f} us "
            f"(grpc.aio loop's CPU {cpu_ratio:.2f}x, gate {LOOP_CPU_GATE}); kl through native threads "
            f"{nthreads_t / n * 1e6:.0f} us, CPU {nthreads_cpu / n * 1e6:.0f} us; kl with reads answered at once "
            f"{statistics.median(no_rpc) / n * 1e6:.0f} us")
    bench_summary.append(line)
    print("\n" + line)
    assert ratio <= GATE, f"kl's per-instance cost is {ratio:.2f}x the bare grpcio floor (gate {GATE}x)"
    assert cpu_ratio <= LOOP_CPU_GATE, (f"kl's reads from the event loop through grpc.aio used {cpu_ratio:.2f}x the CPU of its "
                                        f"reads from threads through grpcio (gate {LOOP_CPU_GATE}x): the async path no longer pays for itself")
    assert native_cpu_ratio <= NATIVE_CPU_GATE, (f"kl's reads through the native HTTP/2 client used {native_cpu_ratio:.2f}x the CPU "
                                                 f"of its reads through grpc.aio (gate {NATIVE_CPU_GATE}x)")


AUTO_INSTANCES = 10_000 if QUICK else 20_000
AUTO_ROUNDS = 2 if QUICK else 3
# Auto's time over a fixed 10's, medians of interleaved rounds. The target is 1.05 (full mode); quick
# mode, on CI's shared runner with half the instances, allows 1.10 for scheduling noise. A
# regression of the kind this guards measured 1.12x at 20,000 and 1.5x at 100,000.
AUTO_GATE = 1.10 if QUICK else 1.05
# kl's own CPU time (user + system, its provider's not counted), auto over fixed 10: the quieter signal
# on a busy machine, where other processes' CPU moves the wall times. The regression above measured
# 1.33x (quick mode, a machine at load 12: its wall-time ratio 1.08x was within that noise); fixed,
# 0.99-1.01x.
AUTO_CPU_GATE = 1.10


def test_auto_costs_no_more_than_a_fixed_10_against_a_fast_provider(benchmark, bench_db, bench_summary):
    raw = _null_state(AUTO_INSTANCES)
    with psycopg.connect(bench_db, autocommit=True) as conn:
        writes.store_document(conn, "auto-overhead", tfstate.parse_state(raw), raw, source="import", actor="bench")
        sid = states.state_id(conn, "auto-overhead")
        client = ProviderFactory(conn, sid, (str(PLUGINS),)).open("registry.terraform.io/hashicorp/null", "", Redactor())
        assert isinstance(client, EncodingClient)
        try:
            factory = _KeepOpen(client)
            used: list[dict[str, Any]] = []

            def timed(parallelism: Parallelism) -> tuple[float, float]:
                options = RefreshOptions(actor="bench", dry_run=True, provider_parallelism=parallelism)
                cpu0, t0 = os.times(), time.perf_counter()
                res = orchestrator.run(conn, "auto-overhead", factory, options)
                elapsed, cpu1 = time.perf_counter() - t0, os.times()
                assert res.status == "succeeded" and res.checked == AUTO_INSTANCES, res.error
                if parallelism == "auto":
                    used.extend(res.concurrency)
                return elapsed, (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)

            timed("auto"), timed(10)  # warm-up
            used.clear()
            auto_runs, fixed_runs = [], []
            for _ in range(AUTO_ROUNDS):
                fixed_runs.append(timed(10))
                auto_runs.append(timed("auto"))
            benchmark.pedantic(lambda: None, rounds=1, iterations=1)
        finally:
            client.close()
    auto_t, fixed_t = statistics.median(t for t, _ in auto_runs), statistics.median(t for t, _ in fixed_runs)
    auto_cpu, fixed_cpu = statistics.median(c for _, c in auto_runs), statistics.median(c for _, c in fixed_runs)
    ratio = auto_t / fixed_t
    benchmark.extra_info.update(instances=AUTO_INSTANCES, auto_s=round(auto_t, 3), fixed10_s=round(fixed_t, 3), ratio=round(ratio, 3),
                                cpu_ratio=round(auto_cpu / fixed_cpu, 3), concurrency=used)
    line = (f"auto vs fixed 10 against null, {AUTO_INSTANCES} instances: auto {auto_t:.2f} s (in flight max "
            f"{'/'.join(str(c['max']) for c in used)}, final {'/'.join(str(c['final']) for c in used)}), fixed 10 {fixed_t:.2f} s: "
            f"{ratio:.3f}x (gate {AUTO_GATE}); kl's CPU {auto_cpu:.2f} s vs {fixed_cpu:.2f} s: "
            f"{auto_cpu / fixed_cpu:.3f}x (gate {AUTO_CPU_GATE})")
    bench_summary.append(line)
    print("\n" + line)
    assert ratio <= AUTO_GATE and auto_cpu / fixed_cpu <= AUTO_CPU_GATE, line
