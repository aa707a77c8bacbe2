"""`/metrics` in Prometheus' text format, written by prometheus-client (never formatted by hand).

Two sources: what the database says about the states (read at each scrape by ``StoreCollector``,
so every replica of `kl serve` agrees with `kl status`), and what this process saw (HTTP requests,
counted in memory). Each server owns its registry: two servers in one process (the tests) do not
share counters.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import psycopg
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from kilolock.store.metrics import DURATION_BUCKETS, store_figures

CONTENT_TYPE = CONTENT_TYPE_LATEST


class StoreCollector(Collector):
    """``may_read`` (a principal's grants) keeps only the states it may read: a series labelled
    with a state name tells its drift and refresh history."""

    def __init__(self, connection: Callable[[], AbstractContextManager[psycopg.Connection]],
                 may_read: Callable[[str], bool] | None = None) -> None:
        self._connection = connection
        self._may_read = may_read

    def collect(self) -> Iterator[Metric]:
        with self._connection() as conn:
            figures = store_figures(conn)
        if self._may_read is not None:
            figures = figures.only_states(self._may_read)
        drift = GaugeMetricFamily("kilolock_state_open_drift",
                                  "Resource instances with open drift (as kl status and kl drift count them)",
                                  labels=["state"])
        last = GaugeMetricFamily("kilolock_state_last_successful_refresh_timestamp_seconds",
                                 "When the newest succeeded refresh of the state finished (Unix time)",
                                 labels=["state"])
        for s in figures.states:
            drift.add_metric([s.name], s.open_drift)
            if s.last_success is not None:  # never refreshed: no sample, rather than a 1970 one
                last.add_metric([s.name], s.last_success)
        runs = CounterMetricFamily("kilolock_refresh_runs", "Refresh runs recorded, by outcome",
                                   labels=["state", "status"])
        for name, status, count in figures.runs:
            runs.add_metric([name, status], count)
        durations = HistogramMetricFamily("kilolock_refresh_duration_seconds",
                                          "Duration of finished refresh runs", labels=["state"])
        for d in figures.durations:
            buckets = [(_le(b), float(n)) for b, n in zip(DURATION_BUCKETS, d.cumulative, strict=True)]
            buckets.append(("+Inf", float(d.count)))
            durations.add_metric([d.name], buckets, d.total_seconds)
        q = figures.fleet
        queue = GaugeMetricFamily("kilolock_fleet_queue_jobs", "Fleet refresh jobs by queue position", labels=["status"])
        for status, n in (("due", q.due), ("upcoming", q.upcoming), ("running", q.running)):
            queue.add_metric([status], n)
        lag = GaugeMetricFamily("kilolock_fleet_schedule_lag_seconds",
                                "How long the oldest due refresh job has waited for a worker (0: none waits)")
        lag.add_metric([], q.lag_s)
        workers = GaugeMetricFamily("kilolock_fleet_workers_alive", "Workers whose heartbeat is within their lease")
        workers.add_metric([], q.workers_alive)
        deliveries = GaugeMetricFamily("kilolock_notify_deliveries",
                                       "Notification deliveries kept in the delivery log, by channel and outcome",
                                       labels=["channel", "status"])
        for channel, status, n in figures.deliveries:
            deliveries.add_metric([channel, status], n)
        # Fleet-wide provider limits, by provider: the cap and what all processes lease of it now.
        # Which process holds how many is `kl fleet status`'s: a holder (host:pid) label would add
        # series with every worker restart.
        cap = GaugeMetricFamily("kilolock_fleet_provider_limit_max_in_flight",
                                "Fleet-wide cap on a provider's calls in flight (kl provider limit)",
                                labels=["source", "alias"])
        leased = GaugeMetricFamily("kilolock_fleet_provider_slots_leased",
                                   "Slots of a provider limit leased now by all kl processes together",
                                   labels=["source", "alias"])
        wanted = GaugeMetricFamily("kilolock_fleet_provider_slots_wanted",
                                   "Provider calls in flight or waiting for a slot in all kl processes together",
                                   labels=["source", "alias"])
        holders = GaugeMetricFamily("kilolock_fleet_provider_slot_holders",
                                    "kl processes holding or waiting for slots of a provider limit now",
                                    labels=["source", "alias"])
        for lim in figures.provider_limits:
            labels = [lim.source, lim.alias]
            cap.add_metric(labels, lim.max_in_flight)
            leased.add_metric(labels, lim.held)
            wanted.add_metric(labels, lim.wanted)
            holders.add_metric(labels, lim.holders)
        # Discovery, per scope (config: the list config's short hash): what its latest finished run
        # found, whether that run succeeded, and when one last did.
        scope = ["source", "alias", "state", "type", "config"]
        found = GaugeMetricFamily("kilolock_discovery_objects",
                                  "Objects the latest finished discovery run of a scope listed, by match",
                                  labels=[*scope, "match"])
        ok = GaugeMetricFamily("kilolock_discovery_last_run_succeeded",
                               "1 when the latest finished discovery run of a scope succeeded, else 0", labels=scope)
        success = GaugeMetricFamily("kilolock_discovery_last_success_timestamp_seconds",
                                    "When a discovery run of the scope last succeeded (Unix time)", labels=scope)
        for sc in figures.discoveries:
            labels = [sc.source, sc.alias, sc.state or "", sc.type, sc.config]
            ok.add_metric(labels, 1.0 if sc.status == "succeeded" else 0.0)
            if sc.last_success is not None:
                success.add_metric(labels, sc.last_success)
            if sc.status == "succeeded":
                for match, listed in (("managed", sc.managed), ("unmanaged", sc.unmanaged),
                                      ("managed twice", sc.managed_twice)):
                    found.add_metric([*labels, match], listed or 0)
        yield from (drift, last, runs, durations, queue, lag, workers, deliveries, cap, leased, wanted, holders, found,
                    ok, success)


def _le(bound: float) -> str:
    return repr(float(bound))


class ServerMetrics:
    """The registry one `kl serve` exposes, and the counters its request handler feeds."""

    def __init__(self, connection: Callable[[], AbstractContextManager[psycopg.Connection]]) -> None:
        self._connection = connection
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StoreCollector(connection))
        self.requests = Counter("kilolock_http_requests", "HTTP requests answered, by route and status",
                                ["route", "method", "status"], registry=self.registry)
        self.request_seconds = Histogram("kilolock_http_request_duration_seconds", "Time to answer an HTTP request",
                                         ["route"], registry=self.registry)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def exposition(self, may_read: Callable[[str], bool] | None = None) -> bytes:
        """Everything, or with ``may_read`` the state-labelled series of those states only (the
        process's own series are by route, never by state name)."""
        if may_read is None:
            return generate_latest(self.registry)
        scoped = CollectorRegistry(auto_describe=False)
        scoped.register(StoreCollector(self._connection, may_read))
        scoped.register(_Own(self))
        return generate_latest(scoped)


class _Own(Collector):
    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self._metrics.requests.collect()
        yield from self._metrics.request_seconds.collect()


def route_of(path: str) -> str:
    """A request path as a bounded label: state names would make one series per state and client."""
    if path.startswith("/states/"):
        return "/states/{name}"
    if path.startswith("/api/v1/states/"):
        for suffix in ("/drift", "/versions"):
            if path.endswith(suffix):
                return "/api/v1/states/{name}" + suffix
        return "other"
    if path in ("/api/v1/states", "/metrics", "/healthz"):
        return path
    if path.startswith("/ui/static/"):
        return "/ui/static/{file}"
    if path in ("/ui/", "/ui/state", "/ui/diff", "/ui/resource", "/ui/search"):
        return path
    return "other"
