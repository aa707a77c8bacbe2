"""What `/metrics` reports about the stored states, read fresh at each scrape.

Counts come from kl's own tables (refresh_runs, current_resource_drift), not from counters kept in
a process: every `kl serve` replica, and one restarted a minute ago, reports the same figures as
`kl status`, whichever process ran the refreshes.
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

_STATES = f"""
SELECT s.name, COALESCE((d.open ->> s.id::text)::bigint, 0) AS open_drift,
       (SELECT extract(epoch FROM max(rr.finished_at)) FROM refresh_runs rr
        WHERE rr.state_id = s.id AND rr.status = 'succeeded') AS last_success
FROM states s CROSS JOIN ({OPEN_BY_STATE}) d(open)
ORDER BY s.name
"""

_RUNS = """
SELECT s.name, rr.status, count(*) AS runs
FROM refresh_runs rr JOIN states s ON s.id = rr.state_id
GROUP BY s.name, rr.status
ORDER BY s.name, rr.status
"""

# Finished runs per state and per bucket: `bucket` is how many bounds lie below the duration, so
# the run counts in every `le` from DURATION_BUCKETS[bucket] on (len: only in +Inf). A running run
# has no duration yet and is left out. width_bucket counts the bounds at or below the duration, so
# a duration equal to a bound (which counts in that bound's `le`) takes one off: a subquery over
# the bounds per run cost more than the rest of the scrape.
_DURATIONS = """
SELECT s.name, x.bucket, count(*) AS runs, sum(x.d) AS seconds
FROM (SELECT y.state_id, y.d, width_bucket(y.d, %(buckets)s::float8[]) - (y.d = ANY(%(buckets)s::float8[]))::int AS bucket
      FROM (SELECT rr.state_id, extract(epoch FROM rr.finished_at - rr.started_at)::float8 AS d
            FROM refresh_runs rr WHERE rr.finished_at IS NOT NULL) y) x
JOIN states s ON s.id = x.state_id
GROUP BY s.name, x.bucket
ORDER BY s.name, x.bucket
"""

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


@dataclass(frozen=True)
class DurationFigures:
    name: str
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
    runs: list[tuple[str, str, int]]  # (state, status, runs)
    durations: list[DurationFigures]
    fleet: FleetFigures
    deliveries: list[tuple[str, str, int]]  # (channel, status, deliveries)
    provider_limits: list[LimitUse]  # fleet-wide limits: not about any state, so never filtered by one
    # Each discovery scope's latest finished run: one with a state's provider config is filtered by
    # that state; one with the config of all states is about no state (counts only, as the limits).
    discoveries: list[ScopeRow]

    def only_states(self, keep: Callable[[str], bool]) -> StoreFigures:
        return StoreFigures([s for s in self.states if keep(s.name)], [r for r in self.runs if keep(r[0])],
                            [d for d in self.durations if keep(d.name)], self.fleet, self.deliveries,
                            self.provider_limits, [d for d in self.discoveries if d.state is None or keep(d.state)])


def store_figures(conn: psycopg.Connection) -> StoreFigures:
    """One consistent read (a REPEATABLE READ snapshot): the gauges and the histogram agree."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cur = conn.cursor(row_factory=dict_row)
        states = [StateFigures(r["name"], r["open_drift"], None if r["last_success"] is None else float(r["last_success"]))
                  for r in cur.execute(_STATES)]
        runs = [(r["name"], r["status"], r["runs"]) for r in cur.execute(_RUNS)]
        rows = cur.execute(_DURATIONS, {"buckets": list(DURATION_BUCKETS)}).fetchall()
        queue = fleet.queue_figures(conn)
        alive = conn.execute(_WORKERS_ALIVE).fetchone()
        deliveries = [(r["name"], r["status"], r["deliveries"]) for r in cur.execute(_DELIVERIES)]
        limits = provider_limits.usage(conn)
        discoveries = discovery_results.scopes(conn)
    figures = FleetFigures(queue["due"], queue["upcoming"], queue["running"], queue["lag_s"] or 0.0,
                           alive[0] if alive else 0)
    return StoreFigures(states, runs, _histograms(rows), figures, deliveries, limits, discoveries)


def _histograms(rows: list[dict[str, Any]]) -> list[DurationFigures]:
    per_state: dict[str, tuple[list[int], list[float]]] = {}
    for r in rows:
        counts, total = per_state.setdefault(r["name"], ([0] * (len(DURATION_BUCKETS) + 1), [0.0]))
        counts[r["bucket"]] += r["runs"]
        total[0] += float(r["seconds"])
    out = []
    for name, (counts, total) in per_state.items():
        cumulative = list(itertools.accumulate(counts))
        out.append(DurationFigures(name, tuple(cumulative[:-1]), cumulative[-1], total[0]))
    return out
