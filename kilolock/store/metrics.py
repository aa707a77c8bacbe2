"""What `/metrics` reports about the stored states, read fresh at each scrape.

Counts come from kl's own tables (refresh_runs and the figures its triggers keep as runs finish,
current_resource_drift), not from counters kept in a process: every `kl serve` replica, and one
restarted a minute ago, reports the same figures as `kl status`, whichever process ran the refreshes.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from kilolock.store import discovery_results, fleet, provider_limits
from kilolock.store.discovery_results import ScopeRow
from kilolock.store.drift import OPEN_BY_STATE
from kilolock.store.provider_limits import LimitUse

# Upper bounds (seconds) of the refresh-duration histogram: a small state refreshes in well under a
# second, a large one against a slow cloud API in minutes.
DURATION_BUCKETS: tuple[float, ...] = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)

# Per state: what a dashboard or an alert needs state by state, one sample each (a per-state
# histogram was 13 samples a state, most of /metrics at 10,000 states). Each state's last runs are
# kept as its runs finish (refresh_run_last, migration 0030), so the cost follows the states, not
# the history kept. A state's latest finished run is the one `kl status` shows as its last refresh
# once nothing runs.
_STATES = f"""
SELECT s.name, COALESCE((d.open ->> s.id::text)::bigint, 0) AS open_drift,
       extract(epoch FROM l.success_at)::float8 AS last_success, l.status = 'succeeded' AS last_succeeded
FROM states s LEFT JOIN refresh_run_last l ON l.state_id = s.id CROSS JOIN ({OPEN_BY_STATE}) d(open)
ORDER BY s.name
"""

# The fleet's finished runs by outcome and bucket, summed over the states' counts (refresh_run_durations,
# kept as runs finish: a scrape costs the same however many runs were ever recorded). `bucket` is the
# first of DURATION_BUCKETS at or above the duration (it counts in that `le` and every later one;
# len: only in +Inf); those bounds are also the migration's kl_refresh_duration_bucket.
_DURATIONS = """
SELECT status, bucket, sum(runs)::bigint AS runs, extract(epoch FROM sum(took))::float8 AS seconds
FROM refresh_run_durations
GROUP BY 1, 2
ORDER BY 1, 2
"""

_RUNNING = "SELECT count(*) FROM refresh_runs WHERE status = 'running'"

_WORKERS_ALIVE = """
SELECT count(*) FROM fleet_workers
WHERE status <> 'stopped' AND heartbeat_at + make_interval(secs => lease_s) >= now()
"""

_DELIVERIES = """
SELECT c.name, d.status, count(*) AS deliveries
FROM notify_deliveries d JOIN notify_channels c ON c.id = d.channel_id
GROUP BY c.name, d.status
ORDER BY c.name, d.status
"""


@dataclass(frozen=True)
class StateFigures:
    name: str
    open_drift: int
    last_success: float | None  # Unix seconds of the newest succeeded run's finish
    last_succeeded: bool | None  # whether the latest finished run succeeded (None: no run finished)


@dataclass(frozen=True)
class DurationFigures:
    status: str  # the runs' outcome: succeeded, failed, cancelled
    cumulative: tuple[int, ...]  # runs at or under each of DURATION_BUCKETS
    count: int
    total_seconds: float


@dataclass(frozen=True)
class FleetFigures:
    due: int  # queued jobs whose time has come
    upcoming: int  # queued for later (jitter, a requeue's delay)
    running: int
    lag_s: float  # how long the oldest due job has waited (0: none waits)
    workers_alive: int


@dataclass(frozen=True)
class StoreFigures:
    states: list[StateFigures]
    # The fleet's runs, never filtered by a principal's grants: counts about no state, as the
    # fleet's queue gauges (a series per state is what the grants hide).
    running: int
    durations: list[DurationFigures]
    fleet: FleetFigures
    deliveries: list[tuple[str, str, int]]  # (channel, status, deliveries)
    provider_limits: list[LimitUse]  # fleet-wide limits: not about any state, so never filtered by one
    # Each discovery scope's latest finished run: one with a state's provider config is filtered by
    # that state; one with the config of all states is about no state (counts only, as the limits).
    discoveries: list[ScopeRow]

    def only_states(self, keep: Callable[[str], bool]) -> StoreFigures:
        return StoreFigures([s for s in self.states if keep(s.name)], self.running, self.durations, self.fleet,
                            self.deliveries,
                            self.provider_limits, [d for d in self.discoveries if d.state is None or keep(d.state)])


def store_figures(conn: psycopg.Connection) -> StoreFigures:
    """One consistent read (a REPEATABLE READ snapshot): the gauges and the histogram agree."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        # A pass over every state's rows puts the estimate past jit_above_cost from about 10,000
        # states on, and compiling would cost more than the statement itself.
        conn.execute("SET LOCAL jit = off")
        cur = conn.cursor(row_factory=dict_row)
        states = [StateFigures(*r) for r in conn.execute(_STATES).fetchall()]
        running = conn.execute(_RUNNING).fetchone()
        rows = cur.execute(_DURATIONS).fetchall()
        queue = fleet.queue_figures(conn)
        alive = conn.execute(_WORKERS_ALIVE).fetchone()
        deliveries = [(r["name"], r["status"], r["deliveries"]) for r in cur.execute(_DELIVERIES)]
        limits = provider_limits.usage(conn)
        discoveries = discovery_results.scopes(conn)
    figures = FleetFigures(queue["due"], queue["upcoming"], queue["running"], queue["lag_s"] or 0.0,
                           alive[0] if alive else 0)
    return StoreFigures(states, running[0] if running else 0, _histograms(rows), figures, deliveries, limits, discoveries)


def _histograms(rows: list[dict[str, Any]]) -> list[DurationFigures]:
    per_status: dict[str, tuple[list[int], list[float]]] = {}
    for r in rows:
        counts, total = per_status.setdefault(r["status"], ([0] * (len(DURATION_BUCKETS) + 1), [0.0]))
        counts[r["bucket"]] += r["runs"]
        total[0] += float(r["seconds"])
    out = []
    for status, (counts, total) in per_status.items():
        cumulative = list(itertools.accumulate(counts))
        out.append(DurationFigures(status, tuple(cumulative[:-1]), cumulative[-1], total[0]))
    return out
