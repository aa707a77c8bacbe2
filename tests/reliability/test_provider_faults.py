"""Provider faults during `kl refresh`, each against the fault-injecting fake: what the run
reports, and what must hold afterwards (nothing committed, the audit row finished, no orphan)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from kit.faults import fake_state, last_run, observations, serials
from kit.kl import kl_cmd, kl_env
from kit.procs import provider_pids


def refresh_json(run_kl, cache, *flags: str, env: dict | None = None) -> tuple[int, dict, bytes]:
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--format", "json", *flags, env=env)
    return r.returncode, json.loads(r.stdout), r.stderr


def assert_nothing_committed(db_url: str, status: str = "failed") -> None:
    run_status, summary, to_version, finished = last_run(db_url)
    assert (run_status, to_version) == (status, None) and finished is not None and summary, (run_status, summary)
    assert serials(db_url) == [1] and observations(db_url) == [], "a failed run recorded an observation"


@pytest.mark.parametrize("bad, expected", [
    ("fake_garbage", "provider fake: ReadResource returned an invalid object: invalid msgpack byte 0xc1"),
    ("fake_unknown", "unknown value"),
    ("fake_wrongtype", "string"),
])
def test_a_bad_answer_fails_that_instance_by_name_and_commits_nothing(run_kl, db_url, fake_cache, bad, expected):
    make, _ = fake_cache
    cache = make()
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", bad])).returncode == 0
    code, out, err = refresh_json(run_kl, cache)
    assert code == 1 and out["status"] == "failed" and out["resources_failed"] == 1, out
    [failure] = out["failures"]
    assert failure["address"] == "fake_garbage.r1".replace("fake_garbage", bad), failure
    assert failure["message"].startswith("provider fake: ") and expected in failure["message"], failure
    assert b"Traceback" not in err
    assert_nothing_committed(db_url)


def test_a_hung_read_hits_the_per_rpc_deadline(run_kl, db_url, fake_cache):
    make, _events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="120")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_slow", "fake_echo"])).returncode == 0
    code, out, _ = refresh_json(run_kl, cache, "--rpc-timeout", "2s")
    assert code == 1 and out["status"] == "failed", out
    assert out["failures"] == [{"address": "fake_slow.r0",
                                "message": "provider fake: ReadResource did not answer within 2s"}], out["failures"]
    assert out["resources_checked"] == 2
    assert_nothing_committed(db_url)


def test_rpc_timeout_must_be_a_duration(run_kl, db_url, fake_cache):
    make, _ = fake_cache
    r = run_kl("refresh", "prod", "--provider-search-path", str(make()), "--rpc-timeout", "soon")
    assert r.returncode == 2 and r.stderr.decode().strip().startswith("kl: invalid duration 'soon'"), r.stderr
    assert len(r.stderr.decode().strip().splitlines()) == 1


def test_exit_during_the_handshake_names_the_provider_and_every_address(run_kl, db_url, fake_cache):
    make, _ = fake_cache
    cache = make(FAKE_MODE="exit-early")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_echo"])).returncode == 0
    code, out, err = refresh_json(run_kl, cache)
    assert code == 1 and out["status"] == "failed" and out["resources_failed"] == 2, out
    # The provider never started: one failure for its group, naming every address.
    assert [(f["address"], f["addresses"]) for f in out["failures"]] == [(None, ["fake_echo.r0", "fake_echo.r1"])]
    assert all("fake" in f["message"] and "exited" in f["message"] for f in out["failures"]), out["failures"]
    assert b"Traceback" not in err
    assert_nothing_committed(db_url)


def test_a_stderr_flood_neither_blocks_the_provider_nor_reaches_the_terminal(run_kl, db_url, fake_cache):
    make, _ = fake_cache
    # 32 MiB: far beyond a pipe's buffer, so a provider whose stderr is not drained blocks forever.
    cache = make(FAKE_FLOOD_MB="32")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_flood", "fake_echo"])).returncode == 0
    code, out, err = refresh_json(run_kl, cache, "--rpc-timeout", "90s")
    assert code == 0 and out["status"] == "succeeded" and (out["to_serial"], out["observation"]) == (None, "v1.1"), out
    assert serials(db_url) == [1] and observations(db_url) == ["v1.1"]
    assert len(err) < 4096, err[:300]  # provider stderr is logging at debug, off by default


def test_provider_killed_mid_group_fails_the_run_and_commits_nothing(db_url, fake_cache, tmp_path):
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="60")
    env = kl_env()
    subprocess.run(kl_cmd("state", "import", "prod", "-"), input=fake_state(["fake_echo", "fake_slow", "fake_slow"]),
                   env=env, check=True, capture_output=True)
    before = provider_pids()
    proc = subprocess.Popen(kl_cmd("refresh", "prod", "--provider-search-path", str(cache), "--format", "json"),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(tmp_path))
    deadline = time.monotonic() + 30
    while events.read_text().count("read") < 3 and time.monotonic() < deadline:  # both slow reads in flight
        time.sleep(0.05)
    [pid] = provider_pids() - before
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    result = json.loads(out)
    assert proc.returncode == 1 and result["status"] == "failed", (result, err)
    failures = {f["address"]: f["message"] for f in result["failures"]}
    assert set(failures) == {"fake_slow.r1", "fake_slow.r2"}, failures
    assert all(m.startswith("provider fake: the plugin exited during ReadResource (killed by SIGKILL)") for m in failures.values()), failures
    assert b"Traceback" not in err
    assert_nothing_committed(db_url)


@pytest.mark.parametrize("env, shown", [({"KL_LOG": "trace"}, True), ({"TF_LOG": "1"}, True),
                                        ({"KL_LOG": "debug"}, False), ({}, False)])
def test_provider_trace_lines_reach_stderr_only_when_trace_is_asked_for(run_kl, db_url, fake_cache, env, shown):
    make, _ = fake_cache
    cache = make()
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo"])).returncode == 0
    clean = {k: "" for k in ("KL_LOG", "TF_LOG", "TF_LOG_PROVIDER")}
    code, out, err = refresh_json(run_kl, cache, "--dry-run", env={**clean, **env})
    assert code == 0 and out["status"] == "succeeded", err
    assert (b"fake trace line" in err) == shown, err.decode()[-2000:]
