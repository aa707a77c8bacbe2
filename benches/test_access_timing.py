"""A refused token takes the same time whether kl knows it or not (issue 20), shown statistically.

kl serve (its own process) answers 401 to three kinds of token, sent interleaved in a random order
on one kept-alive connection: unknown (random, never stored), revoked and expired (stored, so
known). Each is looked up by its SHA-256 in one statement that returns no row for any of them.
Two measures, both from the same run (no wall-clock threshold):

- the ratio of medians, known / unknown: within RATIO_GATE of 1;
- the common-language effect size (Mann-Whitney U / n1 n2: the chance that a random known sample
  is slower than a random unknown one): within EFFECT_GATE of 0.5, where 0.5 is "no telling apart".
"""
from __future__ import annotations

import hashlib
import http.client
import os
import random
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from kit.paths import REPO as ROOT

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
SAMPLES = 300 if QUICK else 2000  # per kind
RATIO_GATE = 0.10 if QUICK else 0.05
EFFECT_GATE = 0.12 if QUICK else 0.08


def _token() -> str:
    return "klt_" + secrets.token_urlsafe(32)


@pytest.fixture
def tokens(bench_db: str) -> dict[str, str]:
    from kilolock.store import access

    made = {"revoked": _token(), "expired": _token(), "valid": _token()}
    with psycopg.connect(bench_db, autocommit=True) as conn:
        for name, secret in made.items():
            access.create_token(conn, name, hashlib.sha256(secret.encode()).digest(), "read", "**",
                                3600.0, "bench")
        access.revoke_token(conn, "revoked", "bench")
        conn.execute("UPDATE access_tokens SET expires_at = now() - interval '1 hour' WHERE name = 'expired'")
        # Many others, so the index lookup is not a one-page affair.
        for i in range(2000):
            access.create_token(conn, f"other-{i}", hashlib.sha256(_token().encode()).digest(), "read", "x/**", None, "bench")
    return made


@pytest.fixture
def server(bench_db: str, tokens: dict[str, str]) -> Iterator[tuple[str, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, KL_DATABASE_URL=bench_db, PYTHONPATH=str(ROOT), KL_SERVE_TOKEN="")
    proc = subprocess.Popen([sys.executable, "-m", "kilolock", "serve", "--listen", f"127.0.0.1:{port}", "-q"],
                            env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "kl serve:" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    try:
        yield "127.0.0.1", port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _effect_size(a: list[float], b: list[float]) -> float:
    """P(a sample of A > a sample of B), ties counting half: Mann-Whitney U / (n_a n_b), by ranks."""
    merged = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(merged)
    i = 0
    while i < len(merged):
        j = i
        while j + 1 < len(merged) and merged[j + 1][0] == merged[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    rank_sum_a = sum(r for r, (_, group) in zip(ranks, merged, strict=True) if group == 0)
    u_a = rank_sum_a - len(a) * (len(a) + 1) / 2
    return u_a / (len(a) * len(b))


def test_refusal_time_does_not_tell_a_known_token_from_an_unknown(server, tokens, bench_summary):
    host, port = server
    conn = http.client.HTTPConnection(host, port, timeout=30)

    def refused_in(secret: str) -> float:
        start = time.perf_counter()
        conn.request("GET", "/states/x", headers={"Authorization": f"Bearer {secret}"})
        resp = conn.getresponse()
        resp.read()
        took = time.perf_counter() - start
        assert resp.status == 401, resp.status
        return took

    assert refused_in(_token()) > 0 and refused_in(tokens["revoked"]) > 0  # warm both paths
    conn.request("GET", "/states/x", headers={"Authorization": f"Bearer {tokens['valid']}"})
    ok = conn.getresponse()
    ok.read()
    assert ok.status == 204  # the valid token works: the others are refused for what they are
    kinds = ["unknown", "revoked", "expired"] * SAMPLES
    random.Random(20).shuffle(kinds)
    times: dict[str, list[float]] = {"unknown": [], "revoked": [], "expired": []}
    for kind in kinds:
        times[kind].append(refused_in(_token() if kind == "unknown" else tokens[kind]))
    conn.close()

    unknown = times["unknown"]
    known = times["revoked"] + times["expired"]
    ratio = statistics.median(known) / statistics.median(unknown)
    effect = _effect_size(known, unknown)
    per_kind = {k: f"{statistics.median(v) * 1e3:.3f}ms" for k, v in times.items()}
    bench_summary.append(f"refused token timing: median known/unknown {ratio:.3f} (gate 1±{RATIO_GATE}), "
                         f"P(known slower) {effect:.3f} (gate 0.5±{EFFECT_GATE}); medians {per_kind}; "
                         f"{SAMPLES} samples per kind")
    assert abs(ratio - 1) <= RATIO_GATE, per_kind
    assert abs(effect - 0.5) <= EFFECT_GATE, per_kind
