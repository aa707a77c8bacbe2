"""PostgreSQL failover: a multi-host URL (`host=a,b` with target_session_attrs=read-write), the
primary killed with SIGKILL and its synchronous standby promoted (kit.replication), on loopback
addresses, with real servers and real kl processes."""
from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator

import pytest

from kit.replication import Replicated, replicated


@pytest.fixture
def pair() -> Iterator[Replicated]:
    with replicated("kl-fo-", databases=("kl",)) as p:
        yield p


def test_a_reconnect_after_a_failover_reaches_the_promoted_standby(pair):
    """libpq's account of a connection names the one host it reached: a reconnect made from it
    would go back to the dead primary. kl reconnects with the URL it was given, every host of it."""
    from kilolock.store import db

    conn = db.connect(pair.url("kl"))
    assert conn.info.port == pair.primary.port
    conn.execute("CREATE TABLE acknowledged (n int)")
    conn.execute("INSERT INTO acknowledged VALUES (1)")
    pair.kill_primary()
    pair.promote()
    with db.reconnect(conn) as fresh:
        assert fresh.info.port == pair.standby.port
        fresh.execute("INSERT INTO acknowledged VALUES (2)")
        # What the primary acknowledged is on the standby (synchronous): nothing lost, nothing twice.
        assert fresh.execute("SELECT n FROM acknowledged ORDER BY n").fetchall() == [(1,), (2,)]
    conn.close()


def test_recovery_waits_for_a_primary_while_the_standby_is_not_yet_promoted(pair, monkeypatch):
    """Between the primary's death and the promotion no server accepts writes: the recovery after
    a lost connection (settling a cut commit, finishing an audit row) tries again with backoff for
    KL_DATABASE_RECONNECT_WAIT, rather than leaving an outcome unknown that is known a moment later."""
    from kilolock.store import db

    conn = db.connect(pair.url("kl"))
    pair.kill_primary()
    with pytest.raises(db.DatabaseError, match="session is read-only"):
        db.reconnect(conn)  # no wait: one attempt, the standby refuses to be a read-write session
    monkeypatch.setenv(db.RECONNECT_WAIT_ENV, "60s")
    got: list[object] = []
    waiting = threading.Thread(target=lambda: got.append(_settle(conn)), daemon=True)
    waiting.start()
    pair.promote()
    waiting.join(90)
    assert got == [pair.standby.port]
    conn.close()


def _settle(conn: object) -> object:
    from kilolock.store import db

    try:
        with db.reconnected(conn) as fresh:  # type: ignore[arg-type]
            fresh.execute("SELECT 1")
            return fresh.info.port
    except Exception as exc:  # noqa: BLE001 - handed to the test thread
        return exc


def test_a_bad_reconnect_wait_is_one_line_when_kl_opens_the_store(db_url, run_kl):
    r = run_kl("state", "list", env={"KL_DATABASE_URL": db_url, "KL_DATABASE_RECONNECT_WAIT": "soon"})
    err = r.stderr.decode()
    assert r.returncode != 0 and err.startswith("kl: KL_DATABASE_RECONNECT_WAIT: invalid duration 'soon'"), err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("url", [
    "postgresql://kl:s3cret@10.0.0.1:5432,10.0.0.2:5432/kl?target_session_attrs=read-write",
    "host=10.0.0.1,10.0.0.2 port=5432,5432 user=kl password=s3cret dbname=kl target_session_attrs=read-write",
    "postgresql://kl@10.0.0.1,10.0.0.2/kl?password=s3cret&target_session_attrs=read-write",
])
def test_a_multi_host_url_is_said_without_its_password_and_every_host_kept(url):
    from kilolock.store.db import Target

    said = Target(url=url, embedded=False).describe()
    assert "s3cret" not in said and "10.0.0.1" in said and "10.0.0.2" in said, said


# ---------------------------------------------------------------- a run whose reads span the failover

def test_a_refresh_reading_when_the_primary_dies_commits_on_the_promoted_standby(pair, fake_cache):
    """`kl refresh --commit` is in its reads (a slow provider) when the primary is killed and the
    standby promoted: nothing was sent since the run began, so it goes on on a new connection to
    the new primary and commits there, its audit row finished, no lock left."""
    import subprocess

    from kit.faults import fake_state, serials
    from kit.invariants import event_count, running_runs, state_locks, version_problems, wait_for
    from kit.kl import kl_cmd, kl_env, run_kl

    url = pair.url("kl")
    make, events = fake_cache
    # What it reads differs from the state (FAKE_READ_SET), so --commit has a version to write.
    cache = make(FAKE_SLOW_SECONDS="3", FAKE_READ_SET='{"value": "changed"}')
    assert run_kl("db", "migrate", env={"KL_DATABASE_URL": url}).returncode == 0
    r = run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_slow"]), env={"KL_DATABASE_URL": url})
    assert r.returncode == 0, r.stderr
    proc = subprocess.Popen(kl_cmd("refresh", "prod", "--commit", "--provider-search-path", str(cache), "--format", "json"),
                            env=kl_env(KL_DATABASE_URL=url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: event_count(events, "read") >= 2, 30, "the reads to be in flight")
    pair.kill_primary()
    pair.promote()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    doc = json.loads(out)
    assert doc["status"] == "succeeded" and (doc["from_serial"], doc["to_serial"]) == (1, 2), doc
    assert serials(url) == [1, 2] and version_problems(url, "prod") == []
    assert running_runs(url) == [] and state_locks(url) == []


def test_a_refresh_whose_commit_is_cut_by_the_failover_settles_it_on_the_promoted_standby(pair, tmp_path):
    """The primary dies while a refresh's commit is open (held before its COMMIT): the refresh asks
    the new primary, once promoted, whether its version landed, releases its state lock there and
    says what happened, rather than leaving it unknown (its reconnect went to the dead primary)."""
    import os
    import subprocess
    import sys

    from kit import breakcommit
    from kit.faults import serials
    from kit.fleet import add_states
    from kit.invariants import running_runs, state_locks
    from kit.kl import run_kl
    from kit.paths import REPO

    url = pair.url("kl")
    assert run_kl("db", "migrate", env={"KL_DATABASE_URL": url}).returncode == 0
    add_states(url, ["prod"], instances=2, legacy_address=True)  # so --commit has a version to write
    arm, held, go = tmp_path / "arm", tmp_path / "held", tmp_path / "go"
    arm.touch()
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "KL_DATABASE_URL": url,
           breakcommit.ARM: str(arm), breakcommit.HELD: str(held), breakcommit.GO: str(go)}
    env.pop("KL_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "kit.breakcommit", "refresh", "prod", "--commit"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    breakcommit.wait_held(held, proc)
    pair.kill_primary()
    go.touch()
    pair.promote()
    _out, err = proc.communicate(timeout=180)
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1, lines
    assert lines[0].startswith("kl: refresh failed: lost the database connection during the commit (") \
        and lines[0].endswith("; nothing committed"), lines
    assert serials(url, "prod") == [1] and state_locks(url) == [] and running_runs(url) == []
    assert run_kl("refresh", "prod", "--commit", env={"KL_DATABASE_URL": url}).returncode == 0
    assert serials(url, "prod") == [1, 2]


def test_a_worker_s_job_whose_run_spans_the_failover_is_finished_by_that_worker_once(pair, fake_cache, tmp_path):
    """A worker's run is reading when the primary dies: it goes on on the new primary, and the
    job's outcome follows it there (not left to its lease, which would have the job taken over
    and run again)."""
    from kit.fleet import add_fake_state, q, start_worker, stop, wait_for
    from kit.invariants import event_count
    from kit.kl import run_kl

    url = pair.url("kl")
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="3")
    env = {"KL_DATABASE_URL": url}
    assert run_kl("db", "migrate", env=env).returncode == 0
    add_fake_state(url, "prod", cache)
    log = tmp_path / "w1.log"
    worker = start_worker(url, "w1", "--lease", "30s", log=log)
    try:
        r = run_kl("schedule", "run-now", "--states", "prod", env=env)
        assert r.returncode == 0, r.stderr
        wait_for("the run's reads to be in flight", lambda: event_count(events, "read") >= 1, timeout=60)
        pair.kill_primary()
        pair.promote()
        wait_for("the job to be finished", lambda: q(url, "SELECT count(*) FROM fleet_jobs WHERE status IN "
                                                          "('succeeded', 'failed')") == [(1,)], timeout=90, every=0.3)
    finally:
        code, _ = stop(worker)
    text = log.read_text(errors="replace")
    assert code == 0, text
    assert q(url, "SELECT status, attempts FROM fleet_jobs") == [("succeeded", 1)], text
    assert q(url, "SELECT status FROM refresh_runs") == [("succeeded",)], text
    assert "took over" not in text and "lease had been taken over" not in text and "Traceback" not in text, text


# ---------------------------------------------------------------- the whole system across a failover

TOOL = "terraform-1.8.5"
# Terraform's http backend retries a 503 after the Retry-After kl serve sends (10 s): five retries
# cover a 30 s failover with room to spare (its default, 2, covers 20 s).
TF_RETRIES = {"TF_HTTP_RETRY_MAX": "5", "TF_HTTP_RETRY_WAIT_MAX": "30"}
# A null_resource whose creation waits for the test to say the primary is dead: Terraform holds
# the lock meanwhile and writes its state after, into the outage.
_HELD_APPLY = """
resource "null_resource" "app" {{
  triggers = {{ v = "{v}" }}
  provisioner "local-exec" {{
    command = "touch {started}; while [ ! -e {go} ]; do sleep 0.1; done"
  }}
}}
"""


def test_workers_serve_terraform_and_the_outbox_go_on_after_the_primary_dies_and_the_standby_is_promoted(pair, tmp_path):
    """Three workers on a 5 s schedule, kl serve with Terraform 1.8.5 applying through it, and a
    webhook receiver; the primary is killed (SIGKILL) in the middle of the apply and its synchronous
    standby promoted. Every component goes on against the new primary with no restart: every
    scheduled state gets a succeeded run, no run is left running, no acknowledged version is missing
    or stored twice, Terraform's apply completes (503 with Retry-After, then 200), and every event
    reaches the receiver with its idempotency key."""
    import time

    from kilolock.server.auth import hash_password
    from kit.fleet import add_states, q, start_worker, stop, wait_for
    from kit.invariants import version_problems
    from kit.kl import run_kl
    from kit.klserve import KlServe
    from kit.tfcli import Workspace, tool_binary, wait_for_lock_holder
    from kit.webhook import Receiver

    url = pair.url("kl")
    env = {"KL_DATABASE_URL": url}
    assert run_kl("db", "migrate", env=env).returncode == 0
    names = [f"fo/s{n}" for n in range(4)]
    add_states(url, names, instances=2)
    nowhere = tmp_path / "no-providers"
    nowhere.mkdir()
    add_states(url, ["fo/broken"], instances=1, search_path=nowhere)  # fails every run: outbox events
    receiver = Receiver()
    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\n")
    workers = []
    serve = None
    apply = None
    try:
        r = run_kl("notify", "add", "ops", "--webhook", receiver.url, "--events", "refresh.failed", env=env)
        assert r.returncode == 0, r.stderr
        r = run_kl("schedule", "set", "--states", "fo/*", "--every", "5s", env=env)
        assert r.returncode == 0, r.stderr
        workers = [start_worker(url, f"w{n}", log=tmp_path / f"w{n}.log") for n in (1, 2, 3)]
        serve = KlServe(url, "--users-file", str(users), env={"KL_SERVE_TOKEN": ""})
        ws = Workspace(TOOL, tool_binary(TOOL), tmp_path / "ws", f"{serve.http}/states/fo-tf/app", "alice", "alice-pw")
        ws.dir.mkdir()
        started, go = tmp_path / "apply-started", tmp_path / "primary-killed"
        ws.write(_HELD_APPLY.format(v="1", started=started, go=go))
        ws.run("init", "-input=false", "-no-color")

        def succeeded_since(since: object) -> set[str]:
            return {n for (n,) in q(url, "SELECT DISTINCT s.name FROM refresh_runs rr JOIN states s ON s.id = rr.state_id "
                                         "WHERE rr.status = 'succeeded' AND rr.started_at > %s", (since,))}
        wait_for("a first round of every scheduled state", lambda: succeeded_since("-infinity") == set(names), timeout=90)
        receiver.wait_for(1, timeout=60)

        apply = ws.start("apply", "-auto-approve", "-input=false", "-no-color", env=ws.env(**TF_RETRIES))
        wait_for_lock_holder(url, "fo-tf/app", apply)
        wait_for("Terraform to run the provisioner", started.exists, timeout=60)
        # What the primary acknowledged before it died: every one must be on the new primary.
        acknowledged = {v for (v,) in q(url, "SELECT id FROM state_versions")}
        serve_mark = len(serve.lines)
        pair.kill_primary()
        killed = time.monotonic()
        go.touch()
        # The outage, before the promotion: Terraform's state write is answered 503 and every
        # worker has found the database gone (a failover manager takes this long or longer).
        serve.wait_for(lambda line: line.split()[5:7] == ["/states/fo-tf/app", "503"], timeout=60, start=serve_mark)
        wait_for("every worker to lose the database",
                 lambda: all("database error" in (tmp_path / f"w{n}.log").read_text(errors="replace") for n in (1, 2, 3)),
                 timeout=60)
        pair.promote()
        [(promoted_at,)] = q(url, "SELECT now()")
        out, err = apply.communicate(timeout=180)
        assert apply.returncode == 0 and "Apply complete" in out, out + err + "\n".join(serve.lines)
        wait_for("every scheduled state refreshed on the new primary",
                 lambda: succeeded_since(promoted_at) == set(names), timeout=60, every=0.3)
        recovered_s = time.monotonic() - killed
        print(f"failover: every component working again {recovered_s:.1f}s after the primary was killed")
        assert all(w.poll() is None for w in workers), "a worker exited on the failover"
        assert serve.proc.poll() is None, "kl serve exited on the failover"
        # Everything delivered (the outbox's own record), each event under its own key.
        wait_for("every outbox delivery sent", lambda: q(url, "SELECT count(*) FROM notify_deliveries "
                                                              "WHERE status <> 'delivered'") == [(0,)], timeout=150, every=0.5)
        pulled = ws.run("state", "pull").stdout
    finally:
        if apply is not None and apply.poll() is None:
            apply.kill()
            apply.communicate()
        outputs = [stop(w)[1] for w in workers]
        if serve is not None:
            serve.stop()
        receiver.close()
    logs = [(tmp_path / f"w{n}.log").read_text(errors="replace") for n in (1, 2, 3)]
    assert all(w.returncode == 0 for w in workers), outputs + logs
    assert not any("Traceback" in text or "internal error" in text for text in logs), logs
    # A lease that ran out during the outage is taken over by one worker, once.
    taken = re.findall(r"took over job (\d+) ", "".join(logs))
    assert len(taken) == len(set(taken)), logs
    # No run left running, no job either.
    assert q(url, "SELECT count(*) FROM refresh_runs WHERE status = 'running'") == [(0,)], logs
    assert q(url, "SELECT count(*) FROM fleet_jobs WHERE status = 'running'") == [(0,)], logs
    # Nothing acknowledged lost; nothing stored twice (serials increasing, observations numbered once).
    assert acknowledged <= {v for (v,) in q(url, "SELECT id FROM state_versions")}
    for name in [*names, "fo/broken", "fo-tf/app"]:
        assert version_problems(url, name) == [], name
    assert q(url, "SELECT count(*) FROM (SELECT state_id, serial, observation_number FROM state_versions "
                  "GROUP BY 1, 2, 3 HAVING count(*) > 1) d") == [(0,)]
    # Terraform's apply met the outage (503 with Retry-After, never a 500), then its write landed once.
    lines = serve.lines[serve_mark:]
    calls = [(p[4], p[6]) for p in (line.split() for line in lines) if p[5:6] == ["/states/fo-tf/app"]]
    assert calls[0][1] == "503" and ("POST", "200") in calls, "\n".join(lines)
    assert calls.index(("UNLOCK", "200")) > calls.index(("POST", "200")), "\n".join(lines)
    assert {status for _, status in calls} <= {"503", "200", "204"}, lines
    assert not any(" 500 " in line or "Traceback" in line for line in serve.lines), serve.lines
    assert q(url, "SELECT v.serial FROM state_versions v JOIN states s ON s.id = v.state_id "
                  "WHERE s.name = 'fo-tf/app' AND v.kind = 'terraform'") == [(1,)]
    assert q(url, "SELECT count(*) FROM state_locks") == [(0,)]
    ours = run_kl("state", "pull", "fo-tf/app", env=env).stdout.decode()
    assert pulled.rstrip("\n") == ours.rstrip("\n")
    # Every event reached the receiver, told apart by its idempotency key; a repeat (sent, then
    # the database died before it was marked delivered) carries the same key and body.
    events = {str(e) for (e,) in q(url, "SELECT id FROM notify_events")}
    got: dict[str, bytes] = {}
    for request in receiver.events():
        key = request.headers["Idempotency-Key"]
        assert got.setdefault(key, request.body) == request.body, key
    assert events and set(got) == events, (events, got.keys())
