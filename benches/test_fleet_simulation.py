"""A fleet under a provider's rate limit, directly on PostgreSQL and through PgBouncer: WORKERS
`kl worker` processes (--parallel-states 4) refresh STATES states of a fake provider whose every
read takes LATENCY seconds, under one fleet-wide limit of LIMIT calls in flight (`kl provider
limit`). Nothing else bounds the fleet (the workers could run 4 x WORKERS states at once), so the
limit binds: the fleet can read at most LIMIT / LATENCY instances a second, its ceiling.

Each connection mode (direct; PgBouncer in transaction mode with POOL server connections, the
workers told `kl_pooler=transaction`) runs on one database of the fleet, in turn:

- a round of every state at once (`kl schedule run-now`: capacity does not suffice): reads a
  second from the first claim to the last success against the ceiling (gate: CEILING_GATE of it;
  through PgBouncer, POOLED_GATE of the direct rate), refreshes a minute, how late each refresh
  started after it was due (p50/p99: a backlog's lag grows with its size over the throughput),
  PostgreSQL's CPU (its processes' utime + stime from /proc), the WAL it wrote and its relations'
  growth after VACUUM per refresh (every read finds what Terraform's version
  holds, private data included, so each refresh records a confirmation without a document), and
  the connections each worker held (pg_stat_activity, or PgBouncer's SHOW CLIENTS);
- a schedule with jitter over half the states while capacity suffices (about 60% of it): how
  late each refresh started after its due time (the schedule's time plus the state's jitter
  offset, from fleet_jobs and refresh_runs: the job's created_at is when the schedule fired), p50
  and p99; gate: p99 within LAG_GATE_POLLS worker poll intervals.

Sizes drawn like a fleet's (most states small, a few larger). Default: 400 states, 8 workers;
KL_BENCH_QUICK=1 (CI): 80 states, 4 workers. KL_BENCH_FLEET=full: the issue's fleet, seeded with
tests/kit/fleetseed.py (10,000 states, about 1,000,000 instances; KL_BENCH_FLEET_STATES and
KL_BENCH_FLEET_WORKERS scale it down, to 20 workers by default), no round of every state (a
million reads), but schedules from 5 minutes to a day with jitter (FULL_SCHEDULES) run for
KL_BENCH_FLEET_SECONDS (900) against a faster provider (FULL_LATENCY, FULL_LIMIT), workers
polling every 2 s as by default, on a cluster of its own (max_connections FULL_MAX_CONNECTIONS): throughput, lag (a refresh not started by the end counts as late
as the end), CPU, WAL and connections, reported, not gated. `-k direct` or `-k pgbouncer` runs
one mode; KL_BENCH_FLEET_POOL sets PgBouncer's pool (POOL). Figures and sizing advice: docs/operations/sizing.md."""
from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from kit import fleetseed, pg, pgbouncer
from kit.faults import FAKE_SOURCE, fake_state, install_fake
from kit.fleet import POLL, own_cluster, q, restart, start_worker, stop, wait_for
from kit.kl import kl_cmd, kl_env

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
FULL = os.environ.get("KL_BENCH_FLEET") == "full"
if FULL:
    STATES = int(os.environ.get("KL_BENCH_FLEET_STATES", "10000"))
    WORKERS = int(os.environ.get("KL_BENCH_FLEET_WORKERS", "20"))
else:
    STATES, WORKERS = (80, 4) if QUICK else (400, 8)
FULL_SECONDS = float(os.environ.get("KL_BENCH_FLEET_SECONDS", "900"))
FULL_LATENCY, FULL_LIMIT = 0.05, 32  # a faster provider: 640 reads a second
FULL_MAX_CONNECTIONS = 400  # the full size's own cluster
LATENCY = FULL_LATENCY if FULL else 0.3  # seconds per read
LIMIT = FULL_LIMIT if FULL else 8  # calls in flight, fleet-wide
CEILING = LIMIT / LATENCY  # reads a second
POOL = int(os.environ.get("KL_BENCH_FLEET_POOL", "6"))  # PgBouncer's default_pool_size: server connections for every client
READ_PRIVATE = fleetseed.FAKE_PRIVATE  # the private data the states hold, which the fake's reads keep (FAKE_READ_PRIVATE=keep)
POLL_S = 2.0 if FULL else float(POLL.removesuffix("ms")) / 1000
# Measured in quick mode (80 states) on the shared 2-core machine, load 5-10: 86-92% of the ceiling.
CEILING_GATE = 0.75
# Of the direct connections' rate: measured 88-103% in quick mode (load 6-30); a gate nearer would flake.
POOLED_GATE = 0.75
# Lag p99 while capacity suffices, in poll intervals: measured 1-2 polls (0.2-0.34 s) in quick mode, load 6-9.
LAG_GATE_POLLS = 10
# The lag phase: half the states (sim/a/...), their runs spread over JITTER_S: about 60% of the capacity.
JITTER_S = 14.0 if QUICK else 60.0
# Full size, by the state's last digit: (digits, every, jitter). Most states daily, a tenth every 5
# minutes, as a platform team's fleet: about 240 refreshes a minute at 10,000 states.
FULL_SCHEDULES = (("0", "5m", "5m"), ("12", "1h", "1h"), ("3456789", "1d", "1d"))


def _sizes(n: int) -> list[int]:
    """Instances per state: most 1-5, a tenth 10-20 (seeded: every run the same fleet)."""
    rng = random.Random(7)
    return [rng.randint(10, 20) if rng.random() < 0.1 else rng.randint(1, 5) for _ in range(n)]


def _add_states(db_url: str, cache: Path, sizes: list[int]) -> list[str]:
    """States sim/a/NNNNN and sim/b/NNNNN, alternately (the lag phase schedules sim/a/*)."""
    from kilolock import tfstate
    from kilolock.store import settings, states, writes

    names = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        for n, size in enumerate(sizes):
            name = f"sim/{'ab'[n % 2]}/s{n:05d}"
            doc = json.loads(fake_state(["fake_slow"] * size, lineage=f"lineage-{name}"))
            for r in doc["resources"]:  # as the fake's reads answer: a refresh finds nothing new, as a real fleet's mostly do
                r["instances"][0].update(private=READ_PRIVATE, sensitive_attributes=[[{"type": "get_attr", "value": "secret"}]])
            raw = json.dumps(doc).encode()
            writes.store_document(conn, name, tfstate.parse_state(raw), raw, source="import", actor="bench")
            settings.update(conn, states.state_id(conn, name), settings.Changes({"provider_search_paths": [str(cache)]}),
                            "bench")
            names.append(name)
    return names


@dataclass
class Fleet:
    url: str  # direct
    server: str  # the server's postgres database
    cache: Path
    instances: dict[str, int]  # per state
    events: Path
    rates: dict[str, float] = field(default_factory=dict)  # reads a second of each mode's round


@pytest.fixture(scope="module")
def fleet(pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One fleet for both modes: the states, their first observations (a first round, in the first
    mode to run) and the fake provider under its limit."""
    from kilolock.store.migrate import apply_migrations

    tmp = tmp_path_factory.mktemp("fleet")
    cache = install_fake(tmp, tmp / "events.log", FAKE_SLOW_SECONDS=str(LATENCY), FAKE_READ_PRIVATE="keep")
    with ExitStack() as stack:
        if FULL:
            # 20 workers hold about 160 connections directly: over PostgreSQL's default of 100.
            cluster, url = stack.enter_context(own_cluster("kl-sim-"))
            q(url, f"ALTER SYSTEM SET max_connections = {FULL_MAX_CONNECTIONS}")
            restart(cluster)
            server = cluster.url("postgres")
        else:
            url = stack.enter_context(pg.fresh_database(pg_server, prefix="kl_bench_sim_"))
            with psycopg.connect(url, autocommit=True) as conn:
                apply_migrations(conn)
            server = pg_server
        if FULL:
            made = fleetseed.seed(url, STATES, prefix="sim", document=fleetseed.fake_document, search_paths=[str(cache)])
            print(f"\nfleet of {made['states']} states, {made['instances']} instances: seeded in "
                  f"{made['templates_s'] + made['clone_s']:.0f} s")
            instances = {str(r[0]): int(r[1]) for r in q(url, """
                SELECT s.name, count(*) FROM states s JOIN resources r ON r.state_id = s.id AND r.delete_serial IS NULL
                GROUP BY s.name""")}
        else:
            sizes = _sizes(STATES)
            instances = dict(zip(_add_states(url, cache, sizes), sizes, strict=True))
        r = subprocess.run(kl_cmd("provider", "limit", FAKE_SOURCE, "--max-in-flight", str(LIMIT)),
                           env=kl_env(KL_DATABASE_URL=url), capture_output=True)
        assert r.returncode == 0, r.stderr.decode()
        yield Fleet(url, server, cache, instances, tmp / "events.log")


# ---------------------------------------------------------------- what PostgreSQL spent

def _ticks(pid: int) -> tuple[int, int, int]:
    """(parent pid, own utime + stime, reaped children's cutime + cstime) of PID, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def _server_cpu_s(url: str) -> float | None:
    """CPU seconds PostgreSQL's processes have used: the postmaster's own and its reaped children's
    (a backend that exited), plus every live child's. None when the server's processes are not
    this machine's to read."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:  # its backend is the postmaster's child while it is open
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            postmaster, _, _ = _ticks(int(row[0]))
        _, own, reaped = _ticks(postmaster)
        total = own + reaped
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    parent, used, _ = _ticks(int(entry.name))
                except (OSError, IndexError, ValueError):
                    continue  # gone meanwhile
                if parent == postmaster:
                    total += used
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def _sizes_after_vacuum(db_url: str) -> dict[str, int]:
    """Bytes of every table (its indexes and TOAST included), after VACUUM."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("VACUUM")
        return {str(r[0]): int(r[1]) for r in conn.execute("""
            SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind = 'r'""")}


def _wal_lsn(db_url: str) -> str:
    return str(q(db_url, "SELECT pg_current_wal_lsn()::text")[0][0])


def _wal_by_kind(db_url: str, start: str, end: str) -> str:
    """What the WAL between START and END holds, by resource manager, with its full-page images: the
    three biggest (pg_walinspect, where the server has it)."""
    try:
        q(db_url, "CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except psycopg.Error:
        return "pg_walinspect unavailable"
    rows = q(db_url, """SELECT "resource_manager/record_type", combined_size, fpi_size
                        FROM pg_get_wal_stats(%s::pg_lsn, %s::pg_lsn) ORDER BY combined_size DESC LIMIT 3""", (start, end))
    return ", ".join(f"{r[0]} {int(r[1]) // 1024} KiB ({int(r[2]) // 1024} KiB full pages)" for r in rows)


# ---------------------------------------------------------------- connections

@dataclass
class Mode:
    name: str
    url: str  # what the workers and the bench's kl commands use
    # worker pids -> (their client connections, server connections, clients waiting for a server connection)
    connections: Callable[[list[int]], tuple[int, int, int]]
    most: tuple[int, int, int] = (0, 0, 0)

    def sample(self, pids: list[int]) -> None:
        now = self.connections(pids)
        self.most = (max(self.most[0], now[0]), max(self.most[1], now[1]), max(self.most[2], now[2]))


def _direct_connections(url: str) -> Callable[[list[int]], tuple[int, int, int]]:
    def count(pids: list[int]) -> tuple[int, int, int]:
        n = int(q(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND application_name = 'kilolock'")[0][0])
        return n, n, 0
    return count


def _pooled_connections(url: str, template: str) -> Callable[[list[int]], tuple[int, int, int]]:
    """The workers' clients as PgBouncer lists them (its console, SHOW CLIENTS: a unix socket
    client's pid), the server connections PgBouncer holds to the database, and its clients waiting
    for one (SHOW POOLS)."""
    console = template.format(dbname="pgbouncer")
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]

    def count(pids: list[int]) -> tuple[int, int, int]:
        with psycopg.connect(console, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            cur = conn.execute("SHOW CLIENTS")
            assert cur.description is not None
            col = [d.name for d in cur.description].index("remote_pid")
            clients = sum(1 for row in cur.fetchall() if row[col] in pids)
            cur = conn.execute("SHOW POOLS")
            assert cur.description is not None
            names = [d.name for d in cur.description]
            waiting = sum(int(row[names.index("cl_waiting")]) for row in cur.fetchall() if row[names.index("database")] == dbname)
        servers = int(q(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                             "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")[0][0])
        return clients, servers, waiting
    return count


@pytest.fixture(params=["direct", "pgbouncer"])
def mode(request: pytest.FixtureRequest, fleet: Fleet) -> Iterator[Mode]:
    if request.param == "direct":
        yield Mode("direct", fleet.url, _direct_connections(fleet.url))
        return
    pgbouncer.require()
    with pgbouncer.pgbouncer(fleet.server, pool_size=POOL) as template:
        dbname = psycopg.conninfo.conninfo_to_dict(fleet.url)["dbname"]
        yield Mode(f"PgBouncer (transaction, pool {POOL})", template.format(dbname=dbname) + " kl_pooler=transaction",
                   _pooled_connections(fleet.url, template))


# ---------------------------------------------------------------- lag

def _lags(url: str, firsts: dict[int, datetime], end: datetime) -> list[float]:
    """Seconds from each job's due time to its refresh's start, for the jobs of the schedules in
    FIRSTS (id: its first time) due by END; a refresh not started by END counts as started at END.
    Due: the grid time the schedule fired for (it fires at a worker's poll, at or after that time:
    the job's created_at) plus the state's jitter offset (due_at - created_at)."""
    every = {int(r[0]): float(r[1]) for r in q(url, "SELECT id, every_s FROM fleet_schedules WHERE id = ANY(%s)",
                                                (list(firsts),))}
    lags = []
    for schedule, created, offset, started in q(url, """
            SELECT j.schedule_id, j.created_at, j.due_at - j.created_at, r.started_at
            FROM fleet_jobs j LEFT JOIN refresh_runs r ON r.id = j.refresh_run_id
            WHERE j.schedule_id = ANY(%s)""", (list(firsts),)):
        period = timedelta(seconds=every[schedule])
        grid = firsts[schedule] + ((created - firsts[schedule]) // period) * period
        due = grid + offset
        if due <= end:
            lags.append(((started if started is not None and started < end else end) - due).total_seconds())
    return lags


def _percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99); the nearest-rank p99 of fewer than 100 values is the largest but one or the largest."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]


def _schedule(fleet: Fleet, mode: Mode, glob: str, every: str, jitter: str) -> tuple[int, datetime]:
    """`kl schedule set`: (its id, its first time)."""
    r = subprocess.run(kl_cmd("schedule", "set", "--states", glob, "--every", every, "--jitter", jitter),
                       env=kl_env(KL_DATABASE_URL=mode.url), capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    row = q(fleet.url, "SELECT id, next_run_at FROM fleet_schedules WHERE states_glob = %s AND NOT paused ORDER BY id DESC LIMIT 1",
            (glob,))[0]
    return int(row[0]), row[1]


# ---------------------------------------------------------------- the simulation

def _run_now(fleet: Fleet, mode: Mode, *globs: str) -> datetime:
    """`kl schedule run-now` of GLOBS; when the jobs were queued, by the server's clock."""
    since: datetime = q(fleet.url, "SELECT now()")[0][0]
    for glob in globs:
        r = subprocess.run(kl_cmd("schedule", "run-now", "--states", glob), env=kl_env(KL_DATABASE_URL=mode.url),
                           capture_output=True)
        assert r.returncode == 0, r.stderr.decode()
    return since


def _succeeded_since(url: str, since: datetime) -> int:
    return int(q(url, "SELECT count(*) FROM fleet_jobs WHERE status = 'succeeded' AND created_at >= %s", (since,))[0][0])


def test_a_fleet_reads_at_its_provider_limit(fleet: Fleet, mode: Mode, tmp_path: Path, bench_summary: list[str]) -> None:
    url = fleet.url
    extra = ("--poll", f"{POLL_S:g}s", "--lease", "30s") if FULL else ()
    workers = [start_worker(mode.url, f"sim-{n}", "--parallel-states", "4", *extra, log=tmp_path / f"w{n}.log")
               for n in range(WORKERS)]
    pids = [w.pid for w in workers]
    lines: list[str] = []
    try:
        if FULL:
            lines += _scheduled_fleet(fleet, mode, pids)
        else:
            lines += _round_of_every_state(fleet, mode, pids)
            lines += _lag_while_capacity_suffices(fleet, mode)
    finally:
        for w in workers:  # all at once: each drains its runs for up to its grace period
            w.send_signal(signal.SIGTERM)
        outputs = [stop(w, timeout=180) for w in workers]
        q(url, "UPDATE fleet_schedules SET paused = true")
    assert all(code == 0 for code, _ in outputs), [(tmp_path / f"w{n}.log").read_text()[-2000:] for n in range(WORKERS)]
    bench_summary.extend(lines)
    print("\n" + "\n".join(lines))


def _round_of_every_state(fleet: Fleet, mode: Mode, pids: list[int]) -> list[str]:
    url = fleet.url
    if not q(url, "SELECT 1 FROM fleet_jobs LIMIT 1"):
        # A first round: the first observation of each state, providers warm in every worker.
        since = _run_now(fleet, mode, "sim/**")
        wait_for("the first round", lambda: _succeeded_since(url, since) == STATES, timeout=3600, every=1.0)
    else:
        # The states were observed in the other mode's round: warm this mode's workers' providers
        # only, with a state for each of their slots (states s00000-s00009, s00010-s00019, ...).
        _run_now(fleet, mode, *(f"sim/*/s000{k}?" for k in range(-(-4 * WORKERS // 10))))
        wait_for("the warm-up", lambda: not q(url, "SELECT 1 FROM fleet_jobs WHERE status IN ('queued', 'running')"),
                 timeout=600, every=0.5)
    size0 = _sizes_after_vacuum(url)
    wal0 = _wal_lsn(url)
    cpu0 = _server_cpu_s(url)
    since = _run_now(fleet, mode, "sim/**")

    def done() -> bool:
        mode.sample(pids)
        return _succeeded_since(url, since) == STATES
    wait_for("the measured round", done, timeout=3600, every=0.5)
    cpu1 = _server_cpu_s(url)
    first, last, failed = q(url, """
        SELECT min(claimed_at), max(finished_at), count(*) FILTER (WHERE status <> 'succeeded')
        FROM fleet_jobs WHERE created_at >= %s""", (since,))[0]
    lags = [float(r[0]) for r in q(url, """
        SELECT extract(epoch FROM r.started_at - j.due_at) FROM fleet_jobs j JOIN refresh_runs r ON r.id = j.refresh_run_id
        WHERE j.created_at >= %s""", (since,))]
    wal1 = _wal_lsn(url)
    size1 = _sizes_after_vacuum(url)
    wal_bytes = int(q(url, "SELECT %s::pg_lsn - %s::pg_lsn", (wal1, wal0))[0][0])
    wal_kinds = _wal_by_kind(url, wal0, wal1)
    assert failed == 0
    took = (last - first).total_seconds()
    reads = sum(fleet.instances.values())
    rate = reads / took
    fleet.rates[mode.name] = rate
    grown = (sum(size1.values()) - sum(size0.values())) / STATES
    growers = sorted(((size1[t] - size0.get(t, 0), t) for t in size1), reverse=True)[:3]
    p50, p99 = _percentiles(lags)
    cpu = f"{(cpu1 - cpu0) / STATES * 1000:.1f} ms" if cpu0 is not None and cpu1 is not None else "n/a"
    clients, servers, waiting = mode.most
    lines = [
        (f"fleet simulation, {mode.name}: {STATES} states ({reads} reads of {LATENCY:g} s), {WORKERS} workers x 4 states, "
        f"limit {LIMIT} in flight, every state at once: {took:.1f} s, {rate:.1f} reads/s against a ceiling of {CEILING:.1f} "
        f"({rate / CEILING:.0%}, gate {CEILING_GATE:.0%}), {STATES / took * 60:.0f} refreshes/min; lag (start - due) "
        f"p50 {p50:.1f} s, p99 {p99:.1f} s (a backlog of {STATES}); per unchanged refresh: PostgreSQL CPU {cpu}, "
        f"relations +{grown:.0f} B after VACUUM, WAL {wal_bytes / STATES:.0f} B; "
        f"connections: {clients / WORKERS:.1f} a worker (most at once), {servers} to the server, "
         f"{waiting} clients waiting for one at most"),
        f"fleet simulation, {mode.name}: grew most: " + ", ".join(f"{t} +{b // 1024} KiB" for b, t in growers)
        + f"; WAL of the round: {wal_kinds}",
    ]
    assert rate >= CEILING_GATE * CEILING, f"{mode.name}: the fleet read {rate:.1f}/s against a ceiling of {CEILING:.1f}/s"
    direct = fleet.rates.get("direct")
    if mode.name != "direct" and direct is not None:
        lines.append(f"fleet simulation: through PgBouncer {rate / direct:.0%} of the direct rate (gate {POOLED_GATE:.0%})")
        assert rate >= POOLED_GATE * direct, f"through PgBouncer {rate:.1f} reads/s, directly {direct:.1f}"
    return lines


def _lag_while_capacity_suffices(fleet: Fleet, mode: Mode) -> list[str]:
    """Half the states on a schedule whose jitter spreads them over JITTER_S (it fires once here)."""
    url = fleet.url
    q(url, "UPDATE fleet_schedules SET paused = true")
    scheduled = [n for n in fleet.instances if n.startswith("sim/a/")]
    schedule, first = _schedule(fleet, mode, "sim/a/*", "1h", f"{JITTER_S:g}s")
    wait_for("the scheduled refreshes", lambda: int(q(
        url, "SELECT count(*) FROM fleet_jobs WHERE schedule_id = %s AND status = 'succeeded'", (schedule,))[0][0])
        == len(scheduled), timeout=600, every=0.5)
    lags = _lags(url, {schedule: first}, q(url, "SELECT now()")[0][0])
    assert len(lags) == len(scheduled)
    demand = sum(fleet.instances[n] for n in scheduled) / JITTER_S
    p50, p99 = _percentiles(lags)
    gate = LAG_GATE_POLLS * POLL_S
    line = (f"fleet simulation, {mode.name}: {len(scheduled)} states scheduled with {JITTER_S:g} s of jitter "
            f"({demand / CEILING:.0%} of the ceiling): lag p50 {p50:.2f} s, p99 {p99:.2f} s, most {max(lags):.2f} s "
            f"(gate p99 <= {gate:g} s: {LAG_GATE_POLLS} polls of {POLL_S:g} s)")
    assert p99 <= gate, line
    return [line]


def _scheduled_fleet(fleet: Fleet, mode: Mode, pids: list[int]) -> list[str]:
    """The full size: FULL_SCHEDULES for FULL_SECONDS; what the fleet did, and how late."""
    url = fleet.url
    q(url, "UPDATE fleet_schedules SET paused = true")
    cpu0, wal0 = _server_cpu_s(url), _wal_lsn(url)
    start = q(url, "SELECT now()")[0][0]
    firsts = dict(_schedule(fleet, mode, f"sim/*/*{d}", every, jitter)
                  for digits, every, jitter in FULL_SCHEDULES for d in digits)
    deadline = time.monotonic() + FULL_SECONDS
    while time.monotonic() < deadline:
        mode.sample(pids)
        time.sleep(5)
    end = q(url, "SELECT now()")[0][0]
    cpu1, wal1 = _server_cpu_s(url), _wal_lsn(url)
    done = q(url, """SELECT count(*), coalesce(sum(r.resources_checked), 0), count(*) FILTER (WHERE r.status <> 'succeeded')
                     FROM fleet_jobs f JOIN refresh_runs r ON r.id = f.refresh_run_id
                     WHERE f.schedule_id = ANY(%s) AND r.finished_at <= %s""", (list(firsts), end))[0]
    runs, reads, failed = int(done[0]), int(done[1]), int(done[2])
    lags = _lags(url, firsts, end)
    p50, p99 = _percentiles(lags) if lags else (0.0, 0.0)
    took = (end - start).total_seconds()
    wal_bytes = int(q(url, "SELECT %s::pg_lsn - %s::pg_lsn", (wal1, wal0))[0][0])
    cpu = f"{(cpu1 - cpu0) / max(1, runs) * 1000:.1f} ms" if cpu0 is not None and cpu1 is not None else "n/a"
    clients, servers, waiting = mode.most
    line = (f"fleet simulation, {mode.name}, full: {STATES} states ({sum(fleet.instances.values())} instances), {WORKERS} "
            f"workers x 4 states, limit {LIMIT} of {LATENCY:g} s reads, schedules "
            + ", ".join(f"{every}~{jitter}" for _, every, jitter in FULL_SCHEDULES)
            + f", {took:.0f} s: {runs} refreshes ({runs / took * 60:.0f}/min, {failed} failed), {reads / took:.1f} reads/s "
            f"(ceiling {CEILING:.0f}); lag over {len(lags)} due: p50 {p50:.1f} s, p99 {p99:.1f} s, most {max(lags, default=0):.1f} s; "
            f"per refresh: PostgreSQL CPU {cpu}, WAL {wal_bytes / max(1, runs):.0f} B; connections: {clients / WORKERS:.1f} a worker, "
            f"{servers} to the server, {waiting} clients waiting for one at most")
    return [line]

