"""The orchestrator with a JSON fake below it (ADR 0006: recordingClient + fakeFactory), against a
real database. The real providers are exercised end to end in test_refresh_real.py."""
from __future__ import annotations

import json
import threading
import time

import pytest

from kilolock import tfstate
from kilolock.durations import parse_duration
from kilolock.errors import KlError
from kilolock.redact import MASK, Redactor
from kilolock.refresh import inflight, orchestrator
from kilolock.refresh.client import ResourceError, ThrottledError
from kilolock.refresh.options import RefreshOptions
from kilolock.store import locks, states, writes
from kit.fakeprovider import NULL, FakeFactory
from kit.paths import REPO


def seed(conn, make_state, attrs: dict[str, dict], serial=1, source="apply", **kw):
    raw = make_state(serial, attrs, **kw)
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source=source, actor="t")


def attrs(n, **extra):
    return {f"r{i}": {"id": f"id{i}", "triggers": None, **extra} for i in range(n)}


def run(conn, factory, **opts):
    # A run that says where its providers run; runs without a workdir have tests of their own.
    opts.setdefault("workdir", str(REPO))
    return orchestrator.run(conn, "prod", factory, RefreshOptions(actor="tester", **opts))


def run_row(conn, run_id):
    return conn.execute(
        "SELECT status, resources_checked, resources_changed, resources_failed, error_summary, actor, finished_at IS NOT NULL, to_version_id IS NOT NULL FROM refresh_runs WHERE id = %s",
        (run_id,)).fetchone()


def current(conn):
    """Terraform's current version: (serial, source, document)."""
    return conn.execute("SELECT serial, source, kl_version_document(id) FROM state_versions WHERE kind = 'terraform' "
                        "ORDER BY serial DESC LIMIT 1").fetchone()


def observed(conn):
    """The latest observation: (its label, its document)."""
    return conn.execute("SELECT 'v' || serial || '.' || observation_number, kl_version_document(kl_document_version(id)) "
                        "FROM state_versions WHERE kind = 'observation' ORDER BY seq DESC LIMIT 1").fetchone()


def test_a_refresh_records_an_observation_and_leaves_terraforms_version_as_it_is(conn, make_state):
    seed(conn, make_state, attrs(3))
    before = current(conn)
    f = FakeFactory()
    res = run(conn, f)
    assert (res.status, res.checked, res.changed, res.failed, res.from_serial, res.to_serial) == ("succeeded", 3, 0, 0, 1, None)
    assert res.observation == "v1.1" and not res.base_moved
    assert current(conn) == before  # the serial Terraform compares, and what it reads, did not move
    label, raw = observed(conn)
    assert label == "v1.1" and (raw["serial"], raw["lineage"]) == (1, "lineage-1")
    assert run_row(conn, res.run_id) == ("succeeded", 3, 0, 0, None, "tester", True, True)
    assert f.opened == [(NULL, "")] and f.closed == 1
    # private from the provider is stored (base64), schema-sensitive paths are recorded
    inst = raw["resources"][0]["instances"][0]
    assert inst["private"] == "cDppZDA="
    assert conn.execute("SELECT count(*) FROM resources WHERE delete_serial IS NULL").fetchone()[0] == 3


def test_commit_writes_a_version_only_when_what_was_read_differs_from_terraforms(conn, make_state):
    # The first run rewrites every object's private data (the fake provider's own), so it writes
    # serial 2; the second reads them all back as they are: serial+1 would make every saved plan
    # stale for nothing, so it records a confirmation instead.
    seed(conn, make_state, attrs(3))
    first = run(conn, FakeFactory(), commit=True)
    assert (first.status, first.to_serial, first.observation) == ("succeeded", 2, None)
    after_first = current(conn)
    second = run(conn, FakeFactory(), commit=True)
    assert (second.status, second.to_serial, second.observation) == ("succeeded", None, "v2.1")
    assert current(conn) == after_first
    assert conn.execute("SELECT count(*) FROM state_versions WHERE kind = 'terraform'").fetchone() == (2,)


def test_an_observation_that_finds_everything_as_terraform_has_it_stores_no_document(conn, make_state, monkeypatch):
    seed(conn, make_state, attrs(3))
    assert run(conn, FakeFactory(), commit=True).to_serial == 2  # the fake provider's private data, accepted
    said: list[bool] = []
    real = writes.record_observation
    def spy(*args, **kwargs):
        said.append(kwargs["same_as_base"])
        return real(*args, **kwargs)

    monkeypatch.setattr(writes, "record_observation", spy)
    res = run(conn, FakeFactory())
    assert (said, res.observation) == ([True], "v2.1")
    assert conn.execute("SELECT raw_state IS NULL AND head_piece IS NULL AND layout IS NULL FROM state_versions "
                        "WHERE kind = 'observation'").fetchone() == (True,)
    assert observed(conn)[1] == current(conn)[2]  # its document is its base's
    assert conn.execute("SELECT count(*) FROM observed_objects").fetchone() == (0,)


def test_on_loaded_is_called_once_the_state_is_loaded_and_before_any_read(conn, make_state):
    # kl refresh freezes what it holds there (kilolock.gcpolicy): the state, not yet the reads.
    seed(conn, make_state, attrs(3))
    f = FakeFactory()
    seen: list[int] = []
    res = orchestrator.run(conn, "prod", f, RefreshOptions(actor="tester", workdir=str(REPO)),
                           on_loaded=lambda: seen.append(len(f.reads())))
    assert res.status == "succeeded" and seen == [0] and len(f.reads()) == 3


def test_changed_and_removed_objects(conn, make_state):
    seed(conn, make_state, attrs(4))
    f = FakeFactory(world={"id1": {"id": "id1", "triggers": {"k": "drifted"}}, "id3": None})
    res = run(conn, f, allow_mass_removal=False)
    assert (res.status, res.changed, res.changed_addresses) == ("succeeded", 2, ["null_resource.r1", "null_resource.r3"])
    _, raw = observed(conn)
    assert [r["name"] for r in raw["resources"]] == ["r0", "r1", "r2"]
    assert [r["name"] for r in current(conn)[2]["resources"]] == ["r0", "r1", "r2", "r3"]  # Terraform's, as it was
    assert raw["resources"][1]["instances"][0]["attributes"]["triggers"] == {"k": "drifted"}
    kinds = dict(conn.execute("SELECT address, drift_kind FROM current_resource_drift").fetchall())
    assert kinds == {"null_resource.r1": "changed", "null_resource.r3": "deleted"}


def test_secrets_belong_to_the_run_that_learned_them(conn, make_state):
    seed(conn, make_state, attrs(2, secret="s3cr3t-of-this-run"))
    f = FakeFactory(world={"id1": ResourceError("provider said s3cr3t-of-this-run")})
    mine, other = Redactor(), Redactor()
    res = orchestrator.run(conn, "prod", f, RefreshOptions(actor="tester"), secrets=mine)
    assert f.secrets == [mine]  # handed down to the factory, which hands it to the provider
    assert [x.message for x in res.failures] == [f"provider said {MASK}"]
    assert mine.redact("s3cr3t-of-this-run") == MASK and not other  # nothing process-wide
    f2 = FakeFactory()
    orchestrator.run(conn, "prod", f2, RefreshOptions(actor="tester", dry_run=True))
    assert len(f2.secrets) == 1 and f2.secrets[0] is not mine  # every run gets its own


def test_one_failure_among_many_commits_nothing(conn, make_state):
    seed(conn, make_state, attrs(6))
    f = FakeFactory(world={"id2": ResourceError("boom from provider")})
    res = run(conn, f)
    assert (res.status, res.checked, res.failed, res.to_serial) == ("failed", 6, 1, None)
    assert [(x.address, x.message) for x in res.failures] == [("null_resource.r2", "boom from provider")]
    assert current(conn)[0] == 1
    row = run_row(conn, res.run_id)
    assert row[0] == "failed" and "null_resource.r2: boom from provider" in row[4] and row[6] and not row[7]


def test_fail_fast_stops_at_the_first_failure(conn, make_state):
    seed(conn, make_state, attrs(40))
    f = FakeFactory(world={"id0": ResourceError("first")})
    f.delay = 5  # the other reads are still in flight when r0 fails, so StopProvider must go out
    t0 = time.monotonic()
    res = run(conn, f, fail_fast=True, provider_parallelism=4)
    assert time.monotonic() - t0 < 4
    assert res.status == "cancelled" and "fail-fast: null_resource.r0: first" in res.error
    assert len(f.reads()) <= 4 and f.stop_calls == 1 and f.closed == 1
    assert current(conn)[0] == 1
    assert run_row(conn, res.run_id)[0] == "cancelled"


def test_dry_run_reads_everything_and_commits_nothing(conn, make_state):
    seed(conn, make_state, attrs(3))
    f = FakeFactory(world={"id0": {"id": "id0", "triggers": {"a": "b"}}})
    res = run(conn, f, dry_run=True)
    assert (res.status, res.changed, res.to_serial, res.dry_run) == ("succeeded", 1, None, True)
    assert current(conn)[0] == 1 and len(f.reads()) == 3
    assert run_row(conn, res.run_id)[:4] == ("succeeded", 3, 1, 0)


@pytest.mark.parametrize("parallelism", [1, 4])
def test_provider_parallelism_bounds_requests_in_flight(conn, make_state, parallelism):
    seed(conn, make_state, attrs(24))
    f = FakeFactory()
    f.delay = 0.02
    res = run(conn, f, provider_parallelism=parallelism)
    assert res.status == "succeeded"
    assert f.max_in_flight == parallelism
    assert res.concurrency == [{"provider": NULL, "alias": None, "mode": "fixed", "start": parallelism, "max": parallelism,
                                "final": parallelism, "throttled": 0, "reads": "threads",
                                "transport": "grpcio"}]


def test_auto_is_the_default_and_a_provider_cap_bounds_it(conn, make_state):
    seed(conn, make_state, attrs(60))
    f = FakeFactory()
    f.delay = 0.01
    res = run(conn, f)
    assert res.status == "succeeded" and res.concurrency[0]["mode"] == "auto" and res.concurrency[0]["start"] == 10
    assert 10 <= f.max_in_flight <= res.concurrency[0]["max"]  # the limit may grow after the last read started
    # The hook a fleet-wide limit fills in: neither auto nor a fixed N goes above it.
    for parallelism in ("auto", 8):
        f = FakeFactory()
        f.delay = 0.01
        res = run(conn, f, provider_parallelism=parallelism, provider_caps={NULL: 3})
        assert res.status == "succeeded" and f.max_in_flight == 3 and res.concurrency[0]["max"] == 3, parallelism


def test_reader_threads_beyond_a_lowered_limit_retire(conn, make_state, monkeypatch):
    # Kept alive, threads above the limit queue at the gate and every answer hands the slot to
    # another thread (a wake-up and a context switch per read): auto levelling off below a probe's
    # peak cost a 20,000-instance refresh 12% against a fixed 10.
    seed(conn, make_state, attrs(80))
    f = FakeFactory()
    f.delay = 0.003
    controllers: list[inflight.FixedLimit] = []

    def controller_for(parallelism, ceiling=None):
        controllers.append(inflight.FixedLimit(8))
        return controllers[-1]

    monkeypatch.setattr(inflight, "controller_for", controller_for)
    readers_alive: list[int] = []

    def on_read(ident):
        reads = len(f.reads())
        if reads == 16:
            controllers[0].set_ceiling(2)  # as auto cutting from 8 to 2
        elif reads > 50:
            readers_alive.append(sum(1 for t in threading.enumerate() if t.name.startswith("kl-read-") and t.is_alive()))

    f.on_read = on_read
    res = run(conn, f, dry_run=True)
    assert res.status == "succeeded" and res.checked == 80
    # 2 readers, and at most one more on its way out (it has returned, the thread not quite ended).
    assert readers_alive and max(readers_alive[-10:]) <= 3, readers_alive


def test_throttled_reads_are_retried_until_the_rpc_timeout(conn, make_state):
    seed(conn, make_state, attrs(4))
    f = FakeFactory()
    answers = {"id1": 2, "id2": 1000}  # throttled this many times before a good answer

    def on_read(ident):
        with f.lock:
            left = answers.get(ident, 0)
            answers[ident] = left - 1
        if left > 0:
            raise ThrottledError("ReadResource null_resource: api error Throttling: Rate exceeded")

    f.on_read = on_read
    res = run(conn, f, provider_parallelism=2, rpc_timeout=1.0, dry_run=True)
    reads = [c[1] for c in f.reads()]
    assert reads.count("id1") == 3 and reads.count("id0") == 1  # id1: two throttled answers, then a good one
    assert [fl.address for fl in res.failures] == ["null_resource.r2"]  # id2 never got through within 1 s
    message = res.failures[0].message
    assert message.startswith("ReadResource null_resource: api error Throttling: Rate exceeded (throttled ")
    assert message.endswith("the --rpc-timeout per instance)")
    assert 3 <= reads.count("id2") <= 8  # 0.1-0.2 s, 0.2-0.4 s, ... until 1 s has gone
    assert res.concurrency[0]["throttled"] == 2 + reads.count("id2")
    assert res.concurrency[0]["mode"] == "fixed" and res.concurrency[0]["final"] == 2  # fixed: retried, not adapted


def test_groups_by_provider_and_alias(conn):
    doc = {"version": 4, "serial": 1, "lineage": "l", "resources": [
        {"mode": "managed", "type": "null_resource", "name": "a", "provider": f'provider["{NULL}"]',
         "instances": [{"schema_version": 0, "attributes": {"id": "a"}}]},
        {"mode": "managed", "type": "null_resource", "name": "b", "provider": f'provider["{NULL}"].alt',
         "instances": [{"schema_version": 0, "attributes": {"id": "b"}}]},
        {"mode": "data", "type": "null_data_source", "name": "d", "provider": f'provider["{NULL}"]',
         "instances": [{"schema_version": 0, "attributes": {"id": "d"}}]},
    ]}
    raw = json.dumps(doc).encode()
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source="apply", actor="t")
    f = FakeFactory()
    res = run(conn, f, concurrency=1)
    assert sorted(f.opened) == [(NULL, ""), (NULL, "alt")]
    assert res.checked == 2 and sorted(c[1] for c in f.reads()) == ["a", "b"]  # the data source is not read
    assert [r["mode"] for r in current(conn)[2]["resources"]] == ["managed", "managed", "data"]


def _apply_during_the_reads(db_url, make_state):
    import psycopg

    def concurrent_apply(ident):
        if ident == "id1":
            with psycopg.connect(db_url) as other:
                seed(other, make_state, attrs(2, triggers={"x": "y"}), serial=2)
    return concurrent_apply


def test_state_moved_during_the_run_commits_nothing(conn, db_url, make_state):
    seed(conn, make_state, attrs(2))
    conn.commit()
    f = FakeFactory()
    f.on_read = _apply_during_the_reads(db_url, make_state)
    res = run(conn, f, provider_parallelism=1, commit=True)
    assert res.status == "failed" and "changed while this run was in progress" in res.error
    assert current(conn)[:2] == (2, "apply")
    assert conn.execute("SELECT count(*) FROM state_locks").fetchone()[0] == 0


def test_an_observation_whose_base_moved_during_the_reads_is_kept_and_opens_no_drift(conn, db_url, make_state):
    # What the run read of v1 may be half Terraform's apply: it stays an observation of v1, and the
    # drift is what the next run finds against v2.
    seed(conn, make_state, attrs(2))
    conn.commit()
    f = FakeFactory(world={"id0": {"id": "id0", "triggers": {"k": "drifted"}}})
    f.on_read = _apply_during_the_reads(db_url, make_state)
    res = run(conn, f, provider_parallelism=1)
    assert (res.status, res.observation, res.base_moved, res.changed) == ("succeeded", "v1.1", True, 1)
    assert current(conn)[:2] == (2, "apply")
    assert conn.execute("SELECT count(*) FROM drift_records").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM observed_objects").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM state_locks").fetchone()[0] == 0
    res = run(conn, FakeFactory(world={"id0": {"id": "id0", "triggers": {"k": "drifted"}}}))
    assert (res.observation, res.base_moved) == ("v2.1", False)
    assert conn.execute("SELECT address, drift_kind, detected_serial FROM current_resource_drift").fetchall() == [
        ("null_resource.r0", "changed", 2)]


def test_an_observation_read_while_an_apply_took_the_lock_opens_no_drift(conn, db_url, make_state):
    # The apply took its lock after the run began and changed the object (a replacement) before
    # the read; it has not written its version yet when the observation is recorded. What was read
    # is the apply's work, not drift: the observation is kept and opens nothing.
    import psycopg

    seed(conn, make_state, attrs(2))
    sid = states.state_id(conn, "prod")
    conn.commit()
    info = locks.lock_info("OperationTypeApply", "bob@ci", "1.8.5")

    def apply_begins(ident):
        if ident == "id0":
            with psycopg.connect(db_url, autocommit=True) as other:
                locks.acquire(other, sid, "prod", info, "bob")

    f = FakeFactory(world={"id1": {"id": "id1", "triggers": {"k": "being-applied"}}})
    f.on_read = apply_begins
    res = run(conn, f, provider_parallelism=1)
    assert (res.status, res.observation, res.changed, res.base_moved, res.base_locked) == (
        "succeeded", "v1.1", 1, False, True), res.error
    assert conn.execute("SELECT count(*) FROM drift_records").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM notify_events").fetchone() == (0,)
    assert locks.current(conn, sid) == info  # the apply's lock, untouched

    # The apply ends without writing a version (it failed, say), so what stayed different is drift.
    locks.release(conn, sid, info["ID"], "bob")
    res = run(conn, FakeFactory(world={"id1": {"id": "id1", "triggers": {"k": "being-applied"}}}))
    assert (res.observation, res.base_locked) == ("v1.2", False)
    assert conn.execute("SELECT address, drift_kind FROM current_resource_drift").fetchall() == [
        ("null_resource.r1", "changed")]


def test_locked_state_is_refused(conn, make_state):
    seed(conn, make_state, attrs(2))
    sid = states.state_id(conn, "prod")
    locks.acquire(conn, sid, "prod", locks.lock_info("OperationTypeApply", "alice@laptop", "1.0.3"), "alice")
    f = FakeFactory()
    res = run(conn, f)
    assert res.status == "failed" and "locked by alice@laptop (OperationTypeApply" in res.error
    assert f.calls == [] and current(conn)[0] == 1


def test_mass_removal_needs_the_flag(conn, make_state):
    seed(conn, make_state, attrs(4))
    world = {f"id{i}": None for i in range(3)}
    res = run(conn, FakeFactory(world=world))
    assert res.status == "failed" and "3 of 4 instances" in res.error and "--allow-mass-removal" in res.error
    assert current(conn)[0] == 1
    assert "3 of 4" in run_row(conn, res.run_id)[4]
    res = run(conn, FakeFactory(world=world), allow_mass_removal=True)
    assert res.status == "succeeded" and res.observation == "v1.1"
    assert len(observed(conn)[1]["resources"]) == 1


def test_upgrade_gate(conn, make_state):
    seed(conn, make_state, {"old": {"id": "old", "legacy_field": "x"}, "plain": {"id": "plain"}})
    f = FakeFactory()
    res = run(conn, f)
    assert [c for c in f.calls if c[0] == "upgrade"] == [("upgrade", "old")]  # only the one that does not fit
    assert res.changed_addresses == ["null_resource.old"]
    f2 = FakeFactory(schema_versions={"null_resource": 2})
    res = run(conn, f2)
    assert sorted(c[1] for c in f2.calls if c[0] == "upgrade") == ["old", "plain"]
    assert {i["schema_version"] for r in observed(conn)[1]["resources"] for i in r["instances"]} == {2}
    f3 = FakeFactory(schema_versions={"null_resource": 2})
    run(conn, f3, always_upgrade=True)
    assert len([c for c in f3.calls if c[0] == "upgrade"]) == 2


def test_newer_schema_in_state_and_failed_upgrade_are_per_resource_errors(conn, make_state):
    raw = make_state(1, {"a": {"id": "a"}, "b": {"id": "b"}})
    doc = json.loads(raw)
    doc["resources"][0]["instances"][0]["schema_version"] = 5
    raw = json.dumps(doc).encode()
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source="apply", actor="t")
    f = FakeFactory(schema_versions={"null_resource": 1})
    f.fail_upgrade = {"b"}
    res = run(conn, f)
    msgs = {x.address: x.message for x in res.failures}
    assert "managed by a newer provider version (state has schema version 5" in msgs["null_resource.a"]
    assert msgs["null_resource.b"] == "upgrade failed: provider said no"
    assert f.reads() == []  # no ReadResource after a failed or refused upgrade


def test_timeout_cancels_stops_providers_and_commits_nothing(conn, make_state):
    seed(conn, make_state, attrs(5))
    f = FakeFactory()
    f.delay = 30
    t0 = time.monotonic()
    res = run(conn, f, timeout=0.3)
    assert time.monotonic() - t0 < 10
    assert res.status == "cancelled" and res.error == "timed out after 0.3s"
    assert f.stop_calls == 1 and f.closed == 1 and current(conn)[0] == 1
    assert run_row(conn, res.run_id)[0] == "cancelled"


def _cancel_when_reading(f: FakeFactory, cancel: orchestrator.Cancellation, *, again: bool) -> None:
    """Cancel once a read is in flight, as a signal would; AGAIN: a second signal right after."""
    def watch() -> None:
        deadline = time.monotonic() + 60
        while not f.in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        cancel.cancel("interrupted (SIGINT)")
        if again:
            cancel.cancel("interrupted (SIGINT)", at_once=True)

    threading.Thread(target=watch, daemon=True).start()


@pytest.mark.parametrize("again", [False, True], ids=["after-the-grace", "second-signal"])
def test_a_read_stop_does_not_end_is_ended_by_shutting_its_provider_down(conn, make_state, monkeypatch, again):
    # The grace: short, or (for the second signal, which must not wait it out) longer than the read.
    monkeypatch.setenv("KL_STOP_GRACE", "10m" if again else "200ms")
    seed(conn, make_state, attrs(3))
    f = FakeFactory()
    f.delay, f.deaf_to_stop = 60, True  # before, the run waited for the read (--rpc-timeout in real life)
    cancel = orchestrator.Cancellation()
    _cancel_when_reading(f, cancel, again=again)
    res = orchestrator.run(conn, "prod", f, RefreshOptions(actor="tester", workdir=str(REPO)), cancel=cancel)
    assert (res.status, res.error) == ("cancelled", "interrupted (SIGINT)")
    assert (f.shut_downs, f.closed) == ([again], 1)
    assert run_row(conn, res.run_id)[0] == "cancelled" and current(conn)[0] == 1


def test_a_bad_stop_grace_is_refused_before_the_run_begins(conn, make_state, monkeypatch):
    monkeypatch.setenv("KL_STOP_GRACE", "soon")
    seed(conn, make_state, attrs(1))
    with pytest.raises(KlError, match="^KL_STOP_GRACE: invalid duration 'soon'"):
        run(conn, FakeFactory())
    assert conn.execute("SELECT count(*) FROM refresh_runs").fetchone() == (0,)


class _WatchedCancellation(orchestrator.Cancellation):
    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return super().wait(timeout)


def test_the_run_goes_on_the_moment_its_groups_end_not_at_a_poll_of_the_cancel_flag(conn, make_state):
    # A sleep on the cancel flag between checks of the groups added up to its interval (50 ms)
    # to every run: a fifth of a small refresh.
    seed(conn, make_state, attrs(3))
    f = FakeFactory()
    f.delay = 0.1  # the groups are still running when the run starts waiting for them
    cancel = _WatchedCancellation()
    res = orchestrator.run(conn, "prod", f, RefreshOptions(actor="tester", workdir=str(REPO)), cancel=cancel)
    assert res.status == "succeeded" and res.checked == 3
    assert cancel.waits == []


def test_provider_that_cannot_be_opened_fails_its_group(conn, make_state):
    seed(conn, make_state, attrs(2))
    f = FakeFactory()
    f.fail_open = KlError("no binary for registry.terraform.io/hashicorp/null (looked in /x)")
    res = run(conn, f)
    assert res.status == "failed" and res.failed == 2
    assert res.failures[0].message.startswith("provider registry.terraform.io/hashicorp/null: no binary")
    # Reported once for the group, naming its instances; nothing was read, so nothing was checked.
    assert [(x.address, x.provider, x.addresses) for x in res.failures] == [
        (None, NULL, ["null_resource.r0", "null_resource.r1"])]
    assert res.checked == 0 and run_row(conn, res.run_id)[1] == 0


def test_dry_run_result_carries_attribute_diffs_masked(conn, make_state):
    seed(conn, make_state, {"a": {"id": "a", "triggers": {"k": "old"}, "secret": "s3cr3t"}, "b": {"id": "b"},
                            "c": {"id": "c"}})
    f = FakeFactory(world={"a": {"id": "a", "triggers": {"k": "new"}, "secret": "s3cr3t-2"}, "b": None})
    res = run(conn, f, dry_run=True)
    assert res.status == "succeeded" and res.to_serial is None and res.changed_addresses == ["null_resource.a", "null_resource.b"]
    assert res.drift == [
        {"address": "null_resource.a", "deposed": None, "kind": "changed",
         "changes": [{"path": "secret", "before": MASK, "after": MASK}, {"path": 'triggers["k"]', "before": "old", "after": "new"}],
         "status": "open", "ignored_by": None},
        {"address": "null_resource.b", "deposed": None, "kind": "deleted", "changes": [], "status": "open", "ignored_by": None},
    ]


def test_a_dry_run_judges_what_it_found_as_the_drift_records_would(conn, make_state):
    """Before committing, each finding gets the status its record would have: a change back to
    what the last apply wrote resolves the open record; rules combine over its changes."""
    from kilolock.schema import path_parse
    from kilolock.store import ignore_rules

    seed(conn, make_state, {"a": {"id": "a", "triggers": {"k": "1"}}, "b": {"id": "b", "triggers": {"k": "1"}}})
    assert run(conn, FakeFactory(world={"a": {"id": "a", "triggers": {"k": "2"}}})).observation is not None  # a: open drift
    ids = [ignore_rules.add_rule(conn, ignore_rules.NewRule("**", "null_resource.b", path_parse(path)), "t")
           for path in ('triggers["k"]', "id")]
    f = FakeFactory(world={"a": {"id": "a", "triggers": {"k": "1"}}, "b": {"id": "b2", "triggers": {"k": "2"}}})
    res = run(conn, f, dry_run=True)
    assert [(d["address"], d["status"]) for d in res.drift] == [("null_resource.a", "resolved"), ("null_resource.b", "ignored")]
    assert [r["rule"] for r in res.drift[1]["ignored_by"]["rules"]] == ids


def test_sensitive_paths_union_of_prior_and_schema(conn, make_state):
    raw = make_state(1, {"a": {"id": "a", "secret": "s3cr3t", "triggers": {"k": "v"}}})
    doc = json.loads(raw)
    doc["resources"][0]["instances"][0]["sensitive_attributes"] = [
        [{"type": "get_attr", "value": "triggers"}, {"type": "index", "value": {"value": "k", "type": "string"}}],
        [{"type": "get_attr", "value": "vanished"}],
    ]
    raw = json.dumps(doc).encode()
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source="apply", actor="t")
    run(conn, FakeFactory())
    inst = observed(conn)[1]["resources"][0]["instances"][0]
    assert inst["sensitive_attributes"] == [
        [{"type": "get_attr", "value": "secret"}],
        [{"type": "get_attr", "value": "triggers"}, {"type": "index", "value": {"value": "k", "type": "string"}}],
    ]


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("5m", 300), ("1h", 3600), ("1m30s", 90), ("500ms", 0.5), ("1d", 86400), ("1d12h", 129600)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5x", "-1s", "0s", "s"])
def test_parse_duration_rejects(text):
    with pytest.raises(KlError):
        parse_duration(text)


def test_incremental_lifecycle_index_equals_a_full_reindex(conn, make_state):
    raw = make_state(1, {"same": {"id": "s", "triggers": None}, "drifts": {"id": "d", "triggers": None},
                         "gone": {"id": "g", "triggers": None}, "marked": {"id": "m", "secret": "x", "triggers": None},
                         "old": {"id": "o", "legacy_field": 1, "triggers": None}})
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source="apply", actor="t")
    f = FakeFactory(world={"d": {"id": "d", "triggers": {"k": "v"}}, "g": None})
    res = run(conn, f, commit=True)
    assert res.status == "succeeded" and res.changed_addresses == ["null_resource.drifts", "null_resource.gone", "null_resource.old"]
    latest = conn.execute("SELECT kl_version_document(id)::text FROM state_versions ORDER BY serial DESC LIMIT 1").fetchone()[0].encode()
    writes.store_document(conn, "reindexed", tfstate.parse_state(latest), latest, source="import", actor="t")

    def open_rows(name):
        return sorted(conn.execute(
            """SELECT r.address, r.deposed, r.content_hash FROM resources r JOIN states s ON s.id = r.state_id
               WHERE s.name = %s AND r.delete_serial IS NULL""", (name,)).fetchall())

    assert open_rows("prod") == open_rows("reindexed")
    # only what drifted got a new lifecycle; the newly marked object kept its own (marks are
    # metadata, updated in place), as did the rest
    reopened = {a for (a,) in conn.execute(
        "SELECT address FROM resources r JOIN state_versions v ON v.id = r.opened_by_version_id WHERE v.source = 'refresh'")}
    assert reopened == {"null_resource.drifts", "null_resource.old"}
    assert conn.execute("SELECT sensitive_attributes <> '[]' FROM resources WHERE address = 'null_resource.marked'").fetchone() == (True,)


def test_an_observation_records_the_objects_it_found_different_and_leaves_the_index_alone(conn, make_state):
    raw = make_state(1, {"same": {"id": "s", "triggers": None}, "drifts": {"id": "d", "triggers": None},
                         "gone": {"id": "g", "triggers": None}, "marked": {"id": "m", "secret": "x", "triggers": None}})
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source="apply", actor="t")
    index_before = conn.execute("SELECT id, address, delete_serial, sensitive_attributes FROM resources ORDER BY id").fetchall()
    res = run(conn, FakeFactory(world={"d": {"id": "d", "triggers": {"k": "v"}}, "g": None}))
    assert res.observation == "v1.1"
    # A change of marks alone (the schema marks `secret`) is metadata: not a difference.
    assert conn.execute("SELECT address, gone, attributes -> 'triggers' FROM observed_objects ORDER BY address").fetchall() == [
        ("null_resource.drifts", False, {"k": "v"}), ("null_resource.gone", True, None)]
    assert conn.execute("SELECT id, address, delete_serial, sensitive_attributes FROM resources ORDER BY id").fetchall() == index_before
    assert dict(conn.execute("SELECT address, drift_kind FROM current_resource_drift").fetchall()) == {
        "null_resource.drifts": "changed", "null_resource.gone": "deleted"}


def test_runs_stale_marks_only_runs_whose_process_is_gone(conn, db_url, make_state, run_kl):
    import psycopg

    from kilolock.store import refresh_runs

    seed(conn, make_state, attrs(1))
    sid = states.state_id(conn, "prod")
    vid = conn.execute("SELECT id FROM state_versions").fetchone()[0]
    alive = psycopg.connect(db_url, autocommit=True)
    dead = psycopg.connect(db_url, autocommit=True)
    dead_run = refresh_runs.begin(dead, sid, str(vid), "dead")
    dead.close()  # the process died: its session (and advisory lock) is gone
    live_run = refresh_runs.begin(alive, sid, str(vid), "live")  # not refused: the dead run is not live
    r = run_kl("runs", "prod", "--stale", "--format", "json")
    assert r.returncode == 0, r.stderr
    runs = {x["id"]: x for x in json.loads(r.stdout)["runs"]}
    assert runs[dead_run]["status"] == "failed" and "stale" in runs[dead_run]["error_summary"]
    assert runs[live_run]["status"] == "running"
    assert b"1 stale run(s) marked failed" in r.stderr
    refresh_runs.finish(alive, live_run, status="succeeded", checked=0, changed=0, failed=0, error_summary=None, to_version_id=None)
    alive.close()


# --- where providers run, and waiting for locks (issue 12) -----------------------------------------


def test_a_deletion_found_without_a_workdir_is_not_committed_even_one_alone(conn, make_state):
    # One instance gone is below the mass-removal guard; without a workdir it may be a relative path
    # read from the wrong directory, so nothing is committed and the message names the fix.
    seed(conn, make_state, attrs(3))
    res = run(conn, FakeFactory(world={"id2": None}), workdir=None)
    assert res.status == "failed" and res.to_serial is None and res.changed_addresses == ["null_resource.r2"]
    assert "1 instance(s) came back deleted (first: null_resource.r2) and state 'prod' has no workdir" in res.error
    assert "`kl state set prod --workdir DIR`" in res.error and "\n" not in res.error
    assert current(conn)[0] == 1 and run_row(conn, res.run_id)[0] == "failed"
    # A change that deletes nothing commits as before, workdir or not.
    res = run(conn, FakeFactory(world={"id1": {"id": "id1", "triggers": {"k": "v"}}}), workdir=None)
    assert res.status == "succeeded" and res.observation == "v1.1"
    # With a workdir the same deletion is reality.
    res = run(conn, FakeFactory(world={"id2": None}))
    assert res.status == "succeeded" and res.observation == "v1.2"


def test_a_workdir_missing_on_this_host_fails_before_any_provider_starts(conn, make_state, tmp_path):
    seed(conn, make_state, attrs(2))
    f = FakeFactory()
    res = run(conn, f, workdir=str(tmp_path / "elsewhere"))
    assert res.status == "failed" and f.opened == [] and f.calls == []
    assert res.error.startswith(f"workdir {tmp_path / 'elsewhere'} of state 'prod' does not exist on this host; nothing was refreshed")
    assert run_row(conn, res.run_id)[0] == "failed" and current(conn)[0] == 1


def hold_lock(conn, who="alice@laptop"):
    sid = states.state_id(conn, "prod")
    info = locks.lock_info("OperationTypeApply", who, "1.0.3")
    locks.acquire(conn, sid, "prod", info, "alice")
    return sid, info


def test_a_dry_run_reads_a_locked_state_and_writes_nothing(conn, make_state):
    seed(conn, make_state, attrs(2))
    sid, info = hold_lock(conn)
    f = FakeFactory(world={"id1": {"id": "id1", "triggers": {"k": "v"}}})
    res = run(conn, f, dry_run=True)
    assert res.status == "succeeded" and res.to_serial is None and res.changed_addresses == ["null_resource.r1"]
    assert len(f.reads()) == 2 and current(conn)[0] == 1
    assert locks.current(conn, sid) == info  # still held, untouched


def test_lock_timeout_waits_for_the_holder_at_the_start(conn, db_url, make_state):
    import psycopg

    seed(conn, make_state, attrs(2))
    sid, info = hold_lock(conn)
    conn.commit()
    waits = []

    def release_later():
        time.sleep(0.6)
        with psycopg.connect(db_url, autocommit=True) as other:
            locks.release(other, sid, info["ID"], "alice")

    t = threading.Thread(target=release_later)
    t.start()
    try:
        res = orchestrator.run(conn, "prod", FakeFactory(), RefreshOptions(actor="tester", workdir=str(REPO), lock_timeout=10),
                               on_lock_wait=lambda holder, waited, timeout: waits.append((holder["ID"], waited, timeout)))
    finally:
        t.join()
    assert res.status == "succeeded" and res.observation == "v1.1", res.error
    assert waits and {w[0] for w in waits} == {info["ID"]} and all(w[2] == 10 for w in waits)
    assert waits[-1][1] >= 0.3  # it really waited, with more than one retry


def test_lock_timeout_gives_up_saying_how_long_it_waited(conn, make_state):
    seed(conn, make_state, attrs(2))
    hold_lock(conn)
    started = time.monotonic()
    f = FakeFactory()
    res = run(conn, f, lock_timeout=0.5)
    assert 0.5 <= time.monotonic() - started < 5
    assert res.status == "failed" and "locked by alice@laptop" in res.error and res.error.endswith("waited 0.5s (--lock-timeout)")
    assert f.calls == [] and current(conn)[0] == 1
    # Without --lock-timeout the refusal says what would help.
    res = run(conn, FakeFactory())
    assert "--lock-timeout DURATION waits for it; --dry-run does not need it" in res.error


def test_lock_timeout_waits_for_a_lock_taken_during_the_reads_then_commits(conn, db_url, make_state):
    import psycopg

    seed(conn, make_state, attrs(2))
    conn.commit()
    sid = states.state_id(conn, "prod")
    taken: list[dict] = []
    releaser: list[threading.Thread] = []

    def lock_meanwhile(ident):
        if ident == "id1" and not taken:
            with psycopg.connect(db_url, autocommit=True) as other:
                info = locks.lock_info("OperationTypeApply", "bob@ci", "1.0.3")
                locks.acquire(other, sid, "prod", info, "bob")
            taken.append(info)

            def release_later():
                time.sleep(0.6)
                with psycopg.connect(db_url, autocommit=True) as other:
                    locks.release(other, sid, info["ID"], "bob")

            releaser.append(threading.Thread(target=release_later))
            releaser[0].start()

    f = FakeFactory()
    f.on_read = lock_meanwhile
    waits = []
    res = orchestrator.run(conn, "prod", f, RefreshOptions(actor="tester", workdir=str(REPO), lock_timeout=10, provider_parallelism=1,
                                                           commit=True),
                           on_lock_wait=lambda holder, waited, timeout: waits.append(holder["Who"]))
    releaser[0].join()
    assert res.status == "succeeded" and res.to_serial == 2, res.error
    assert waits and set(waits) == {"bob@ci"}
    assert conn.execute("SELECT count(*) FROM state_locks").fetchone()[0] == 0


def test_an_observation_needs_no_lock_at_its_end_and_a_plans_lock_does_not_stop_it(conn, db_url, make_state):
    import psycopg

    seed(conn, make_state, attrs(2))
    sid = states.state_id(conn, "prod")
    conn.commit()

    def lock_meanwhile(ident):
        if ident == "id1":
            with psycopg.connect(db_url, autocommit=True) as other:
                locks.acquire(other, sid, "prod", locks.lock_info("OperationTypeApply", "bob@ci", "1.0.3"), "bob")

    f = FakeFactory()
    f.on_read = lock_meanwhile
    waits: list[str] = []
    res = orchestrator.run(conn, "prod", f, RefreshOptions(actor="tester", workdir=str(REPO), provider_parallelism=1),
                           on_lock_wait=lambda holder, waited, timeout: waits.append(holder["Who"]))
    assert (res.status, res.observation, waits) == ("succeeded", "v1.1", [])
    held = locks.current(conn, sid)
    assert held is not None and held["Who"] == "bob@ci"  # the apply's lock, untouched
    locks.unlock_by_id(conn, sid, "prod", held["ID"], "t")
    # terraform plan holds the lock while it plans: the saved plan is unaffected by an observation.
    locks.acquire(conn, sid, "prod", locks.lock_info("OperationTypePlan", "carol@laptop", "1.8.5"), "carol")
    res = run(conn, FakeFactory())
    assert (res.status, res.observation) == ("succeeded", "v1.2")
    res = run(conn, FakeFactory(), commit=True)  # a commit writes Terraform's state: the plan's lock stops it
    assert res.status == "failed" and "locked by carol@laptop (OperationTypePlan" in res.error


def test_cancelling_while_waiting_for_a_lock_ends_the_run_cancelled(conn, make_state):
    seed(conn, make_state, attrs(2))
    hold_lock(conn)
    cancel = orchestrator.Cancellation()
    threading.Timer(0.3, cancel.cancel, args=("interrupted (SIGINT)",)).start()
    started = time.monotonic()
    res = orchestrator.run(conn, "prod", FakeFactory(), RefreshOptions(actor="tester", workdir=str(REPO), lock_timeout=60),
                           cancel=cancel)
    assert time.monotonic() - started < 5
    assert (res.status, res.error) == ("cancelled", "interrupted (SIGINT)")
    assert run_row(conn, res.run_id)[0] == "cancelled"


def test_unlock_by_id_releases_only_the_named_lock(conn, make_state):
    seed(conn, make_state, attrs(1))
    sid, info = hold_lock(conn)
    with pytest.raises(locks.StateLocked, match="its lock ID is not wrong-id; nothing unlocked"):
        locks.unlock_by_id(conn, sid, "prod", "wrong-id", "ops")
    assert locks.current(conn, sid) == info
    assert locks.unlock_by_id(conn, sid, "prod", info["ID"], "ops") == info
    assert locks.current(conn, sid) is None and locks.unlock_by_id(conn, sid, "prod", info["ID"], "ops") is None
    ev = conn.execute("SELECT event, lock_id, who, actor FROM lock_events ORDER BY created_at DESC LIMIT 1").fetchone()
    assert ev == ("force_unlock", info["ID"], "alice@laptop", "ops")


def test_flatmap_objects_are_upgraded_from_flatmap_with_sensitive_values_masked_first(conn):
    raw = json.dumps({"version": 4, "terraform_version": "1.2.5", "serial": 1, "lineage": "l", "resources": [
        {"mode": "managed", "type": "null_resource", "name": f"r{i}", "provider": "provider.null",
         "instances": [{"schema_version": 0, "attributes_flat": {"id": f"id{i}", "secret": f"flat-s3cret-{i}",
                                                                  "triggers.%": "1", "triggers.k": "v"}}]}
        for i in range(2)]}).encode()
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source="import", actor="t")
    f = FakeFactory()
    f.fail_upgrade = {"id1"}
    res = run(conn, f)
    assert f.opened == [(NULL, "")]  # provider.null is hashicorp/null
    assert [(x.address, x.message) for x in res.failures] == [
        ("null_resource.r1", f"cannot upgrade {{'id': 'id1', 'secret': '{MASK}', 'triggers.%': '1', 'triggers.k': 'v'}}")]
    f.fail_upgrade = set()
    res = run(conn, f)
    assert (res.status, res.changed, res.reshaped) == ("succeeded", 0, ["null_resource.r0", "null_resource.r1"])
    modern = f'provider["{NULL}"]'
    assert res.provider_addresses == {"provider.null": modern}
    for doc in (observed(conn)[1], run(conn, f, commit=True) and current(conn)[2]):
        obj = doc["resources"][0]["instances"][0]
        assert "attributes_flat" not in obj and obj["attributes"] == {"id": "id0", "secret": "flat-s3cret-0", "triggers": {"k": "v"}}
        assert [r["provider"] for r in doc["resources"]] == [modern, modern]
    # The first structured form is not a difference; the commit gives the lifecycles that form.
    assert conn.execute("SELECT count(*) FROM observed_objects").fetchone() == (0,)
    assert conn.execute("SELECT count(*), min(create_serial), bool_and(attributes IS NOT NULL) FROM resources").fetchone() == (2, 1, True)


def test_an_accept_of_what_is_not_drift_writes_it_and_one_of_nothing_writes_nothing(conn):
    from kilolock.refresh import accept

    raw = json.dumps({"version": 4, "terraform_version": "0.12.31", "serial": 1, "lineage": "l", "resources": [
        {"mode": "managed", "type": "null_resource", "name": f"r{i}", "provider": "provider.null",
         "instances": [{"schema_version": 0, "attributes": {"id": f"id{i}", "triggers": None}}]}
        for i in range(2)]}).encode()
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source="import", actor="t")
    res = run(conn, FakeFactory())
    assert (res.observation, res.changed, list(res.provider_addresses)) == ("v1.1", 0, ["provider.null"])
    accepting = accept.plan(conn, "prod")
    assert accepting.metadata_only and accepting.accepted == []
    written = accept.accept(conn, accepting, "tester")
    assert written is not None and written.serial == 2
    assert [r["provider"] for r in current(conn)[2]["resources"]] == [f'provider["{NULL}"]'] * 2
    # Observed again against v2: the same objects, the same addresses; nothing to accept.
    again = run(conn, FakeFactory(), commit=True)  # the accept took the provider's private data too
    assert (again.to_serial, again.observation) == (None, "v2.1")
    assert run(conn, FakeFactory()).observation == "v2.2"
    nothing = accept.plan(conn, "prod")
    assert not nothing.writes and accept.accept(conn, nothing, "tester") is None and current(conn)[0] == 2


def test_drift_names_the_observations_that_found_and_confirmed_it(conn, make_state):
    # An observation carries its base's serial, so the serials alone say v1 three times: the
    # versions say which observation found the drift and which last saw it.
    from kilolock import drift
    from kilolock.store import drift as drift_store

    seed(conn, make_state, attrs(3))
    world = {"id1": {"id": "id1", "triggers": {"k": "drifted"}}}
    labels = [run(conn, FakeFactory(world=world)).observation for _ in range(2)]
    assert labels == ["v1.1", "v1.2"]

    def entries(**kw):
        return [drift.entry(r) for r in drift_store.list_drift(conn, "prod", **kw)]

    [e] = entries()
    assert (e["detected_serial"], e["first_detected"]["serial"], e["last_confirmed_serial"]) == (1, 1, 1)
    assert (e["first_detected"]["version"], e["last_confirmed_version"]) == ("v1.1", "v1.2")
    assert e["detected_version"] == "v1.1"  # the one that found the current value: v1.2 found it again
    # An apply resolves it; the record keeps the last observation before that.
    raw = make_state(2, {f"r{i}": {"id": f"id{i}", "triggers": {"k": "drifted"} if i == 1 else None} for i in range(3)})
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source="apply", actor="t")
    assert run(conn, FakeFactory(world=world)).observation == "v2.1"
    [resolved] = entries(include_resolved=True)
    assert (resolved["status"], resolved["last_confirmed_version"]) == ("resolved", "v1.2")
