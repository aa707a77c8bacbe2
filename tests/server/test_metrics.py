"""/metrics: prometheus-client's own parser reads it, and its figures are the ones `kl status` and
`kl runs` give for the same states (real refreshes with the real null provider)."""
from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kilolock.server.auth import Authenticator
from kit.kl import run_kl as kl
from kit.paths import PLUGIN_CACHE
from kit.pg import one_row

TOKEN = "metrics-test-token"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def imported(db_url, make_state, tmp_path):
    for name in ("prod", "empty-path", "never"):
        f = tmp_path / f"{name}.tfstate"
        f.write_bytes(make_state(1, {"a": {"id": "1"}, "b": {"id": "2"}}))
        assert kl("state", "import", name, str(f)).returncode == 0
    return db_url


@pytest.fixture
def refreshed(imported, make_state, tmp_path):
    """prod: refreshed twice by kl with the real null provider, then drift written by a refresh;
    empty-path: one refresh that failed (no provider found); never: imported, never refreshed."""
    for _ in range(2):
        r = kl("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "--workdir", str(tmp_path))
        assert r.returncode == 0, r.stderr
    r = kl("refresh", "empty-path", "--provider-search-path", str(tmp_path), "--workdir", str(tmp_path))
    assert r.returncode == 1, r.stderr
    # Drift as a refresh records it: b gone in a version a refresh wrote.
    f = tmp_path / "drift.tfstate"
    f.write_bytes(make_state(50, {"a": {"id": "1"}}))
    assert kl("state", "import", "prod", str(f), "--source", "refresh").returncode == 0, "drift version"
    return imported


def _status(name: str) -> dict:
    r = kl("status", name, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_metrics_match_kl_status_and_runs(refreshed, start_server, conn):
    client = start_server(auth=Authenticator(token=TOKEN))
    assert client.request("GET", "/metrics").status == 401  # same auth as the rest of the server
    reply = client.with_auth(f"Bearer {TOKEN}").request("GET", "/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain; version="), reply.headers
    samples = _samples(reply.text)

    for name in ("prod", "empty-path", "never"):
        assert samples[("kilolock_state_open_drift", (("state", name),))] == _status(name)["open_drift"], name
    assert _status("prod")["open_drift"] == 1  # the test is not comparing zeros

    last = one_row(conn, "SELECT extract(epoch FROM max(finished_at))::float8 FROM refresh_runs r JOIN states s "
                         "ON s.id = r.state_id WHERE s.name = 'prod' AND r.status = 'succeeded'")[0]
    assert samples[("kilolock_state_last_successful_refresh_timestamp_seconds", (("state", "prod"),))] == pytest.approx(last)
    assert not any(k[0] == "kilolock_state_last_successful_refresh_timestamp_seconds" and k[1] == (("state", "never"),)
                   for k in samples), "a state never refreshed has no sample, not 1970"

    for name, outcome in (("prod", 1), ("empty-path", 0)):
        assert _status(name)["last_refresh"]["status"] == ("succeeded" if outcome else "failed")
        assert samples[("kilolock_state_last_refresh_succeeded", (("state", name),))] == outcome, name
    assert ("kilolock_state_last_refresh_succeeded", (("state", "never"),)) not in samples, "no run, no outcome"

    # The fleet's runs: one histogram by outcome, whatever the number of states.
    finished: dict[str, int] = {}
    for name in ("prod", "empty-path", "never"):
        r = kl("runs", name, "--format", "json")
        listed = json.loads(r.stdout)
        for run in listed["runs"] if isinstance(listed, dict) else listed:
            finished[run["status"]] = finished.get(run["status"], 0) + 1
    assert finished == {"succeeded": 2, "failed": 1}
    for status, n in finished.items():
        count = samples[("kilolock_fleet_refresh_duration_seconds_count", (("status", status),))]
        assert count == n, status
        assert samples[("kilolock_fleet_refresh_duration_seconds_bucket", (("le", "+Inf"), ("status", status)))] == count
        # Cumulative: no bucket holds fewer runs than a smaller one.
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in samples.items()
                         if k[0] == "kilolock_fleet_refresh_duration_seconds_bucket" and dict(k[1])["status"] == status)
        assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    assert samples[("kilolock_fleet_refresh_runs_running", ())] == 0


def test_series_per_state_stay_a_few_gauges(refreshed, start_server, conn):
    """A state adds at most one sample to each of three gauges: the run history is fleet-wide (a
    histogram per state was 13 samples a state, most of /metrics at 10,000 states)."""
    # A name stored before the naming rules (the table only refuses control characters): the
    # label is escaped as the text format asks, and the parser reads the name back.
    conn.execute("""UPDATE states SET name = 'old "quoted" \\ name' WHERE name = 'never'""")
    samples = _samples(start_server().request("GET", "/metrics").text)
    per_state: dict[str, set[str]] = {}
    for metric, labels in samples:
        if "state" in dict(labels) and not metric.startswith("kilolock_discovery_"):
            per_state.setdefault(dict(labels)["state"], set()).add(metric)
    gauges = {"kilolock_state_open_drift", "kilolock_state_last_successful_refresh_timestamp_seconds",
              "kilolock_state_last_refresh_succeeded"}
    assert per_state == {"prod": gauges, "empty-path": gauges - {"kilolock_state_last_successful_refresh_timestamp_seconds"},
                         'old "quoted" \\ name': {"kilolock_state_open_drift"}}, per_state


def test_requests_are_counted_by_route_not_by_state_name(imported, start_server):
    client = start_server()
    for name in ("prod", "never"):
        assert client.request("GET", f"/states/{name}").status == 200
    assert client.request("GET", "/nowhere").status == 404
    samples = _samples(client.request("GET", "/metrics").text)
    assert samples[("kilolock_http_requests_total", (("method", "GET"), ("route", "/states/{name}"), ("status", "200")))] == 2
    assert samples[("kilolock_http_requests_total", (("method", "GET"), ("route", "other"), ("status", "404")))] == 1
    assert not any("never" in str(k) for k in samples if k[0].startswith("kilolock_http_"))


def test_metrics_open_on_loopback_only_when_asked(imported, start_server):
    closed = start_server(auth=Authenticator(token=TOKEN))
    assert closed.request("GET", "/metrics").status == 401
    open_ = start_server(auth=Authenticator(token=TOKEN), metrics_open_on_loopback=True)
    assert open_.request("GET", "/metrics").status == 200
    assert open_.request("GET", "/states/prod").status == 401  # only /metrics is opened
    assert open_.request("PUT", "/metrics", body=b"x").status in (401, 405)


def test_fleet_queue_and_deliveries_match_kl_fleet_status_and_notify_log(imported, start_server, tmp_path):
    r = kl("schedule", "run-now", "--states", "prod")
    assert r.returncode == 0, r.stderr
    # A receiver that is not there: the delivery stays pending, retried later (not waited for here).
    assert kl("notify", "add", "ops", "--webhook", "http://127.0.0.1:9/hook", "--events", "refresh.failed").returncode == 0
    r = kl("refresh", "empty-path", "--provider-search-path", str(tmp_path), "--workdir", str(tmp_path),
           env={"KL_NOTIFY_WAIT": "0"})
    assert r.returncode == 1, r.stderr

    fleet = json.loads(kl("fleet", "status", "--format", "json").stdout)
    samples = _samples(start_server().request("GET", "/metrics").text)  # after: its lag is the longer
    assert fleet["queue"]["due"] == 1  # the test is not comparing zeros
    for status in ("due", "upcoming", "running"):
        assert samples[("kilolock_fleet_queue_jobs", (("status", status),))] == fleet["queue"][status], status
    assert samples[("kilolock_fleet_schedule_lag_seconds", ())] >= fleet["queue"]["lag_s"] > 0
    assert samples[("kilolock_fleet_workers_alive", ())] == 0
    log = json.loads(kl("notify", "log", "--format", "json").stdout)
    entries = log["deliveries"] if isinstance(log, dict) else log
    assert [(e["channel"], e["status"]) for e in entries] == [("ops", "pending")], entries
    assert samples[("kilolock_notify_deliveries", (("channel", "ops"), ("status", "pending")))] == 1


def test_discovery_figures_match_kl_status_and_kl_discover_results(imported, start_server, conn):
    from kilolock.store import discovery_runs as dr

    mine = dr.Scope("registry.terraform.io/kilolock/testfw", "", "prod", "testfw_thing", {})
    everyone = dr.Scope("registry.terraform.io/kilolock/testfw", "", None, "testfw_thing", {"prefix": "x-"})
    ok = dr.begin(conn, mine, None, "t")
    dr.finish(conn, ok, [dr.Found({"id": "x-1"}, "x-1", "unmanaged", [])], status="succeeded")
    failed = dr.begin(conn, mine, None, "t")
    dr.finish(conn, failed, [], status="failed", error="provider exited")
    other = dr.begin(conn, everyone, None, "t")
    claim = {"state": "prod", "address": "testfw_thing.a", "deposed": ""}
    dr.finish(conn, other, [dr.Found({"id": "x-1"}, "x-1", "unmanaged", []), dr.Found({"id": "x-2"}, "x-2", "unmanaged", []),
                            dr.Found({"id": "a"}, "a", "managed", [claim]),
                            dr.Found({"id": "b"}, "b", "managed twice", [claim, claim])], status="succeeded")

    status = _status("prod")["discovery"]
    assert [(d["run_id"], d["status"], d["error"]) for d in status] == [(failed, "failed", "provider exited")]
    text = kl("status", "prod").stdout.decode()
    assert "discovered testfw_thing: failed, " in text and f"(kl discover --results --run {failed})" in text
    latest = json.loads(kl("discover", "--results", "--format", "json").stdout)["run"]
    assert (latest["id"], latest["counts"]["unmanaged"]) == (other, 2)

    samples = _samples(start_server().request("GET", "/metrics").text)
    labels = (("alias", ""), ("source", "registry.terraform.io/kilolock/testfw"), ("type", "testfw_thing"))

    def key(name: str, state: str, config: dict, *extra: tuple[str, str]) -> tuple:
        scope = dr.Scope("registry.terraform.io/kilolock/testfw", "", state or None, "testfw_thing", config)
        return name, tuple(sorted((*labels, ("state", state), ("config", scope.config_hash[:12]), *extra)))

    assert samples[key("kilolock_discovery_last_run_succeeded", "prod", {})] == 0
    assert samples[key("kilolock_discovery_last_run_succeeded", "", {"prefix": "x-"})] == 1
    assert samples[key("kilolock_discovery_last_success_timestamp_seconds", "prod", {})] == one_row(
        conn, "SELECT extract(epoch FROM finished_at)::float8 FROM discovery_runs WHERE id = %s", (ok,))[0]
    for match, n in (("unmanaged", 2), ("managed", 1), ("managed twice", 1)):
        assert samples[key("kilolock_discovery_objects", "", {"prefix": "x-"}, ("match", match))] == n
    assert not [k for k in samples if k[0] == "kilolock_discovery_objects" and ("state", "prod") in k[1]]


def test_a_run_as_long_as_a_bucket_bound_counts_in_that_bound(imported, start_server, conn):
    """`le` is "less than or equal": a run of exactly 0.5 s is in le="0.5", one a microsecond
    longer only from le="1.0" on, one over the last bound only in +Inf."""
    for took in ("0.5 seconds", "0.500001 seconds", "1800 seconds", "1 day"):
        conn.execute("""INSERT INTO refresh_runs (state_id, from_version_id, started_at, finished_at, status)
                        SELECT s.id, v.id, now() - %s::interval, now(), 'failed'
                        FROM states s JOIN state_versions v ON v.state_id = s.id WHERE s.name = 'prod' LIMIT 1""",
                     (took,))
    samples = _samples(start_server().request("GET", "/metrics").text)

    def bucket(le: str) -> float:
        return samples[("kilolock_fleet_refresh_duration_seconds_bucket", (("le", le), ("status", "failed")))]

    assert (bucket("0.5"), bucket("1.0"), bucket("600.0"), bucket("1800.0"), bucket("+Inf")) == (1, 2, 2, 3, 4)
    assert samples[("kilolock_fleet_refresh_duration_seconds_sum", (("status", "failed"),))] == pytest.approx(
        0.5 + 0.500001 + 1800 + 86400)
