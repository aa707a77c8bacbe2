"""`kl state rm` and `kl state mv` end to end, as separate processes against a real database: what
goes with a state, what stays (the globs that name it), and every refusal."""
from __future__ import annotations

import json
import os
import pty
import subprocess

import psycopg
import pytest

from kilolock.server import store_ops
from kilolock.store import locks
from kit.kl import kl_cmd, kl_env
from kit.paths import PLUGIN_CACHE
from kit.pg import one_row


def ok(r: subprocess.CompletedProcess[bytes]) -> str:
    assert r.returncode == 0, r.stderr
    return r.stdout.decode()


def refused(r: subprocess.CompletedProcess[bytes], code: int = 1) -> str:
    err = r.stderr.decode()
    assert r.returncode == code and err.startswith("kl: ") and "Traceback" not in err, (r.returncode, err)
    return err


def referencing_tables(conn: psycopg.Connection) -> list[str]:
    """Every table with a foreign key to states(id): a table added later is counted too."""
    rows = conn.execute("""SELECT DISTINCT c.conrelid::regclass::text FROM pg_constraint c
                           WHERE c.contype = 'f' AND c.confrelid = 'states'::regclass ORDER BY 1""").fetchall()
    return [r[0] for r in rows]


def moved_rows(found: dict[str, int]) -> dict[str, int]:
    """COUNTS without the delivery attempts: every kl command retries the due deliveries to the
    setup's unreachable webhook on its way out, so their number grows with the time the test takes."""
    return {table: n for table, n in found.items() if table != "notify_attempts"}


def counts(db_url: str, sid: str) -> dict[str, int]:
    """Rows of state SID in each table that references states, and the rows hanging off its
    notification events (deliveries, their attempts) and drift records (notices)."""
    with psycopg.connect(db_url) as c:
        out = {t: one_row(c, f"SELECT count(*) FROM {t} WHERE state_id = %s", (sid,))[0] for t in referencing_tables(c)}
        out["notify_deliveries"] = one_row(c, "SELECT count(*) FROM notify_deliveries")[0]
        out["notify_attempts"] = one_row(c, "SELECT count(*) FROM notify_attempts")[0]
        out["notify_drift_notices"] = one_row(c, "SELECT count(*) FROM notify_drift_notices")[0]
    return out


def state_id(db_url: str, name: str) -> str:
    with psycopg.connect(db_url) as c:
        return str(one_row(c, "SELECT id FROM states WHERE name = %s", (name,))[0])


def take_lock(db_url: str, name: str) -> str:
    info = locks.lock_info("OperationTypeApply", "alice@laptop", "1.8.5")
    with psycopg.connect(db_url, autocommit=True) as c:
        store_ops.lock(c, name, info, "test")
    return str(info["ID"])


def observe_a_difference(db_url: str, name: str, address: str) -> None:
    """An observation of NAME's current version that found ADDRESS different (its observed object,
    and the drift it opens), recorded by kl's own code as a refresh records one: the real null
    provider reads back exactly what is stored, so its refreshes only ever confirm."""
    from kilolock import tfstate
    from kilolock.refresh.commit import record_observation
    from kilolock.store import states, versions

    with psycopg.connect(db_url, autocommit=True) as conn:
        sid = states.state_id(conn, name)
        current = versions.current_version(conn, sid)
        assert current is not None
        parser = tfstate.ExactJSON()
        doc = parser.loads(versions.raw_state_text(conn, name))
        [changed] = [r for r in doc["resources"] if f"{r['type']}.{r['name']}" == address]
        changed["instances"][0]["attributes"]["triggers"] = {"changed": "out of band"}
        observed = record_observation(conn, name, sid, tfstate.parse_state(doc), parser, current, "test", None,
                                      {(address, "")}, same_as_base=False)
        assert observed.version.kind == "observation" and observed.found == 1, observed


@pytest.fixture
def prod(db_url, run_kl, make_state, tmp_path):
    """State prod with rows of its own in every table a state's rows live in but the lock and the
    stale notices (versions, a refresh run by the real null provider, drift, settings, a provider
    config, a queued job, lock events, notification events); staging, matched by other globs; and
    a grant, an ignore rule, a channel and a schedule each that match prod."""
    ok(run_kl("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}, "b": {"id": "2"}})))
    ok(run_kl("state", "import", "staging", "-", input=make_state(1, {"a": {"id": "1"}})))
    ok(run_kl("notify", "add", "ops", "--webhook", "http://127.0.0.1:9/hook", "--states", "p*"))
    ok(run_kl("state", "set", "prod", "--workdir", str(tmp_path), "--actor", "cron@ops"))
    ok(run_kl("provider", "configure", "hashicorp/null", "--state", "prod", "--config", "-", input=b"{}"))
    r = run_kl("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "--format", "json")
    assert json.loads(r.stdout)["status"] == "succeeded", r.stderr
    # Then one that found an object different (the import below sends its drift.new with its own).
    observe_a_difference(db_url, "prod", "null_resource.b")
    ok(run_kl("state", "import", "prod", "-", "--source", "refresh",
              input=make_state(3, {"a": {"id": "1", "triggers": {"k": "v"}}, "b": {"id": "2"}})))
    ok(run_kl("access", "grant", "user:alice", "--role", "read", "--states", "prod"))
    ok(run_kl("access", "grant", "user:bob", "--role", "write", "--states", "staging"))
    ok(run_kl("drift", "ignore", "add", "--states", "**", "--address", "null_resource.b"))
    ok(run_kl("schedule", "set", "--states", "prod", "--every", "6h"))
    ok(run_kl("schedule", "run-now", "--states", "prod"))
    lock_id = take_lock(db_url, "prod")
    with psycopg.connect(db_url, autocommit=True) as c:
        store_ops.unlock(c, "prod", lock_id, "test", forced=False)
        # The unreachable webhook's next retries (1 s, 2 s, 4 s, ... after the events) would otherwise fall
        # due during the test on a slow machine and print their warnings before the lines it checks.
        c.execute("UPDATE notify_deliveries SET next_attempt_at = now() + interval '1 hour' WHERE status = 'pending'")
    return db_url


def test_rm_deletes_everything_of_its_own_in_one_go_and_lists_the_globs_that_stay(prod, run_kl):
    sid, other = state_id(prod, "prod"), state_id(prod, "staging")
    before, staging_before = counts(prod, sid), counts(prod, other)
    # Every kind of row a state can own is there to be deleted, but the three this setup cannot
    # make (a discovery run needs a provider that lists).
    assert [t for t, n in before.items() if n == 0] == ["discovery_runs", "notify_stale_notices", "state_locks"], before

    # Not a terminal and no --force: refused before anything is shown or deleted.
    err = refused(run_kl("state", "rm", "prod"))
    assert "standard input is not a terminal" in err and "--force" in err and err.count("\n") == 1, err
    assert counts(prod, sid) == before

    with psycopg.connect(prod) as c:
        events = c.execute("SELECT kind, serial, detail -> 'addresses' -> 0 ->> 'address' FROM notify_events"
                           " WHERE state_id = %s ORDER BY created_at", (sid,)).fetchall()
    assert events == [("drift.new", 1, "null_resource.b"), ("drift.new", 3, "null_resource.a"),
                      ("drift.resolved", 3, "null_resource.b")], events
    out = ok(run_kl("state", "rm", "prod", "--force"))
    # v1, its observations v1.1 (the refresh's) and v1.2, v3; the drift of v3 and of v1.2; the lock
    # taken and released (a refresh that observes takes none); drift.new of each drift, and b's end.
    assert out.startswith("deleting state 'prod' deletes what is its own: 4 versions, 3 instance lifecycles, "
                          "1 refresh run, 2 drift records, 2 lock events, its stored refresh settings, "
                          "1 provider config of its own, 1 queued refresh, 3 notification events\n"), out
    assert out.endswith("prod: deleted\n"), out
    assert ("  grant of read to user:alice on 'prod': kl access revoke user:alice --states prod\n"
            "  ignore rule 1 ('null_resource.b') on '**': kl drift ignore remove 1\n"
            "  notify channel ops on 'p*': kl notify remove ops\n"
            "  schedule 1 on 'prod': kl schedule remove 1\n") in out, out
    assert "bob" not in out

    assert set(counts(prod, sid).values()) == {0}
    assert counts(prod, other) == {**staging_before, "notify_deliveries": 0, "notify_attempts": 0, "notify_drift_notices": 0}
    listing = json.loads(ok(run_kl("state", "list", "--format", "json")))
    assert [s["name"] for s in listing["states"]] == ["staging"]
    # The globs stay, as listed.
    assert [g["principal"] for g in json.loads(ok(run_kl("access", "list", "--format", "json")))["grants"]] == ["user:alice", "user:bob"]


def test_rm_json_result(prod, run_kl):
    doc = json.loads(ok(run_kl("state", "rm", "prod", "--force", "--format", "json")))
    assert doc["deleted"] == "prod" and doc["owned"]["versions"] == 4 and doc["owned"]["refresh_runs"] == 1
    assert [(k["kind"], k["key"], k["states"], k["remove"]) for k in doc["kept"]] == [
        ("grant", "user:alice", "prod", "kl access revoke user:alice --states prod"),
        ("ignore rule", "1", "**", "kl drift ignore remove 1"),
        ("notify channel", "ops", "p*", "kl notify remove ops"),
        ("schedule", "1", "prod", "kl schedule remove 1"),
    ]


def on_terminal(args: list[str], typed: bytes, env: dict[str, str]) -> tuple[int, str, str]:
    """Run kl with its standard input a terminal (a pty) on which TYPED was typed."""
    master, slave = pty.openpty()
    try:
        os.write(master, typed)
        proc = subprocess.run(kl_cmd(*args), stdin=slave, capture_output=True, env=env, timeout=120)
    finally:
        os.close(slave)
        os.close(master)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def test_rm_on_a_terminal_asks_for_the_name(db_url, run_kl, make_state):
    ok(run_kl("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}})))
    env = kl_env(KL_DATABASE_URL=db_url)
    code, out, err = on_terminal(["state", "rm", "prod"], b"prdo\n", env)
    assert code == 1 and "type its name" in err and "kl: typed 'prdo', not 'prod'; nothing changed" in err, err
    assert out.startswith("deleting state 'prod' deletes what is its own: 1 version, 1 instance lifecycle\n"), out
    assert ok(run_kl("state", "versions", "prod"))

    code, out, err = on_terminal(["state", "rm", "prod"], b"prod\n", env)
    assert code == 0 and out.endswith("prod: deleted\n"), (out, err)
    assert refused(run_kl("state", "versions", "prod")) == "kl: no state named 'prod' (see `kl state list`)\n"


def test_rm_refuses_a_missing_state_with_the_closest_name_and_a_locked_one_with_its_holder(db_url, run_kl, make_state):
    ok(run_kl("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}})))
    err = refused(run_kl("state", "rm", "prdo", "--force"))
    assert err == "kl: no state named 'prdo'; did you mean 'prod'? (see `kl state list`)\n", err

    lock_id = take_lock(db_url, "prod")
    err = refused(run_kl("state", "rm", "prod", "--force"))
    assert err.startswith("kl: state 'prod' is locked by alice@laptop (OperationTypeApply, lock ") and err.count("\n") == 1, err
    assert f"not deleted; when its holder is done, or gone: `kl state unlock prod --lock-id {lock_id}`" in err, err
    assert ok(run_kl("state", "versions", "prod"))


def drift_records(run_kl, name: str) -> list[dict]:
    """kl drift's records of NAME, but how long each has been open (which the clock moves)."""
    return [{k: v for k, v in e.items() if k != "open_for_s"}
            for e in json.loads(ok(run_kl("drift", name, "--all", "--format", "json")))["drift"]]


def test_mv_keeps_history_and_settings_and_spells_out_the_backend_change(prod, run_kl):
    ok(run_kl("access", "grant", "user:carol", "--role", "read", "--states", "team/**"))
    versions_before = json.loads(ok(run_kl("state", "versions", "prod", "--format", "json")))["versions"]
    drift_before = drift_records(run_kl, "prod")
    assert drift_before
    sid = state_id(prod, "prod")
    before = counts(prod, sid)

    out = ok(run_kl("state", "mv", "prod", "team/prod", "--force", "--serve-url", "https://kl.example:8080/"))
    assert out == (
        "these matched 'prod' and do not match 'team/prod' (they stay as they are: change those meant to follow it):\n"
        "  grant of read to user:alice on 'prod': kl access revoke user:alice --states prod\n"
        "  notify channel ops on 'p*': kl notify remove ops\n"
        "  schedule 1 on 'prod': kl schedule remove 1\n"
        "these did not match 'prod' and match 'team/prod' from now on:\n"
        "  grant of read to user:carol on 'team/**': kl access revoke user:carol --states 'team/**'\n"
        "Terraform's backend \"http\" block for it reads, once renamed (then `terraform init -reconfigure`):\n"
        '  address        = "https://kl.example:8080/states/team/prod"\n'
        '  lock_address   = "https://kl.example:8080/states/team/prod"\n'
        '  unlock_address = "https://kl.example:8080/states/team/prod"\n'
        "until then Terraform finds no state at /states/prod: a plan there would create everything again\n"
        "renamed state 'prod' to 'team/prod': its 4 versions, history and settings go with it\n"), out

    assert json.loads(ok(run_kl("state", "versions", "team/prod", "--format", "json")))["versions"] == versions_before
    assert drift_records(run_kl, "team/prod") == drift_before
    assert json.loads(ok(run_kl("state", "show", "team/prod", "--format", "json")))["settings"]["actor"] == "cron@ops"
    assert state_id(prod, "team/prod") == sid
    assert moved_rows(counts(prod, sid)) == moved_rows(before)
    assert refused(run_kl("state", "versions", "prod")) == "kl: no state named 'prod' (see `kl state list`)\n"


def test_mv_json_and_the_placeholder_url(db_url, run_kl, make_state):
    ok(run_kl("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}})))
    ok(run_kl("drift", "ignore", "add", "--states", "prod", "--address", "null_resource.a"))
    doc = json.loads(ok(run_kl("state", "mv", "prod", "prod@eu+1", "--force", "--format", "json")))
    url = "<kl serve URL>/states/prod@eu+1"
    assert doc == {"version": 1, "renamed": {"from": "prod", "to": "prod@eu+1"}, "versions": 1,
                   "no_longer_match": [{"kind": "ignore rule", "key": "1", "detail": "null_resource.a", "states": "prod",
                                        "remove": "kl drift ignore remove 1"}],
                   "now_match": [], "backend": {"address": url, "lock_address": url, "unlock_address": url}}


def test_mv_refusals(db_url, run_kl, make_state):
    for name in ("prod", "staging"):
        ok(run_kl("state", "import", name, "-", input=make_state(1, {"a": {"id": "1"}})))
    err = refused(run_kl("state", "mv", "prod", "staging", "--force"))
    assert err == ("kl: a state named 'staging' exists already; nothing renamed "
                   "(`kl state rm staging` first, if it is the one to go)\n"), err
    err = refused(run_kl("state", "mv", "prod", "bad name", "--force"), code=2)
    assert "state name 'bad name' is not allowed" in err, err
    err = refused(run_kl("state", "mv", "prdo", "eu", "--force"))
    assert err == "kl: no state named 'prdo'; did you mean 'prod'? (see `kl state list`)\n", err
    err = refused(run_kl("state", "mv", "prod", "eu"))
    assert "standard input is not a terminal" in err and "nothing changed" in err, err
    lock_id = take_lock(db_url, "prod")
    err = refused(run_kl("state", "mv", "prod", "eu", "--force"))
    assert f"not renamed; when its holder is done, or gone: `kl state unlock prod --lock-id {lock_id}`" in err, err
    names = [s["name"] for s in json.loads(ok(run_kl("state", "list", "--format", "json")))["states"]]
    assert names == ["prod", "staging"]

    code, out, err = on_terminal(["state", "mv", "staging", "eu"], b"staging\n", kl_env(KL_DATABASE_URL=db_url))
    assert code == 0 and out.endswith("renamed state 'staging' to 'eu': its 1 version, history and settings go with it\n"), err
