"""Warm providers inside a worker (issue 13, kilolock.fleet.warm): one provider process serves the
states a worker refreshes; one that crashed or broke the protocol is never reused, one that answered
with an error diagnostic is."""
from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kit.faults import fake_state, install_fake
from kit.fleet import add_states, q, start_worker, stop, wait_for
from kit.kl import kl_cmd, kl_env
from kit.paths import PLUGIN_CACHE
from kit.procs import assert_no_new_providers, provider_pids

NULL_VERSION = "2.1.2"


@pytest.fixture(autouse=True)
def no_orphan_providers() -> Iterator[None]:
    before = provider_pids()
    yield
    assert_no_new_providers(before)


def counting_null(root: Path, launches: Path) -> Path:
    """The real null provider in a plugin cache of its own, behind a wrapper that appends its pid to
    LAUNCHES at every launch (exec keeps the pid: it is the provider's)."""
    real = next((PLUGIN_CACHE / "registry.terraform.io" / "hashicorp" / "null" / NULL_VERSION / "linux_amd64").iterdir())
    d = root / "plugins" / "registry.terraform.io" / "hashicorp" / "null" / NULL_VERSION / "linux_amd64"
    d.mkdir(parents=True)
    exe = d / real.name
    exe.write_text(f'#!/bin/sh\necho $$ >> "{launches}"\nexec "{real}" "$@"\n')
    exe.chmod(0o755)
    return root / "plugins"


def launched(launches: Path) -> list[int]:
    return [int(x) for x in launches.read_text().split()] if launches.exists() else []


def run_now(db_url: str, glob: str) -> None:
    subprocess.run(kl_cmd("schedule", "run-now", "--states", glob), env=kl_env(KL_DATABASE_URL=db_url), check=True,
                   capture_output=True)


def succeeded(db_url: str, like: str) -> int:
    return int(q(db_url, "SELECT count(*) FROM refresh_runs rr JOIN states s ON s.id = rr.state_id "
                         "WHERE rr.status = 'succeeded' AND s.name LIKE %s", (like,))[0][0])


def test_one_worker_launches_the_null_provider_once_for_many_states(db_url, tmp_path):
    launches = tmp_path / "launches"
    cache = counting_null(tmp_path, launches)
    names = [f"warm/s{n:02d}" for n in range(12)]
    add_states(db_url, names, instances=5, search_path=cache)
    run_now(db_url, "warm/*")
    r = subprocess.run(kl_cmd("worker", "--once", "--parallel-states", "1"), env=kl_env(KL_DATABASE_URL=db_url),
                       capture_output=True, timeout=120)
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert succeeded(db_url, "warm/%") == 12, out
    assert len(launched(launches)) == 1, out  # kl refresh would have launched it 12 times

    # --warm-providers 0 is today's kl refresh path: one launch per run.
    run_now(db_url, "warm/s0*")
    r = subprocess.run(kl_cmd("worker", "--once", "--warm-providers", "0"), env=kl_env(KL_DATABASE_URL=db_url),
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stdout.decode()
    assert len(launched(launches)) == 1 + 10


def test_a_killed_warm_provider_is_relaunched(db_url, tmp_path):
    launches = tmp_path / "launches"
    cache = counting_null(tmp_path, launches)
    add_states(db_url, ["k/a", "k/b", "k/c"], instances=3, search_path=cache)
    worker = start_worker(db_url, "warm")
    try:
        run_now(db_url, "k/*")
        wait_for("three runs", lambda: succeeded(db_url, "k/%") == 3)
        first = launched(launches)
        assert len(first) == 1
        os.kill(first[0], signal.SIGKILL)  # idle in the pool
        run_now(db_url, "k/*")
        wait_for("three more runs", lambda: succeeded(db_url, "k/%") == 6)
        assert len(launched(launches)) == 2  # relaunched once, then warm again
        assert q(db_url, "SELECT count(*) FROM refresh_runs WHERE status <> 'succeeded'")[0][0] == 0
    finally:
        code, out = stop(worker)
    assert code == 0, out


def add_fake(db_url: str, name: str, cache: Path, kind: str) -> None:
    import psycopg

    from kilolock import tfstate
    from kilolock.store import settings, states, writes

    raw = fake_state([kind], lineage=f"lineage-{name}")
    with psycopg.connect(db_url, autocommit=True) as conn:
        writes.store_document(conn, name, tfstate.parse_state(raw), raw, source="import", actor="test")
        settings.update(conn, states.state_id(conn, name), settings.Changes({"provider_search_paths": [str(cache)]}), "test")


@pytest.mark.parametrize("read_path", ["threads", "async", "async-grpcio"])
def test_a_diagnostic_keeps_the_process_warm_a_crash_or_a_malformed_answer_does_not(db_url, tmp_path, read_path):
    events = tmp_path / "events.log"
    # FAKE_REPORT_ENV writes one "env HOME=..." line per launch of the fake.
    cache = install_fake(tmp_path, events, FAKE_REPORT_ENV="HOME")
    for name, kind in (("f/ok", "fake_echo"), ("f/diag", "fake_error"), ("f/garbage", "fake_garbage"),
                       ("f/crash", "fake_crash")):
        add_fake(db_url, name, cache, kind)

    def launches() -> int:
        return sum(1 for line in events.read_text().splitlines() if line.startswith("env HOME=")) if events.exists() else 0

    path, _, transport = read_path.partition("-")  # its one-instance states take threads otherwise
    worker = start_worker(db_url, "warm", env={"KL_READ_PATH": path, "KL_PROVIDER_TRANSPORT": transport or "native"})
    try:
        def one(name: str, status: str) -> None:
            before = len(q(db_url, "SELECT 1 FROM refresh_runs"))
            run_now(db_url, name)
            wait_for(f"{name} to run", lambda: len(q(db_url, "SELECT 1 FROM refresh_runs WHERE status <> 'running'")) > before)
            got = q(db_url, "SELECT rr.status FROM refresh_runs rr JOIN states s ON s.id = rr.state_id WHERE s.name = %s "
                            "ORDER BY rr.started_at DESC LIMIT 1", (name,))[0][0]
            assert got == status, name

        one("f/ok", "succeeded")
        assert launches() == 1
        one("f/diag", "failed")  # an error diagnostic: the provider works, it stays warm
        one("f/ok", "succeeded")
        assert launches() == 1
        one("f/garbage", "failed")  # an answer that is not msgpack: never reused
        one("f/ok", "succeeded")
        assert launches() == 2
        one("f/crash", "failed")  # the process died
        one("f/ok", "succeeded")
        assert launches() == 3
    finally:
        code, out = stop(worker)
    assert code == 0, out
