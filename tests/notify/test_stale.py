"""refresh.stale (issue 14): a scheduled state with no successful refresh for longer than a channel's
--stale-after, found by the processes that poll (every kl process that opens the database, the
sender thread of `kl serve`), sent once per streak. States are real null_resources (kit.fleet)
refreshed by real `kl refresh` runs with the real null provider.
"""
from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from kit.fleet import add_states, q, runs_of
from kit.webhook import Receiver

STALE_AFTER = 5.0  # seconds: short, so a test waits little, yet longer than the few kl processes before the first check take on a loaded CI machine


def ok(r: Any) -> Any:
    assert r.returncode == 0, r.stderr.decode()
    return r


def stale_states(receiver: Receiver) -> list[str]:
    return [r.json["state"] for r in receiver.events() if r.json["event"] == "refresh.stale"]


def checks(run_kl, n: int = 3) -> None:
    """N kl processes that open the database: each evaluates staleness and sends what is due."""
    for _ in range(n):
        ok(run_kl("notify", "list"))


def test_a_stale_scheduled_state_is_sent_once_per_streak_and_a_successful_refresh_ends_it(run_kl, db_url, receiver):
    add_states(db_url, ["prod/a", "paused/b", "loose"], instances=2)
    ok(run_kl("notify", "add", "late", "--webhook", receiver.url, "--stale-after", f"{STALE_AFTER:g}s", "--secret", "k"))
    ok(run_kl("notify", "add", "nostale", "--webhook", receiver.url, "--events", "drift.new,refresh.stale"))
    # Staleness counts from the schedule's creation (no success yet): the clock starts here.
    schedule = ok(run_kl("schedule", "set", "--states", "prod/**", "--every", "1h")).stdout.decode()
    paused = ok(run_kl("schedule", "set", "--states", "paused/**", "--every", "1h")).stdout.decode()
    paused_id = next(w for w in paused.split() if w.isdigit())
    ok(run_kl("schedule", "pause", paused_id))
    checks(run_kl, 1)
    assert receiver.events() == []  # not stale yet

    time.sleep(STALE_AFTER + 0.2)
    checks(run_kl)
    [first] = receiver.events()
    doc = first.json
    assert (doc["event"], doc["state"], doc["channel"], doc["serial"], doc["run_id"]) == (
        "refresh.stale", "prod/a", "late", None, None)
    assert first.signed_by("k") and doc["command"] == "kl runs prod/a"
    stale = doc["stale"]
    assert stale["last_success_at"] is None and stale["stale_after_s"] == STALE_AFTER
    assert STALE_AFTER <= stale["stale_for_s"] < 60
    [(schedule_id,)] = q(db_url, "SELECT id FROM fleet_schedules WHERE states_glob = 'prod/**'")
    assert stale["schedule"] == {"id": schedule_id, "states": "prod/**", "every_s": 3600, "cron": None}, schedule

    # A successful refresh ends the streak; the next staleness is a new one, sent once again.
    refreshed = json.loads(ok(run_kl("refresh", "prod/a", "--format", "json")).stdout)
    assert refreshed["status"] == "succeeded", refreshed
    checks(run_kl, 1)
    assert len(receiver.events()) == 1
    time.sleep(STALE_AFTER + 0.2)
    checks(run_kl)
    assert stale_states(receiver) == ["prod/a", "prod/a"]
    second = receiver.events()[1].json["stale"]
    [(finished,)] = q(db_url, "SELECT max(finished_at) FROM refresh_runs WHERE status = 'succeeded'")
    # PostgreSQL writes the instant with its trailing zeros of microseconds cut (.44551), Python with six digits
    assert datetime.fromisoformat(second["last_success_at"]) == finished
    assert len({r.headers["Idempotency-Key"] for r in receiver.events()}) == 2

    # A failed refresh does not end the streak (it is no success): still two.
    q(db_url, "UPDATE state_settings SET provider_search_paths = ARRAY['/nonexistent'] "
              "WHERE state_id = (SELECT id FROM states WHERE name = 'prod/a')")
    assert run_kl("refresh", "prod/a").returncode != 0
    assert [r[0] for r in runs_of(db_url, "prod/a")] == ["succeeded", "failed"]
    checks(run_kl)
    assert stale_states(receiver) == ["prod/a", "prod/a"]


def test_no_stale_after_means_no_refresh_stale_and_the_option_needs_the_event(run_kl, db_url, receiver):
    add_states(db_url, ["prod/a"], instances=1)
    ok(run_kl("schedule", "set", "--states", "**", "--every", "1h"))
    ok(run_kl("notify", "add", "all", "--webhook", receiver.url))
    time.sleep(0.5)
    checks(run_kl, 2)
    assert receiver.events() == []
    r = run_kl("notify", "add", "x", "--webhook", receiver.url, "--events", "drift.new", "--stale-after", "1h")
    assert r.returncode == 2 and b"do not include refresh.stale" in r.stderr and b"Traceback" not in r.stderr
    ok(run_kl("notify", "add", "daily", "--webhook", receiver.url, "--stale-after", "1d"))
    listed = json.loads(ok(run_kl("notify", "list", "--format", "json")).stdout)["channels"]
    assert [(c["name"], c["stale_after_s"]) for c in listed] == [("all", None), ("daily", 86400)]
    assert b"1d00h" in ok(run_kl("notify", "list")).stdout


def test_kl_serve_sender_thread_finds_staleness_with_no_other_kl_process(run_kl, db_url, receiver, kl_serve):
    add_states(db_url, ["prod/a"], instances=1)
    ok(run_kl("schedule", "set", "--states", "prod/*", "--every", "1h"))
    ok(run_kl("notify", "add", "late", "--webhook", receiver.url, "--stale-after", f"{STALE_AFTER}s",
              "--format", "slack"))
    [got] = receiver.wait_for(1, timeout=20)
    text = json.dumps(got.json)
    assert "no successful refresh: prod/a" in text and "last successful refresh: never" in text, text
    assert "every 1h" in text
    time.sleep(4.5)  # two more passes of the thread (every 2 s): still one
    assert len(receiver.events()) == 1
