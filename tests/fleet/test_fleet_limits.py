"""Fleet-wide provider limits (issue 13): `kl provider limit` caps the calls in flight to a provider
across worker processes and manual refreshes; the slot leases behind it (kilolock.store.provider_limits)."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from kit.faults import FAKE_SOURCE, fake_state, install_fake
from kit.fleet import q, start_worker, stop, wait_for
from kit.kl import kl_cmd, kl_env


def add_slow_states(db_url: str, names: list[str], cache: Path, reads: int) -> None:
    from kilolock import tfstate
    from kilolock.store import settings, states, writes

    with psycopg.connect(db_url, autocommit=True) as conn:
        for name in names:
            raw = fake_state(["fake_slow"] * reads, lineage=f"lineage-{name}")
            writes.store_document(conn, name, tfstate.parse_state(raw), raw, source="import", actor="test")
            settings.update(conn, states.state_id(conn, name),
                            settings.Changes({"provider_search_paths": [str(cache)]}), "test")


def test_limit_holds_across_three_workers_and_a_manual_refresh(run_kl, db_url, tmp_path):
    counter = tmp_path / "in-flight"
    cache = install_fake(tmp_path, tmp_path / "events.log", FAKE_SLOW_SECONDS="0.3", FAKE_CONCURRENCY_FILE=str(counter))
    add_slow_states(db_url, [f"limited/s{n}" for n in range(6)], cache, reads=6)
    add_slow_states(db_url, ["manual/a", "manual/b"], cache, reads=6)
    limit = 3
    r = run_kl("provider", "limit", "hashicorp/fake", "--max-in-flight", str(limit))
    assert r.returncode == 0 and f"at most {limit} call(s)" in r.stdout.decode(), r.stderr

    workers = [start_worker(db_url, f"w{n}", "--parallel-states", "2") for n in range(3)]
    outputs = []
    try:
        assert run_kl("schedule", "run-now", "--states", "limited/*").returncode == 0
        manual = subprocess.run(kl_cmd("refresh", "--all", "--states", "manual/*", "--parallel-states", "2"),
                                env=kl_env(KL_DATABASE_URL=db_url), capture_output=True, timeout=120)
        assert manual.returncode == 0, manual.stderr.decode()
        wait_for("the six jobs to succeed", lambda: q(
            db_url, "SELECT count(*) FROM fleet_jobs WHERE status = 'succeeded'")[0][0] == 6, timeout=90)
        busy = q(db_url, "SELECT count(DISTINCT claimed_by) FROM fleet_jobs")[0][0]
    finally:
        for w in workers:
            outputs.append(stop(w)[1])
    now, top = (int(x) for x in counter.read_text().split())
    assert now == 0
    # Never more than the limit, and the limit used (the runs were not simply serial).
    assert 2 <= top <= limit, (top, outputs)
    assert busy >= 2, outputs  # the jobs spread over worker processes: the limit held across them
    assert q(db_url, "SELECT count(*) FROM refresh_runs WHERE status = 'succeeded'")[0][0] == 8
    # Every process gave its slots back on the way out.
    assert q(db_url, "SELECT coalesce(sum(slots), 0) FROM provider_slot_leases")[0][0] == 0


def test_provider_limit_set_list_and_remove(run_kl, db_url):
    r = run_kl("provider", "limits")
    assert r.returncode == 0 and "no fleet-wide provider limit" in r.stdout.decode()
    assert run_kl("provider", "limit", "hashicorp/aws", "--alias", "prod", "--max-in-flight", "40").returncode == 0
    assert run_kl("provider", "limit", "hashicorp/aws", "--max-in-flight", "5").returncode == 0
    assert run_kl("provider", "limit", "hashicorp/aws", "--max-in-flight", "7").returncode == 0  # replaces it
    doc = json.loads(run_kl("provider", "limits", "--format", "json").stdout)
    assert [(x["source"], x["alias"], x["max_in_flight"], x["held"]) for x in doc["limits"]] == [
        ("registry.terraform.io/hashicorp/aws", None, 7, 0), ("registry.terraform.io/hashicorp/aws", "prod", 40, 0)]
    text = run_kl("provider", "limits").stdout.decode()
    assert "MAX IN FLIGHT" in text and "prod" in text
    r = run_kl("provider", "limit", "hashicorp/aws", "--alias", "prod", "--remove")
    assert r.returncode == 0 and "no fleet-wide limit any more" in r.stdout.decode()
    r = run_kl("provider", "limit", "hashicorp/aws", "--alias", "prod", "--remove")
    assert r.returncode == 1 and r.stderr.decode().count("\n") == 1 and "has no limit" in r.stderr.decode()
    r = run_kl("provider", "limit", "hashicorp/aws", "--max-in-flight", "0")
    assert r.returncode == 2 and "--max-in-flight" in r.stderr.decode()
    r = run_kl("provider", "limit", "hashicorp/aws")
    assert r.returncode == 2 and "--max-in-flight" in r.stderr.decode()


def test_a_limit_for_a_provider_no_state_uses_is_set_with_a_note(run_kl, db_url, tmp_path):
    from kilolock import tfstate
    from kilolock.store import writes

    raw = fake_state(["fake_slow"], lineage="lineage-used")
    doc = json.loads(raw)
    aliased = json.loads(json.dumps(doc["resources"][0]))
    aliased.update(name="other", module="module.m", provider=f'module.m.provider["{FAKE_SOURCE}"].west')
    doc["resources"].append(aliased)
    raw = json.dumps(doc).encode()
    with psycopg.connect(db_url, autocommit=True) as conn:
        writes.store_document(conn, "used/a", tfstate.parse_state(raw), raw, source="import", actor="test")

    def note(*args: str) -> str:
        r = run_kl("provider", "limit", *args, "--max-in-flight", "3")
        assert r.returncode == 0 and "at most 3 call(s)" in r.stdout.decode(), r.stderr
        return r.stderr.decode()

    assert note("hashicorp/fake") == ""
    assert note("hashicorp/fake", "--alias", "west") == ""  # used inside a module, through an alias
    assert "no stored state uses provider" in note("hashicorp/fake", "--alias", "east")
    err = note("hashicorp/fak")
    assert err.count("\n") == 1 and "registry.terraform.io/hashicorp/fak now" in err, err
    assert "kl provider limit hashicorp/fak --remove" in err
    # Set all the same: listed, and removable with the command the note gives.
    assert "hashicorp/fak " in run_kl("provider", "limits").stdout.decode()
    assert run_kl("provider", "limit", "hashicorp/fak", "--remove").returncode == 0


# ---------------------------------------------------------------- the leases (store)

@pytest.fixture
def conn(db_url):
    from kilolock.store import provider_limits

    with psycopg.connect(db_url, autocommit=True) as c:
        provider_limits.set_limit(c, FAKE_SOURCE, "", 4, "test")
        yield c


def test_grants_never_exceed_the_limit_and_a_starved_holder_gets_a_fair_share(conn):
    from kilolock.store.provider_limits import sync

    assert sync(conn, FAKE_SOURCE, "", "a", want=10, in_use=0, lease_s=30) == 4
    assert sync(conn, FAKE_SOURCE, "", "b", want=3, in_use=0, lease_s=30) == 0  # nothing free: b is starved
    # a, asked again, is cut to a fair share; its row keeps covering the calls it has in flight.
    assert sync(conn, FAKE_SOURCE, "", "a", want=10, in_use=4, lease_s=30) == 2
    assert q_held(conn) == {"a": 4, "b": 0}
    assert sync(conn, FAKE_SOURCE, "", "b", want=3, in_use=0, lease_s=30) == 0  # a's calls still hold the slots
    assert sync(conn, FAKE_SOURCE, "", "a", want=10, in_use=2, lease_s=30) == 2
    assert sync(conn, FAKE_SOURCE, "", "b", want=3, in_use=0, lease_s=30) == 2
    assert sum(q_held(conn).values()) <= 4
    assert sync(conn, "registry.terraform.io/hashicorp/other", "", "a", want=3, in_use=0, lease_s=30) is None


def test_an_expired_lease_frees_its_slots(conn):
    from kilolock.store.provider_limits import release, sync

    assert sync(conn, FAKE_SOURCE, "", "dead", want=4, in_use=0, lease_s=30) == 4
    assert sync(conn, FAKE_SOURCE, "", "live", want=4, in_use=0, lease_s=30) == 0
    # The dead holder never renewed: time passes, on the database's clock (the one leases run on).
    conn.execute("UPDATE provider_slot_leases SET expires_at = now() - interval '1 second' WHERE holder = 'dead'")
    assert sync(conn, FAKE_SOURCE, "", "live", want=4, in_use=0, lease_s=30) == 4
    release(conn, "live")
    assert sync(conn, FAKE_SOURCE, "", "other", want=2, in_use=0, lease_s=30) == 2


def test_a_process_stops_starting_calls_when_its_lease_cannot_be_renewed(conn):
    """Cut off from the database, a process's slots lapse on its own clock before the database hands
    them to anyone else."""
    from kilolock.refresh.slots import FleetSlots

    slots = FleetSlots(conn, {(FAKE_SOURCE, ""): 4}, lease_s=1.0)
    try:
        s = slots.for_provider(FAKE_SOURCE, "")
        assert s is not None and slots.for_provider(FAKE_SOURCE, "other-alias") is None
        assert s.acquire()
        s.release()
        slots._dsn = "host=/nonexistent dbname=none connect_timeout=1"  # the database is gone from here on
        assert slots._conn is not None
        slots._conn.close()
        deadline = time.monotonic() + 0.8 + 0.5
        stopped_at = None
        while time.monotonic() < deadline + 1.0:
            if not s.acquire(should_stop=lambda: True):
                stopped_at = time.monotonic()
                break
            s.release()
            time.sleep(0.05)
        assert stopped_at is not None and stopped_at <= deadline
    finally:
        slots.close()


def q_held(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT holder, slots FROM provider_slot_leases WHERE expires_at > now()").fetchall())


def test_sigkilled_worker_slots_come_back_after_the_lease(db_url, tmp_path):
    """A worker killed while holding slots does not keep them: they are free again after the lease."""
    from kilolock.store import provider_limits

    counter = tmp_path / "in-flight"
    cache = install_fake(tmp_path, tmp_path / "events.log", FAKE_SLOW_SECONDS="5", FAKE_CONCURRENCY_FILE=str(counter))
    add_slow_states(db_url, ["held/a"], cache, reads=2)
    with psycopg.connect(db_url, autocommit=True) as c:
        provider_limits.set_limit(c, FAKE_SOURCE, "", 2, "test")
    worker = start_worker(db_url, "victim")
    try:
        subprocess.run(kl_cmd("schedule", "run-now", "--states", "held/*"), env=kl_env(KL_DATABASE_URL=db_url), check=True,
                       capture_output=True)
        wait_for("the worker to hold both slots", lambda: q(
            db_url, "SELECT coalesce(sum(slots), 0) FROM provider_slot_leases WHERE expires_at > now()")[0][0] == 2)
    finally:
        stop(worker, signal.SIGKILL)
    with psycopg.connect(db_url, autocommit=True) as c:
        assert provider_limits.sync(c, FAKE_SOURCE, "", "next", want=2, in_use=0, lease_s=30) == 0
        wait_for("the dead worker's lease to run out", lambda: provider_limits.sync(
            c, FAKE_SOURCE, "", "next", want=2, in_use=0, lease_s=30) == 2, timeout=20, every=0.5)


# ---------------------------------------------------------------- seen from outside: kl fleet status, /metrics

def _metrics(db_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics of a kl serve over DB_URL (in a thread), parsed by prometheus-client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    from kilolock.server.auth import Authenticator
    from kilolock.server.http import KilolockHTTPServer, ServerConfig, serve_in_thread
    from kilolock.store import db
    from kit.httpclient import Client

    server = KilolockHTTPServer(("127.0.0.1", 0), ServerConfig(), Authenticator(token="t"), lambda: db.connect(db_url), None)
    serve_in_thread(server)
    try:
        reply = Client(server.url, server=server).with_auth("Bearer t").request("GET", "/metrics")
        assert reply.status == 200
        text = reply.body.decode()
    finally:
        server.shutdown()
        server.server_close()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_fleet_status_and_metrics_show_each_limit_and_who_holds_its_slots(run_kl, db_url, tmp_path):
    """Two workers each run a state whose two reads take a while, under a limit of 3: the slots are
    leased by both, and `kl fleet status` (table and JSON) and /metrics say so."""
    cache = install_fake(tmp_path, tmp_path / "events.log", FAKE_SLOW_SECONDS="8")
    add_slow_states(db_url, ["held/a", "held/b"], cache, reads=2)
    assert run_kl("provider", "limit", "hashicorp/fake", "--max-in-flight", "3").returncode == 0
    assert run_kl("provider", "limit", "hashicorp/aws", "--alias", "prod", "--max-in-flight", "40").returncode == 0
    workers = [start_worker(db_url, name) for name in ("w1", "w2")]
    try:
        assert run_kl("schedule", "run-now", "--states", "held/*").returncode == 0

        def status() -> dict:
            r = run_kl("fleet", "status", "--format", "json")
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)

        def both_hold() -> dict | None:
            doc = status()
            fake = next(x for x in doc["provider_limits"] if x["source"] == FAKE_SOURCE)
            return doc if fake["leased"] == 3 and {h["worker"] for h in fake["holders"]} == {"w1", "w2"} else None

        doc = wait_for("both workers to hold slots of the limit", both_hold, timeout=60, every=0.3)
        aws, fake = doc["provider_limits"]
        assert aws == {"source": "registry.terraform.io/hashicorp/aws", "alias": "prod", "max_in_flight": 40,
                       "leased": 0, "wanted": 0, "holders": []}
        assert (fake["source"], fake["alias"], fake["max_in_flight"]) == (FAKE_SOURCE, None, 3)
        assert sum(h["slots"] for h in fake["holders"]) == fake["leased"] == 3
        assert fake["wanted"] == 4  # two reads in each run
        assert all(set(h) == {"holder", "worker", "slots", "wanted", "expires_at"} for h in fake["holders"])
        assert all(h["holder"].startswith(f"{w['host']}:{w['pid']}:") for h in fake["holders"]
                   for w in doc["workers"] if w["name"] == h["worker"])

        text = run_kl("fleet", "status").stdout.decode()
        row = next(line for line in text.splitlines() if line.startswith(FAKE_SOURCE))
        held = {h["worker"]: h["slots"] for h in fake["holders"]}
        assert " 3 " in row and all(f"{w} {n}" in row for w, n in held.items()), text
        assert "PROVIDER LIMIT" in text and "LEASED NOW" in text, text

        def metrics_agree() -> bool:
            m = _metrics(db_url)
            labels = (("alias", ""), ("source", FAKE_SOURCE))
            return (m[("kilolock_fleet_provider_limit_max_in_flight", labels)] == 3
                    and m[("kilolock_fleet_provider_slots_leased", labels)] == 3
                    and m[("kilolock_fleet_provider_slots_wanted", labels)] == 4
                    and m[("kilolock_fleet_provider_slot_holders", labels)] == 2
                    and m[("kilolock_fleet_provider_slots_leased",
                           (("alias", "prod"), ("source", "registry.terraform.io/hashicorp/aws")))] == 0)
        wait_for("/metrics to show the same", metrics_agree, timeout=30, every=0.3)
    finally:
        outputs = [stop(w)[1] for w in workers]
    # Once the workers are gone, nothing is leased and nobody holds anything.
    doc = json.loads(run_kl("fleet", "status", "--format", "json").stdout)
    fake = next(x for x in doc["provider_limits"] if x["source"] == FAKE_SOURCE)
    assert fake["leased"] == 0 and fake["holders"] == [], outputs
