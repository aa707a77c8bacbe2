"""The refresh service (kilolock.refresh.service): the one chain from a state's name to
orchestrator.run that `kl refresh STATE`, `kl refresh --all` and the fleet worker share. Fakes
below the refresh seam (kit.fakeprovider), a real database above it."""
from __future__ import annotations

import sys
import threading
from typing import Any

import psycopg
import pytest

from kilolock import tfstate
from kilolock.refresh import service
from kilolock.refresh.options import RefreshOptions, RefreshOverrides
from kilolock.store import locks, provider_limits, refresh_runs, settings, states, versions, writes
from kilolock.store.errors import StateNotFound
from kilolock.store.refresh_runs import StateBusy
from kilolock.store.settings import StateSettings
from kit.fakeprovider import NULL, FakeFactory
from kit.fleet import wait_for
from kit.paths import REPO

WORKDIR = str(REPO)


class Source:
    """A FactorySource that hands out one FakeFactory and remembers what each run asked for."""

    def __init__(self, factory: FakeFactory | None = None) -> None:
        self.factory = factory or FakeFactory()
        self.asked: list[tuple[str, RefreshOptions]] = []

    def __call__(self, conn: psycopg.Connection, state_id: str, options: RefreshOptions) -> FakeFactory:
        self.asked.append((state_id, options))
        return self.factory


def seed(conn, make_state, name: str = "prod", instances: int = 3) -> str:
    raw = make_state(1, {f"r{i}": {"id": f"id{i}", "triggers": None} for i in range(instances)})
    writes.store_document(conn, name, tfstate.parse_state(raw), raw, source="apply", actor="t")
    return states.state_id(conn, name)


def store(conn, sid: str, **values: Any) -> None:
    settings.update(conn, sid, settings.Changes(values), "t")


def serials(conn, name: str = "prod") -> list[int]:
    return [r[0] for r in conn.execute("SELECT serial FROM state_versions v JOIN states s ON s.id = v.state_id "
                                       "WHERE s.name = %s ORDER BY serial", (name,))]


# ---------------------------------------------------------------- resolving the options

def test_an_override_wins_over_the_stored_setting_which_wins_over_the_default() -> None:
    stored = StateSettings(workdir="/stored/wd", provider_search_paths=("/stored/p",), provider_parallelism=3,
                           actor="stored@ci")
    told = RefreshOverrides(workdir="/flag/wd", search_paths=("/flag/p",), provider_parallelism="auto",
                            actor="flag@cli", default_actor="me@cli")
    assert RefreshOptions.resolve(told, stored) == RefreshOptions(
        workdir="/flag/wd", search_paths=("/flag/p",), provider_parallelism="auto", actor="flag@cli")
    nothing_said = RefreshOverrides(default_actor="me@cli")
    assert RefreshOptions.resolve(nothing_said, stored) == RefreshOptions(
        workdir="/stored/wd", search_paths=("/stored/p",), provider_parallelism=3, actor="stored@ci")
    for none_stored in (None, StateSettings()):
        assert RefreshOptions.resolve(nothing_said, none_stored) == RefreshOptions(
            workdir=None, search_paths=(), provider_parallelism="auto", actor="me@cli")


def test_what_is_never_stored_comes_from_the_overrides_alone() -> None:
    told = RefreshOverrides(dry_run=True, fail_fast=True, concurrency=3, lock_timeout=5.0, timeout=60.0,
                            rpc_timeout=30.0, always_upgrade=True, allow_mass_removal=True)
    got = RefreshOptions.resolve(told, StateSettings(actor="stored@ci"))
    assert (got.dry_run, got.fail_fast, got.concurrency, got.lock_timeout, got.timeout, got.rpc_timeout,
            got.always_upgrade, got.allow_mass_removal) == (True, True, 3, 5.0, 60.0, 30.0, True, True)
    assert RefreshOptions.resolve(RefreshOverrides(), None).concurrency >= 1  # the CPU count


def test_the_run_gets_the_stored_settings_under_the_overrides(conn, make_state) -> None:
    sid = seed(conn, make_state)
    store(conn, sid, workdir=WORKDIR, actor="stored@ci", provider_parallelism="2")
    source = Source()
    result = service.refresh_one(conn, "prod", RefreshOverrides(default_actor="me@cli"), factories=source)
    assert result.status == "succeeded"
    [(asked_sid, options)] = source.asked
    assert (asked_sid, options.workdir, options.actor, options.provider_parallelism) == (sid, WORKDIR, "stored@ci", 2)
    # The audit row says who ran it: the stored actor, as the run was told nothing else.
    assert conn.execute("SELECT actor FROM refresh_runs WHERE id = %s", (result.run_id,)).fetchone() == ("stored@ci",)

    flagged = service.refresh_one(conn, "prod", RefreshOverrides(actor="flag@cli", provider_parallelism=1),
                                  factories=source)
    assert flagged.status == "succeeded"
    assert (source.asked[1][1].actor, source.asked[1][1].provider_parallelism) == ("flag@cli", 1)
    assert conn.execute("SELECT actor FROM refresh_runs WHERE id = %s", (flagged.run_id,)).fetchone() == ("flag@cli",)


# ---------------------------------------------------------------- what is read, and how often

def test_the_settings_are_read_once_per_state(conn, make_state, monkeypatch) -> None:
    sid = seed(conn, make_state)
    store(conn, sid, workdir=WORKDIR)
    real = settings.get
    reads: list[str] = []

    def counting(c, state_id):
        reads.append(state_id)
        return real(c, state_id)

    monkeypatch.setattr(settings, "get", counting)
    assert service.refresh_one(conn, "prod", RefreshOverrides(), factories=Source()).status == "succeeded"
    assert reads == [sid]


def _lookups_outside_the_store(monkeypatch) -> list[str]:
    """Who asks states.state_id, by calling module (the store's own reads look it up inside their
    snapshot, which is theirs to do)."""
    callers: list[str] = []
    real = states.state_id

    def spy(c, name):
        caller = sys._getframe(1).f_globals["__name__"]
        if not caller.startswith("kilolock.store"):
            callers.append(caller)
        return real(c, name)

    monkeypatch.setattr(states, "state_id", spy)
    return callers


def test_the_state_id_is_looked_up_once(conn, make_state, monkeypatch) -> None:
    seed(conn, make_state)
    callers = _lookups_outside_the_store(monkeypatch)
    assert service.refresh_one(conn, "prod", RefreshOverrides(workdir=WORKDIR), factories=Source()).status == "succeeded"
    assert callers == ["kilolock.refresh.service"]  # not again by the orchestrator


def test_a_caller_that_has_the_state_id_does_not_look_it_up(conn, make_state, monkeypatch) -> None:
    sid = seed(conn, make_state)
    callers = _lookups_outside_the_store(monkeypatch)
    source = Source()
    result = service.refresh_one(conn, "prod", RefreshOverrides(workdir=WORKDIR), state_id=sid, factories=source)
    assert result.status == "succeeded" and callers == [] and source.asked[0][0] == sid


def test_an_unknown_state_is_refused_before_anything_starts(conn) -> None:
    source = Source()
    with pytest.raises(StateNotFound):
        service.refresh_one(conn, "nope", RefreshOverrides(), factories=source)
    assert source.asked == []
    # One state among many: a failed Result, not an exception.
    result = service.refresh_or_fail(conn, "nope", RefreshOverrides(), factories=source)
    assert (result.status, result.run_id) == ("failed", None) and "nope" in (result.error or "")


# ---------------------------------------------------------------- waiting for another run

def _live_run_elsewhere(db_url: str, sid: str) -> psycopg.Connection:
    """Another process's live `kl refresh` of the state: its audit row, its liveness lock held on
    a connection of its own (closing it ends that run's life)."""
    other = psycopg.connect(db_url, autocommit=True)
    current = versions.current_version(other, sid)
    assert current is not None
    refresh_runs.begin(other, sid, current.id, "other@cli")
    return other


def test_a_run_waits_while_another_run_of_the_state_is_running(conn, db_url, make_state, monkeypatch) -> None:
    sid = seed(conn, make_state)
    other = _live_run_elsewhere(db_url, sid)
    checks: list[int] = []
    real = service.check_not_running

    def counting(c, state_id, name):
        checks.append(1)
        return real(c, state_id, name)

    monkeypatch.setattr(service, "check_not_running", counting)
    source = Source()
    done: list[Any] = []
    runner = threading.Thread(target=lambda: done.append(service.refresh_one(
        conn, "prod", RefreshOverrides(workdir=WORKDIR, lock_timeout=120.0), factories=source)), daemon=True)
    runner.start()
    try:
        wait_for("the run to be refused once and to wait", lambda: len(checks) >= 2)
        assert source.asked == [] and not done  # no provider asked for while the other run lives
    finally:
        other.close()
    runner.join(timeout=60)
    assert not runner.is_alive()
    [result] = done
    assert (result.status, result.to_serial, result.observation) == ("succeeded", None, "v1.1")


def test_without_a_wait_another_run_is_refused_at_once(conn, db_url, make_state) -> None:
    sid = seed(conn, make_state)
    other = _live_run_elsewhere(db_url, sid)
    try:
        source = Source()
        with pytest.raises(StateBusy, match="other@cli"):
            service.refresh_one(conn, "prod", RefreshOverrides(workdir=WORKDIR), factories=source)
        # refresh_or_fail leaves StateBusy to its caller too: --all reports it, a worker retries.
        with pytest.raises(StateBusy):
            service.refresh_or_fail(conn, "prod", RefreshOverrides(workdir=WORKDIR), factories=source)
        assert source.asked == [] and serials(conn) == [1]
    finally:
        other.close()


# ---------------------------------------------------------------- dry run, slots

def test_a_dry_run_reads_everything_and_commits_nothing_even_under_a_lock(conn, make_state) -> None:
    sid = seed(conn, make_state)
    locks.acquire(conn, sid, "prod", locks.lock_info("OperationTypeApply", "someone", "1.8.5"), "someone")
    factory = FakeFactory(world={"id1": {"id": "id1", "triggers": {"k": "drifted"}}})
    result = service.refresh_one(conn, "prod", RefreshOverrides(dry_run=True, workdir=WORKDIR),
                                 factories=Source(factory))
    assert (result.status, result.dry_run, result.checked, result.changed, result.to_serial) == (
        "succeeded", True, 3, 1, None)
    assert len(factory.reads()) == 3 and serials(conn) == [1]


class Slots:
    """A FleetSlotSource that limits nothing, and remembers who asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def for_provider(self, source: str, alias: str) -> None:
        self.asked.append((source, alias))


def test_fleet_slots_given_are_the_runs_and_a_lone_run_leases_its_own(conn, make_state, monkeypatch) -> None:
    from kilolock.refresh.slots import FleetSlots

    seed(conn, make_state)
    handed: list[object] = []
    real = service.run_refresh

    def spy(c, name, factory, options, **kwargs):
        handed.append(options.provider_slots)
        return real(c, name, factory, options, **kwargs)

    monkeypatch.setattr(service, "run_refresh", spy)

    def refresh(**kwargs: Any) -> str:
        return service.refresh_one(conn, "prod", RefreshOverrides(workdir=WORKDIR), factories=Source(),
                                   **kwargs).status

    shared = Slots()
    assert refresh(provider_slots=shared) == "succeeded"
    assert handed == [shared] and shared.asked == [(NULL, "")]
    assert refresh() == "succeeded"  # alone, and the fleet limits nothing: no slots, no thread
    assert handed[1] is None
    provider_limits.set_limit(conn, NULL, "", 2, "t")
    assert refresh(provider_slots=None) == "succeeded"  # the caller's word that the fleet limits nothing
    assert handed[2] is None
    assert refresh() == "succeeded"  # alone, under a limit: the run leases slots of its own
    assert isinstance(handed[3], FleetSlots)
