"""The fixed costs of a small refresh, step by step: `python3 -I kl.pyz refresh` of a 10-instance
state (null 2.1.2, which completes AutoMTLS), traced by benches/refresh_steps.py, medians of
interleaved rounds. Prints one table and records it in extra_info; it gates nothing by itself
(test_refresh_vs_terraform gates the whole process against the peers), but fails when a step
it should see is missing, so a renamed function cannot silently drop a line.

Steps overlap where kl overlaps them (the plugin starts while grpc is imported): the table shows
each step's own duration, and `critical path` the wall time from the interpreter's start to exit.
The last line is the CPU time of kl's own process (every thread, not the provider's): on a loaded
machine the steadier figure, and the one to compare, since kl's threads share one GIL.

Measured 2026-11-30 on the shared 2-core machine (load 4-8, kl, its provider and PostgreSQL at
nice -10 so the other sessions weigh less), 9 traced runs each, medians in ms, before -> after
session 6's cuts: bootstrap 23.3 -> 18.8 (kl.pyz's start-up modules no longer compiled twice),
kilolock.cli + parse 24.4 -> 12.5 (argparse's ~150 gettext catalogue searches; only the chosen
command's parser), psycopg 129.8 -> 125.1 and grpc 74.3 -> 66.2 (imported at once on two threads:
each figure holds the other's share of the GIL; alone psycopg costs ~60 ms of CPU and grpc ~35),
schema check 11.0 -> 8.3 (no importlib.resources), AutoMTLS first call 31.8 -> 30.8, reads 7.8 ->
6.6, commit 67.5 -> 33.1 (the JIT compiled one statement for ~35 ms: now SET LOCAL jit = off),
exit 8.8 -> 8.4; critical path 420 -> 342, kl's CPU 287 -> 272. What is left is mostly import work
in the libraries (psycopg registers its whole type system and an array type per type; grpc with
grpc.aio; the protobuf runtime) plus the commit's ~45 statements and three synchronous commits.

Session 8 (2026-12-01), interleaved rounds of the code before and after in one run (31 rounds,
kl and PostgreSQL at nice -10, load 2.4-2.8), medians in ms: critical path 284.2 -> 271.6, kl's
CPU 235.0 -> 227.4. By cut: every command's notification check no longer plans the refresh.stale
statement unless a channel's staleness is due for evaluation (the server spent ~12 ms planning it,
parse 2.4 + bind 9.8 ms logged on an idle machine; now one EXISTS round trip), together with lock
IDs made without the uuid module (which imports platform, ~3.5 ms): 284.2 -> 275.0, CPU 235.0 ->
227.3; a docstring on each of the 45 dataclasses a refresh imports (without one @dataclass writes
one from inspect.signature, 3-4 ms in all): 275.0 -> 271.6. Again at load 1.5-2.0 (31 rounds):
283.1 -> 279.5 -> 271.2, CPU 237.4 -> 233.0 -> 230.6; at load 3.8 (21 rounds, before -> after):
385.3 -> 371.3, CPU 262.4 -> 249.9. Tried and dropped, no gain measurable above the
noise (+-10 ms here): opening the store on a thread beside the imports (its round trips wait for
the GIL behind the importing threads), spawning the early provider on its own thread, a shorter
GIL switch interval. Note that `schema check` and `db connect` vary 4-15 ms from run to run: the
main thread's round trips wait for the GIL whenever the early-start thread is still importing grpc.
What is left is CPU under one GIL: measured alone, psycopg ~65 ms, asyncio ~30 (psycopg and
grpc both import it), grpc ~25, protobuf ~10, kilolock's own modules ~25-35, and the commit
(~45 statements in five transactions, ~25 ms). The issue's 1.2x at 10 instances needs about a
third of that off the critical path: the store in a second process (psycopg on the other core).

Session 12 (2026-12-01, a machine about twice as slow as session 8's: the peers took 0.47-0.52 s
there) tried the other half of that split: the provider's start (its imports, the plugin, AutoMTLS)
in a forked helper process that then served the plugin's calls over a socketpair (branch
s12-hosted, not merged). 5 traced runs, main -> helper: critical path 501.5 -> 472.2 ms, imports
before connect 224.8 -> 210.2, psycopg 126.7 -> 117.6, reads 5.0 -> 10.9 (threads and a socket
instead of the event loop); 20 interleaved whole-process rounds: median 0.465 -> 0.460 s (1%).
The early start already overlapped the imports almost entirely. What is left on the critical path
is serial: interpreter and kl.pyz (~55 ms), psycopg (~120), the store's round trips before the
first read (~45), the commit (~52), each waiting for the one before. A store in a second process
would not shorten it either: the reads wait for the state, which waits for psycopg.

Session 14 (2026-12-02, the same slower machine, quiet; quick mode, medians of 5) cut two of those
links. A refresh that changes no object commits its top level only, sharing the prior version's
layout (versions.write_version(same_resources=True)): commit 53.0 -> 10.7 ms (CI of session 13 ->
this run), ~35 statements fewer. And `kl refresh` runs no garbage collection until its state is
loaded, then freezes what it holds (kilolock.gcpolicy): the collector had walked the imports' tens
of thousands of objects again and again. Whole process, 15 interleaved rounds of kl.pyz before and
after (the 10-instance state): 0.43 -> 0.38 s. Critical path now 402 ms (imports before connect
217, of which psycopg 122; state load, audit row and lock check 23; TLS for the native client 31 on
the early thread), kl's CPU 343 ms. What is left on the critical path is the list above, less the
commit.

Session 15 (2026-12-02; this machine's speed changed within the day by ~1.5x, so before and after
come from interleaved rounds of kl.pyz in one hour) cut two more: the AutoMTLS client key and its
certificate's signature come from aws-lc through the extension (certs.py, codec_rs/src/p256.rs):
6.3 -> 0.6 ms on the main thread before the provider can start; and modules other libraries
import for paths kl never takes (protobuf's pure-Python backend and what it imports, copy,
tokenize) are placeholders whose code never runs (kilolock.lazyimports). Traced, medians of 10-12
rounds: kl's CPU 196 -> 186 and 329 -> 316 ms (fast and slow hours), exit 194 -> 187 and 329 ->
313 ms; psycopg's import 104 -> 88 ms where the provider's connecting thread no longer imports the
pure-Python backend beside it. Whole process, 30-40 interleaved rounds: -8 to -25 ms. This run's
critical path: 238.6 ms (fast hour), psycopg 65.6, commit 6.4.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from kit.paths import PLUGIN_CACHE, REPO
from kit.pyz import clean_env

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
ROUNDS = 5 if QUICK else 11
PYTHON = "/usr/bin/python3"
DRIVER = REPO / "benches" / "refresh_steps.py"
STATE = "tests/fixtures/states/big10000.tfstate.gz"


def _state(n: int) -> bytes:
    import gzip

    doc = json.loads(gzip.decompress((REPO / STATE).read_bytes()))
    for r in doc["resources"]:
        if r["mode"] == "managed":
            r["instances"] = r["instances"][:n]
    return json.dumps(doc, indent=2).encode()


def _span(events: list[tuple[str, float, float]], step: str) -> tuple[float, float] | None:
    hits = [(a, b) for s, a, b in events if s == step]
    return (min(a for a, _ in hits), max(b for _, b in hits)) if hits else None


def _dur(events: list[tuple[str, float, float]], step: str) -> float:
    """The step's total duration: a step that ran twice (a relaunch) adds up."""
    return sum(b - a for s, a, b in events if s == step)


def steps_of(doc: dict[str, Any], before_t0: float, wall: float) -> dict[str, float]:
    """Seconds per step of one traced run. ``before_t0``: from spawning the interpreter to the
    tracer's first line; ``wall``: the whole process as its parent saw it."""
    ev = [(s, a, b) for s, a, b in doc["events"]]
    cmd = _span(ev, "refresh command")
    store = _span(ev, "open store (connect + schema check)")
    factory = _span(ev, "factory open (discover .. configure)")
    reads = _span(ev, "read")
    commit = _span(ev, "commit")
    finish = _span(ev, "finish audit row")
    cli = _span(ev, "import kilolock.cli")
    assert cmd and store and factory and reads and commit and finish and cli, f"the trace lacks steps: {sorted({e[0] for e in ev})}"
    imports_before_connect = store[0] - cmd[0]
    out = {
        "interpreter + tracer start": before_t0,
        "kl.pyz bootstrap (to kilolock.cli)": cli[0],
        "import kilolock.cli + parse args": cmd[0] - cli[0],
        "import psycopg": _dur(ev, "import psycopg"),
        "import grpc": _dur(ev, "import grpc"),
        "import protocol stubs (protobuf)": _dur(ev, "import protocol stubs"),
        "imports before connect (all)": imports_before_connect,
        "db connect": _dur(ev, "db connect"),
        "schema check": (store[1] - store[0]) - _dur(ev, "db connect"),
        "state load, audit row, lock check": factory[0] - store[1],
        "AutoMTLS client certificate": _dur(ev, "AutoMTLS client certificate"),
        "provider spawn": _dur(ev, "provider spawn"),
        "provider handshake wait": _dur(ev, "provider handshake wait") or _dur(ev, "provider launch (spawn to handshake line)"),
        "channel connect (TLS for the native client)": _dur(ev, "channel connect (TLS for the native client)"),
        "AutoMTLS / first call (health probe)": _dur(ev, "AutoMTLS / first call (health probe)"),
        "schema (cached)": _dur(ev, "schema (cached or fetched)"),
        "validate + configure": _dur(ev, "validate + configure"),
        "factory open (discover .. configure)": factory[1] - factory[0],
        "reads (first start to last end)": reads[1] - reads[0],
        "provider close, drift": commit[0] - reads[1],
        "  of which provider close": _dur(ev, "provider close (Shutdown, exit, reap)"),
        "commit": commit[1] - commit[0],
        "finish audit row": finish[1] - finish[0],
        "drift counts": _dur(ev, "drift counts"),
        "notifications after the command": _dur(ev, "notifications after the command"),
        "exit (after the audit row)": wall - before_t0 - finish[1],
        "critical path (whole process)": wall,
        "kl process CPU (all threads, not the provider)": doc.get("cpu", 0.0),
    }
    return out


def traced_run(pyz: Path, args: list[str], env: dict[str, str], cwd: Path, out: Path) -> dict[str, float]:
    start = time.monotonic()
    r = subprocess.run([PYTHON, "-I", str(DRIVER), str(pyz), "--", *args], env={**env, "KL_STEPS_OUT": str(out)},
                       cwd=cwd, capture_output=True)
    wall = time.monotonic() - start
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    doc = json.loads(out.read_text())
    return steps_of(doc, doc["t0_monotonic"] - start, wall)


def test_refresh_fixed_costs(benchmark, bench_db, bench_summary, kl_pyz: Path, tmp_path: Path) -> None:
    if not Path(PYTHON).exists():
        pytest.fail(f"{PYTHON} is missing: install Debian's python3", pytrace=False)
    env = clean_env(tmp_path, KL_DATABASE_URL=bench_db)
    subprocess.run([PYTHON, "-I", str(kl_pyz), "state", "import", "small", "-"], input=_state(10), env=env, check=True,
                   capture_output=True)
    args = ["refresh", "small", "-q", "--provider-search-path", str(PLUGIN_CACHE)]
    bare, runs = [], []
    traced_run(kl_pyz, args, env, tmp_path, tmp_path / "steps.json")  # warm-up: extraction, code cache
    for _ in range(ROUNDS):
        start = time.monotonic()
        subprocess.run([PYTHON, "-I", "-c", "pass"], env=env, check=True)
        bare.append(time.monotonic() - start)
        runs.append(traced_run(kl_pyz, args, env, tmp_path, tmp_path / "steps.json"))
    medians = {step: statistics.median(r[step] for r in runs) for step in runs[0]}
    medians = {"bare interpreter (python3 -I -c pass)": statistics.median(bare), **medians}
    benchmark.extra_info.update({k: round(v * 1e3, 1) for k, v in medians.items()})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)  # the figures are in extra_info
    width = max(len(k) for k in medians)
    table = "\n".join(f"  {k:<{width}}  {v * 1e3:7.1f} ms" for k, v in medians.items())
    line = f"refresh fixed costs, 10 instances, medians of {ROUNDS} (ms):\n{table}"
    bench_summary.append(line)
    print("\n" + line)
