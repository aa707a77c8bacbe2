"""Notifications from the versions that cause them (issue 14), with versions written as Terraform and
refresh write them (`kl state import --source apply|refresh`), each by its own kl process: which
events an address's drift makes over its life, what ignore rules and an existing fleet silence,
the payload and its signature, retries, a crash between commit and delivery, and secrets.
"""
from __future__ import annotations

import json
from typing import Any

import psycopg

from kit.webhook import Receiver

SECRET = "hmac-key-for-tests"
PLANTED = "planted-sensitive-value-7f3a"


def write(run_kl, make_state, serial: int, source: str, instances: dict[str, dict[str, Any]], *,
          env: dict[str, str] | None = None, state: str = "prod", **top: Any) -> Any:
    r = run_kl("state", "import", state, "-", "--source", source, input=make_state(serial, instances, **top), env=env)
    return r


def ok(r: Any) -> Any:
    assert r.returncode == 0, r.stderr.decode()
    return r


def add_channel(run_kl, name: str, url: Any, *extra: str) -> None:
    ok(run_kl("notify", "add", name, "--webhook", url if isinstance(url, str) else json.dumps(url), *extra))


def A(x: str = "1", extra: str = "e") -> dict[str, Any]:
    return {"id": "1", "triggers": {"x": x, "y": "same"}, "extra": extra}


B = {"id": "2", "triggers": {"z": "1"}}


def kinds(receiver: Receiver) -> list[tuple[str, list[str]]]:
    return [(r.json["event"], [a["address"] for a in r.json["addresses"]]) for r in receiver.events()]


def test_one_new_event_per_drift_then_updated_for_more_paths_then_resolved(run_kl, make_state, db_url, receiver):
    add_channel(run_kl, "hook", receiver.url, "--secret", SECRET, "--ui-url", "https://kl.example.com/")
    ok(write(run_kl, make_state, 1, "apply", {"a": A(), "b": B}))
    assert receiver.events() == []  # an apply with nothing drifting says nothing

    ok(write(run_kl, make_state, 2, "refresh", {"a": A(x="2"), "b": B}))
    assert kinds(receiver) == [("drift.new", ["null_resource.a"])]
    new = receiver.events()[0]
    doc = new.json
    assert (doc["version"], doc["state"], doc["serial"], doc["source"], doc["command"]) == (1, "prod", 2, "refresh", "kl drift prod")
    assert doc["ui_url"] == "https://kl.example.com/states/prod/drift"
    assert doc["addresses"] == [{"address": "null_resource.a", "deposed": None, "kind": "changed", "paths": ["triggers"],
                                 "changes": [{"path": 'triggers["x"]', "before": "1", "after": "2"}], "resolved_how": None}]
    assert new.signed_by(SECRET) and not new.signed_by("another key")
    assert new.headers["Idempotency-Key"] == doc["idempotency_key"]

    # Still drifting, read again (same content, then other values at the same paths): not new again.
    ok(write(run_kl, make_state, 3, "refresh", {"a": A(x="2"), "b": B}))
    ok(write(run_kl, make_state, 4, "refresh", {"a": A(x="3"), "b": B}))
    assert len(receiver.events()) == 1

    # More paths drift at the open address: updated, naming them all.
    ok(write(run_kl, make_state, 5, "refresh", {"a": A(x="3", extra="changed"), "b": B}))
    assert kinds(receiver)[1:] == [("drift.updated", ["null_resource.a"])]
    assert receiver.events()[1].json["addresses"][0]["paths"] == ["extra", "triggers"]

    # The apply resolves it, once.
    ok(write(run_kl, make_state, 6, "apply", {"a": A(x="3", extra="changed"), "b": B}))
    ok(write(run_kl, make_state, 7, "apply", {"a": A(x="4", extra="changed"), "b": B}))
    assert kinds(receiver)[2:] == [("drift.resolved", ["null_resource.a"])]
    resolved = receiver.events()[2]
    assert resolved.json["addresses"][0]["resolved_how"] == "apply" and resolved.signed_by(SECRET)
    keys = [r.headers["Idempotency-Key"] for r in receiver.events()]
    assert len(set(keys)) == 3

    log = json.loads(ok(run_kl("notify", "log", "--format", "json")).stdout)["deliveries"]
    assert sorted((d["event"], d["status"], len(d["attempts"])) for d in log) == [
        ("drift.new", "delivered", 1), ("drift.resolved", "delivered", 1), ("drift.updated", "delivered", 1)]


def test_ignored_changes_and_channels_of_other_states_or_events_send_nothing(run_kl, make_state, start_receiver):
    everything, other_state, only_resolved = start_receiver(), start_receiver(), start_receiver()
    add_channel(run_kl, "all", everything.url)
    add_channel(run_kl, "staging", other_state.url, "--states", "staging/**")
    add_channel(run_kl, "resolved", only_resolved.url, "--events", "drift.resolved")
    ok(run_kl("drift", "ignore", "add", "--states", "prod", "--address", "null_resource.a", "--path", 'triggers["x"]'))
    ok(write(run_kl, make_state, 1, "apply", {"a": A(), "b": B}))

    ok(write(run_kl, make_state, 2, "refresh", {"a": A(x="2"), "b": B}))  # only the ignored path
    assert everything.events() == []
    ok(write(run_kl, make_state, 3, "refresh", {"a": A(x="2"), "b": {"id": "2", "triggers": {"z": "2"}}}))
    assert kinds(everything) == [("drift.new", ["null_resource.b"])]
    ok(write(run_kl, make_state, 4, "apply", {"a": A(), "b": B}))
    # The hidden record of a was resolved too, and was never announced: not its resolution either.
    assert kinds(everything)[1:] == [("drift.resolved", ["null_resource.b"])]
    assert kinds(only_resolved) == [("drift.resolved", ["null_resource.b"])]
    assert other_state.events() == []


def test_a_channel_added_over_existing_drift_replays_nothing(run_kl, make_state, receiver):
    ok(write(run_kl, make_state, 1, "apply", {"a": A(), "b": B}))
    ok(write(run_kl, make_state, 2, "refresh", {"a": A(x="2"), "b": B}))
    add_channel(run_kl, "late", receiver.url)
    ok(write(run_kl, make_state, 3, "refresh", {"a": A(x="2"), "b": B}))
    ok(run_kl("state", "list"))
    assert receiver.events() == []
    # New drift after it was added is news.
    ok(write(run_kl, make_state, 4, "refresh", {"a": A(x="2"), "b": {"id": "2", "triggers": {"z": "9"}}}))
    assert kinds(receiver) == [("drift.new", ["null_resource.b"])]


def test_replay_open_drift_sends_the_open_drift_after_ignore_rules_to_the_new_channel_only(run_kl, make_state,
                                                                                          start_receiver):
    early, late, scoped = start_receiver(), start_receiver(), start_receiver()
    add_channel(run_kl, "early", early.url)
    ok(run_kl("drift", "ignore", "add", "--states", "prod", "--address", "null_resource.c"))
    C = {"id": "3", "triggers": {"w": "1"}}
    ok(write(run_kl, make_state, 1, "apply", {"a": A(), "b": B, "c": C}))
    ok(write(run_kl, make_state, 2, "refresh", {"a": A(x="2"), "b": B, "c": {"id": "3", "triggers": {"w": "2"}}}))
    ok(write(run_kl, make_state, 1, "apply", {"a": A()}, state="staging/eu"))
    ok(write(run_kl, make_state, 2, "refresh", {}, state="staging/eu"))  # deleted behind Terraform's back
    ok(write(run_kl, make_state, 1, "apply", {"a": A()}, state="calm"))
    ok(write(run_kl, make_state, 2, "refresh", {"a": A()}, state="calm"))
    assert sorted(kinds(early)) == [("drift.new", ["null_resource.a"]), ("drift.new", ["null_resource.a"])]

    r = ok(run_kl("notify", "add", "late", "--webhook", late.url, "--replay-open-drift"))
    assert b"replaying the open drift of 2 state(s)" in r.stdout
    got = {e.json["state"]: e.json for e in late.wait_for(2)}
    assert sorted(got) == ["prod", "staging/eu"] and len(late.events()) == 2
    prod = got["prod"]
    assert (prod["event"], prod["serial"], prod["replayed"]) == ("drift.new", 2, True)
    assert prod["addresses"] == [{"address": "null_resource.a", "deposed": None, "kind": "changed", "paths": ["triggers"],
                                  "changes": [{"path": 'triggers["x"]', "before": "1", "after": "2"}], "resolved_how": None}]
    assert [(a["address"], a["kind"]) for a in got["staging/eu"]["addresses"]] == [("null_resource.a", "deleted")]
    add_channel(run_kl, "scoped", scoped.url, "--states", "staging/**", "--replay-open-drift")
    assert [e.json["state"] for e in scoped.events()] == ["staging/eu"]
    assert len(early.events()) == 2  # the channels that heard it live hear nothing again

    # Replayed drift is followed like live drift: its end reaches every channel.
    ok(write(run_kl, make_state, 3, "apply", {"a": A(x="2"), "b": B, "c": C}))
    assert kinds(late)[2:] == [("drift.resolved", ["null_resource.a"])]
    assert kinds(early)[2:] == [("drift.resolved", ["null_resource.a"])]

    r = run_kl("notify", "add", "x", "--webhook", late.url, "--events", "drift.resolved", "--replay-open-drift")
    assert r.returncode == 2 and b"do not include drift.new" in r.stderr, r.stderr


def test_a_500_then_200_is_one_delivery_with_both_attempts_logged(run_kl, make_state, start_receiver):
    receiver = start_receiver([500])
    add_channel(run_kl, "flaky", receiver.url)
    ok(write(run_kl, make_state, 1, "apply", {"a": A()}))
    ok(write(run_kl, make_state, 2, "refresh", {"a": A(x="2")}))  # waits for its retry (1 s) before exiting
    got = receiver.events()
    assert len(got) == 2 and got[0].body == got[1].body
    assert got[0].headers["Idempotency-Key"] == got[1].headers["Idempotency-Key"] == got[0].json["idempotency_key"]
    [delivery] = json.loads(ok(run_kl("notify", "log", "--format", "json")).stdout)["deliveries"]
    assert (delivery["status"], [a["http_status"] for a in delivery["attempts"]]) == ("delivered", [500, 200])
    assert delivery["attempts"][0]["error"] == "HTTP 500 Internal Server Error"
    assert delivery["idempotency_key"] == got[0].headers["Idempotency-Key"]
    assert json.loads(ok(run_kl("notify", "log", "--failed", "--format", "json")).stdout)["deliveries"] == []


def test_a_receiver_that_keeps_failing_is_left_pending_and_shown_by_log_failed(run_kl, make_state, start_receiver):
    receiver = start_receiver([503] * 50)
    add_channel(run_kl, "down", receiver.url)
    ok(write(run_kl, make_state, 1, "apply", {"a": A()}))
    r = ok(write(run_kl, make_state, 2, "refresh", {"a": A(x="2")}, env={"KL_NOTIFY_WAIT": "0"}))
    assert "will retry" in r.stderr.decode()
    [failed] = json.loads(ok(run_kl("notify", "log", "--failed", "--format", "json")).stdout)["deliveries"]
    assert (failed["status"], failed["last_error"]) == ("pending", "HTTP 503 Service Unavailable")
    table = ok(run_kl("notify", "log", "--failed")).stdout.decode()
    assert "down" in table and "HTTP 503" in table


def test_killed_between_commit_and_delivery_the_next_process_delivers_once(run_kl, make_state, db_url, receiver):
    add_channel(run_kl, "hook", receiver.url)
    ok(write(run_kl, make_state, 1, "apply", {"a": A()}))
    r = write(run_kl, make_state, 2, "refresh", {"a": A(x="2")}, env={"KL_TEST_NOTIFY_FAULT": "kill-before-delivery"})
    assert r.returncode == -9, r.stderr.decode()
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT max(serial) FROM state_versions").fetchone() == (2,)  # committed
    assert receiver.events() == []

    ok(run_kl("state", "list"))  # any kl process that opens the store
    ok(run_kl("state", "list"))
    [got] = receiver.events()
    assert got.json["event"] == "drift.new"
    [delivery] = json.loads(ok(run_kl("notify", "log", "--format", "json")).stdout)["deliveries"]
    assert delivery["idempotency_key"] == got.headers["Idempotency-Key"] and len(delivery["attempts"]) == 1


def test_kl_version_and_help_never_touch_the_outbox(run_kl, make_state, receiver):
    add_channel(run_kl, "hook", receiver.url)
    ok(write(run_kl, make_state, 1, "apply", {"a": A()}))
    r = write(run_kl, make_state, 2, "refresh", {"a": A(x="2")}, env={"KL_TEST_NOTIFY_FAULT": "kill-before-delivery"})
    assert r.returncode == -9
    ok(run_kl("version"))
    ok(run_kl("notify", "--help"))
    assert receiver.events() == []  # neither opened the store
    ok(run_kl("drift", "prod"))
    assert len(receiver.events()) == 1


def sensitive_state(make_state, serial: int, password: str) -> bytes:
    doc = json.loads(make_state(serial, {"db": {"id": "1", "triggers": {"password": password, "size": "s"}}}))
    doc["resources"][0]["instances"][0]["sensitive_attributes"] = [
        [{"type": "get_attr", "value": "triggers"}, {"type": "index", "value": {"value": "password", "type": "string"}}]]
    return json.dumps(doc).encode()


def test_secrets_never_appear_in_payloads_lists_or_logs(run_kl, make_state, start_receiver):
    plain, slack = start_receiver([500]), start_receiver()
    env = {"KL_TEST_HOOK_URL": plain.url, "KL_TEST_HOOK_SECRET": "env-hmac-secret-91c2", "KL_TEST_SLACK": slack.url}
    ok(run_kl("notify", "add", "hook", "--webhook", '{"env": "KL_TEST_HOOK_URL"}', "--secret", '{"env": "KL_TEST_HOOK_SECRET"}'))
    ok(run_kl("notify", "add", "chat", "--webhook", '{"env": "KL_TEST_SLACK"}', "--format", "slack",
              "--ui-url", "https://kl.example.com"))
    ok(run_kl("provider", "configure", "hashicorp/null", "--config", "-", input=b'{"token": "planted-provider-token-55"}'))
    ok(run_kl("state", "import", "prod", "-", "--source", "apply", input=sensitive_state(make_state, 1, PLANTED), env=env))
    ok(run_kl("state", "import", "prod", "-", "--source", "refresh", input=sensitive_state(make_state, 2, PLANTED + "-new"),
              env=env))

    [first, retried] = plain.events()
    assert first.signed_by("env-hmac-secret-91c2") and retried.body == first.body
    assert first.json["addresses"][0]["changes"] == [{"path": 'triggers["password"]', "before": "(sensitive)",
                                                      "after": "(sensitive)"}]
    [message] = slack.events()
    text = json.dumps(message.json)
    assert "kl drift prod" in text and "https://kl.example.com/states/prod/drift" in text and "null_resource.db" in text
    assert set(message.json) == {"text", "blocks"}

    shown = b"".join([first.body, retried.body, message.body,
                      ok(run_kl("notify", "list")).stdout, ok(run_kl("notify", "list", "--format", "json")).stdout,
                      ok(run_kl("notify", "log", "--format", "json")).stdout, ok(run_kl("notify", "log")).stdout])
    for secret in (PLANTED, "planted-provider-token-55", "env-hmac-secret-91c2", plain.url, slack.url):
        assert secret.encode() not in shown, secret
    assert b"(env KL_TEST_HOOK_URL)" in shown


def test_a_webhook_env_variable_missing_at_send_time_is_a_logged_attempt_not_a_crash(run_kl, make_state):
    ok(run_kl("notify", "add", "hook", "--webhook", '{"env": "KL_TEST_UNSET_HOOK"}'))
    ok(write(run_kl, make_state, 1, "apply", {"a": A()}))
    r = ok(write(run_kl, make_state, 2, "refresh", {"a": A(x="2")}, env={"KL_NOTIFY_WAIT": "0"}))
    assert "environment variable KL_TEST_UNSET_HOOK is not set" in r.stderr.decode()
    [d] = json.loads(ok(run_kl("notify", "log", "--format", "json")).stdout)["deliveries"]
    assert d["status"] == "pending" and "KL_TEST_UNSET_HOOK is not set" in d["last_error"]


def test_channel_commands(run_kl, receiver):
    add_channel(run_kl, "ops", receiver.url, "--events", "drift.new,refresh.failed", "--failed-after", "3",
                "--secret", "literal-secret-value")
    r = run_kl("notify", "add", "ops", "--webhook", receiver.url)
    assert r.returncode == 1 and b"exists already" in r.stderr
    listed = json.loads(ok(run_kl("notify", "list", "--format", "json")).stdout)["channels"]
    assert [(c["name"], c["events"], c["failed_after"], c["secret"], c["webhook"]) for c in listed] == [
        ("ops", ["drift.new", "refresh.failed"], 3, "(set)", "http://127.0.0.1/…")]
    assert b"literal-secret-value" not in ok(run_kl("notify", "list")).stdout

    tested = ok(run_kl("notify", "test", "ops"))
    assert b"accepted (HTTP 200)" in tested.stdout
    [sample] = receiver.events()
    assert sample.json["test"] is True and sample.signed_by("literal-secret-value")

    for bad, said in ((["--webhook", "ftp://x"], "kl: notify add: argument --webhook: not an http(s) URL"),
                      (["--webhook", '{"env": 3}'], '{"env": "NAME"}'),
                      (["--webhook", receiver.url, "--events", "drift.new,nope"], "argument --events: unknown event nope"),
                      (["--webhook", receiver.url, "--states", ""], "state glob must not be empty")):
        r = run_kl("notify", "add", "x", *bad)
        assert r.returncode != 0 and said in r.stderr.decode() and "Traceback" not in r.stderr.decode(), r.stderr
    ok(run_kl("notify", "remove", "ops"))
    assert run_kl("notify", "remove", "ops").returncode == 1
    assert ok(run_kl("notify", "list")).stdout.startswith(b"no notification channels")
