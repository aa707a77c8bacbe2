"""`/metrics` in Prometheus' text format.

Two sources: what the database says about the states (read at each scrape, so every replica of
`kl serve` agrees with `kl status`), and what this process saw (HTTP requests, counted in memory).
Each server owns its counters: two servers in one process (the tests) do not share them.

prometheus-client writes every family but the per-state ones: those are a few samples for each
state (10,000 states: 30,000 lines), and its generic writer spent 25 us a sample on them, so they
are written here in bulk, each family a fixed line pattern with the state name escaped as the
text format asks.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import psycopg
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from kilolock.store.metrics import DURATION_BUCKETS, StateFigures, StoreFigures, store_figures

CONTENT_TYPE = CONTENT_TYPE_LATEST


def _header(name: str, help_text: str) -> str:
    return f"# HELP {name} {help_text}\n# TYPE {name} gauge\n"


_OPEN_DRIFT = _header("kilolock_state_open_drift",
                      "Resource instances with open drift (as kl status and kl drift count them)")
_LAST_SUCCESS = _header("kilolock_state_last_successful_refresh_timestamp_seconds",
                        "When the newest succeeded refresh of the state finished (Unix time)")
_LAST_SUCCEEDED = _header("kilolock_state_last_refresh_succeeded",
                          "1 when the latest finished refresh run of the state succeeded, else 0")


def per_state_text(states: list[StateFigures]) -> bytes:
    """The state-labelled families: a sample of each per state (a state never refreshed has no
    refresh samples, rather than a 1970 or a failure it never had)."""
    labels = ['{state="' + s.name.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') + '"} '
              for s in states]
    drift = [f"kilolock_state_open_drift{label}{s.open_drift}\n" for label, s in zip(labels, states, strict=True)]
    last = [f"kilolock_state_last_successful_refresh_timestamp_seconds{label}{s.last_success!r}\n"
            for label, s in zip(labels, states, strict=True) if s.last_success is not None]
    ok = [f"kilolock_state_last_refresh_succeeded{label}{int(s.last_succeeded)}\n"
          for label, s in zip(labels, states, strict=True) if s.last_succeeded is not None]
    return "".join([_OPEN_DRIFT, *drift, _LAST_SUCCESS, *last, _LAST_SUCCEEDED, *ok]).encode()


class _Fleet(Collector):
    """What the database says about no single state: the fleet's runs, queue, workers, limits,
    notifications and discoveries (a scope with a state's config is filtered by the caller)."""

    def __init__(self, figures: StoreFigures) -> None:
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        figures = self._figures
        durations = HistogramMetricFamily("kilolock_fleet_refresh_duration_seconds",
                                          "Duration of the fleet's finished refresh runs, by outcome", labels=["status"])
        for d in figures.durations:
            buckets = [(_le(b), float(n)) for b, n in zip(DURATION_BUCKETS, d.cumulative, strict=True)]
            buckets.append(("+Inf", float(d.count)))
            durations.add_metric([d.status], buckets, d.total_seconds)
        running = GaugeMetricFamily("kilolock_fleet_refresh_runs_running", "Refresh runs of the fleet in progress now")
        running.add_metric([], figures.running)
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
        yield from (durations, running, queue, lag, workers, deliveries, cap, leased, wanted, holders, found,
                    ok, success)


def _le(bound: float) -> str:
    return repr(float(bound))


class ServerMetrics:
    """What one `kl serve` exposes, and the counters its request handler feeds."""

    def __init__(self, connection: Callable[[], AbstractContextManager[psycopg.Connection]]) -> None:
        self._connection = connection
        # In no registry: each scrape registers them beside that scrape's reading of the database.
        self.requests = Counter("kilolock_http_requests", "HTTP requests answered, by route and status",
                                ["route", "method", "status"], registry=None)
        self.request_seconds = Histogram("kilolock_http_request_duration_seconds", "Time to answer an HTTP request",
                                         ["route"], registry=None)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    def exposition(self, may_read: Callable[[str], bool] | None = None) -> bytes:
        """Everything, or with ``may_read`` the state-labelled series of those states only (the
        process's own series are by route, never by state name)."""
        with self._connection() as conn:
            figures = store_figures(conn)
        if may_read is not None:
            figures = figures.only_states(may_read)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Fleet(figures))
        registry.register(_Own(self))
        return generate_latest(registry) + per_state_text(figures.states)


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
