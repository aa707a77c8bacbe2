"""kl serve under load, measured against baselines from the same run (ratios, medians; never a
wall-clock number). The server runs as its own process (`kl serve`), as in real use.

- cycle overhead: one client's GET/LOCK/GET/POST/UNLOCK cycle over HTTP versus the same backend
  calls made directly on a database connection (the floor). Gate: HTTP costs < CYCLE_GATE x.
- concurrency: 50 clients on 10 states (30 s; KL_BENCH_QUICK=1: 3 s) versus one client alone.
  Requests must not block each other: the 50 together must serve at least CONCURRENCY_GATE x the
  request rate of one, with no lost or duplicated version, no hang, every lock answered correctly.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from kit.loadgen import check_database, run_load, state_body
from kit.paths import REPO as ROOT

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
LOAD_SECONDS = 3.0 if QUICK else 30.0
CYCLES = 20 if QUICK else 150
ROUNDS = 3 if QUICK else 7
CYCLE_GATE = 3.0
CONCURRENCY_GATE = 1.0
TOKEN = "bench-token"


@pytest.fixture
def db_url(bench_db: str) -> str:
    """The bench's own migrated database (benches/conftest.py, on the session's one server)."""
    return bench_db


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, KL_DATABASE_URL=db_url, KL_SERVE_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "kilolock", "serve", "--listen", f"127.0.0.1:{port}", "--pool-size", "16"],
                            env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None  # piped just above
    line = proc.stderr.readline()
    assert "kl serve:" in line, f"kl serve did not start: {line}{proc.stderr.read() if proc.poll() is not None else ''}"
    # kl serve logs a line per request: keep reading them, or a full pipe would stall the server.
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _lock(lock_id: str) -> bytes:
    return json.dumps({"ID": lock_id, "Operation": "OperationTypeApply", "Info": "", "Who": "bench@host",
                       "Version": "1.8.5", "Created": "2026-11-29T12:00:00Z", "Path": ""}).encode()


def _http_cycle(url: str) -> Callable[[str], None]:
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    assert u.hostname is not None, f"no host in {url!r}"
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def req(method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()

    def cycle(name: str) -> None:
        path = f"/states/{name}"
        lock_id = str(uuid.uuid4())
        req("GET", path)
        assert req("LOCK", path, _lock(lock_id))[0] == 200
        status, body = req("GET", path)
        serial = json.loads(body)["serial"] if status == 200 else 0
        assert req("POST", f"{path}?ID={lock_id}", state_body(serial + 1, f"lineage-{name}", "h"))[0] == 200
        assert req("UNLOCK", path, _lock(lock_id))[0] == 200

    return cycle


def _direct_cycle(db_url: str) -> Callable[[str], None]:
    from kilolock.server import backend
    from kilolock.server.auth import Principal
    from kilolock.store import db

    conn = db.connect(db_url)
    who = Principal("bench")

    def cycle(name: str) -> None:
        lock_id = str(uuid.uuid4())
        backend.get_state(conn, name)
        assert backend.lock_state(conn, name, _lock(lock_id), who).status == 200
        got = backend.get_state(conn, name)
        serial = json.loads(got.body)["serial"] if got.status == 200 else 0
        assert backend.put_state(conn, name, state_body(serial + 1, f"lineage-{name}", "d"), lock_id, who, None).status == 200
        assert backend.unlock_state(conn, name, _lock(lock_id), who).status == 200

    return cycle


def _per_cycle(cycle: Callable[[str], None], name: str) -> float:
    start = time.perf_counter()
    for _ in range(CYCLES):
        cycle(name)
    return (time.perf_counter() - start) / CYCLES


def test_cycle_overhead(server: str, db_url: str, benchmark) -> None:
    http_cycle, direct_cycle = _http_cycle(server), _direct_cycle(db_url)
    _per_cycle(http_cycle, "warm-h"), _per_cycle(direct_cycle, "warm-d")
    floor, mine = [], []
    for i in range(ROUNDS):
        floor.append(_per_cycle(direct_cycle, f"direct-{i}"))
        mine.append(_per_cycle(http_cycle, f"http-{i}"))
    f, m = statistics.median(floor), statistics.median(mine)
    ratio = m / f
    benchmark.extra_info.update({"direct_ms": round(f * 1e3, 3), "http_ms": round(m * 1e3, 3), "ratio": round(ratio, 3)})
    benchmark.pedantic(lambda: http_cycle("pedantic"), rounds=CYCLES, iterations=1)
    print(f"\nlock/write cycle: direct {f*1e3:.2f} ms, over HTTP {m*1e3:.2f} ms, ratio {ratio:.2f}")
    assert ratio < CYCLE_GATE, f"a cycle over HTTP costs {ratio:.2f}x the direct store calls (gate {CYCLE_GATE}x)"


def test_fifty_clients(server: str, db_url: str, benchmark) -> None:
    one = run_load(server, [f"solo-{i}" for i in range(10)], clients=1, seconds=LOAD_SECONDS / 3, token=TOKEN)
    many = run_load(server, [f"load-{i}" for i in range(10)], clients=50, seconds=LOAD_SECONDS, token=TOKEN)
    ratio = many.requests_per_second / one.requests_per_second
    benchmark.extra_info.update({"one_client_rps": round(one.requests_per_second, 1), "fifty_clients_rps": round(many.requests_per_second, 1),
                                 "ratio": round(ratio, 3), "cycles": many.cycles, "conflicts": many.conflicts})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    print(f"\n50 clients x 10 states, {many.seconds:.1f}s: {many.requests} requests = {many.requests_per_second:.0f} req/s "
          f"({many.cycles} write cycles, {many.conflicts} 423s); one client alone {one.requests_per_second:.0f} req/s; ratio {ratio:.2f}")
    assert one.errors == [] and many.errors == []
    assert many.cycles > 0 and many.conflicts > 0
    combined = type(many)(writes=one.writes + many.writes)
    assert check_database(db_url, combined) == []
    assert ratio >= CONCURRENCY_GATE, f"50 clients together get {ratio:.2f}x one client's request rate (gate {CONCURRENCY_GATE}x)"
