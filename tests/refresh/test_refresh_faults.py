"""kl refresh against the project's fault-injecting fake provider (tests/provider/fake_provider.py),
installed in plugin-cache layout: cancellation by timeout and SIGINT, a crash, sensitive paths
sent in ReadResource field 6. The real providers are in test_refresh_real.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from kit.paths import FAKE_PROVIDER as FAKE
from kit.paths import REPO
from kit.pg import one_row

SOURCE = "registry.terraform.io/hashicorp/fake"


pytestmark = pytest.mark.usefixtures("read_path")  # both read paths (tests/refresh/conftest.py)

@pytest.fixture
def fake_cache(tmp_path: Path):
    """A plugin cache holding the fake as hashicorp/fake 1.0.0; returns (cache dir, event log)."""
    events = tmp_path / "events.log"
    events.touch()

    def make(**env: str) -> Path:
        d = tmp_path / "plugins" / SOURCE / "1.0.0" / "linux_amd64"
        d.mkdir(parents=True, exist_ok=True)
        exe = d / "terraform-provider-fake_v1.0.0_x5"
        exports = {"PYTHONPATH": str(REPO), "FAKE_EVENT_LOG": str(events), **env}
        exe.write_text("#!/bin/sh\n" + "".join(f"export {k}='{v}'\n" for k, v in exports.items())
                       + f'exec "{sys.executable}" "{FAKE}" "$@"\n')
        exe.chmod(0o755)
        return tmp_path / "plugins"

    return make, events


def fake_state(types: list[str], serial: int = 1) -> bytes:
    return json.dumps({"version": 4, "terraform_version": "1.0.3", "serial": serial, "lineage": "fake-lineage", "outputs": {},
                       "resources": [{"mode": "managed", "type": t, "name": f"r{n}", "provider": f'provider["{SOURCE}"]',
                                      "instances": [{"schema_version": 2, "sensitive_attributes": [],
                                                     "attributes": {"id": f"id{n}", "value": "v", "secret": "hunter2", "rule": []}}]}
                                     for n, t in enumerate(types)]}).encode()


def kl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kilolock", *args]


def audit(db_url: str) -> tuple:
    with psycopg.connect(db_url) as c:
        return one_row(c, "SELECT status, error_summary, to_version_id FROM refresh_runs ORDER BY started_at DESC LIMIT 1")


def serials(db_url: str) -> list[int]:
    with psycopg.connect(db_url) as c:
        return [r[0] for r in c.execute("SELECT serial FROM state_versions ORDER BY serial")]


def test_timeout_cancels_stops_the_provider_and_commits_nothing(run_kl, db_url, fake_cache):
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="60")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_slow"] * 3 + ["fake_echo"])).returncode == 0
    t0 = time.monotonic()
    # Long enough for the reads to be in flight even on a loaded machine, far below the 60 s read.
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--timeout", "8s", "--format", "json")
    elapsed = time.monotonic() - t0
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "cancelled" and out["error"] == "timed out after 8s", out
    assert elapsed < 40, elapsed
    lines = events.read_text().splitlines()
    assert "read" in lines and "stop" in lines and lines.index("stop") < lines.index("shutdown"), lines
    status, summary, to_version = audit(db_url)
    assert (status, to_version) == ("cancelled", None) and "timed out after 8s" in summary
    assert serials(db_url) == [1]


def test_sigint_cancels_cleanly_with_exit_130(db_url, fake_cache, tmp_path):
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="60")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run(kl_cmd("state", "import", "prod", "-"), input=fake_state(["fake_slow"] * 2), env=env, check=True, capture_output=True)
    proc = subprocess.Popen(kl_cmd("refresh", "prod", "--provider-search-path", str(cache), "--format", "json"),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(tmp_path))
    deadline = time.monotonic() + 30
    while "read" not in events.read_text() and time.monotonic() < deadline:  # reads in flight
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    result = json.loads(out)
    assert result["status"] == "cancelled" and result["error"] == "interrupted (SIGINT)"
    assert err.decode().strip() == "kl: refresh cancelled: interrupted (SIGINT)"
    lines = events.read_text().splitlines()
    assert "stop" in lines and lines.index("stop") < lines.index("shutdown"), lines  # StopProvider, then Shutdown
    assert audit(db_url)[0] == "cancelled" and serials(db_url) == [1]


def test_sigint_cancels_every_state_of_refresh_all_with_exit_130(db_url, fake_cache, tmp_path):
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="60")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("team/a", "team/b"):
        subprocess.run(kl_cmd("state", "import", name, "-"), input=fake_state(["fake_slow"]), env=env, check=True,
                       capture_output=True)
        subprocess.run(kl_cmd("state", "set", name, "--provider-search-path", str(cache)), env=env, check=True,
                       capture_output=True)
    proc = subprocess.Popen(kl_cmd("refresh", "--all", "--states", "team/*", "--parallel-states", "2", "--format", "json"),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(tmp_path))
    deadline = time.monotonic() + 30
    while events.read_text().count("read") < 2 and time.monotonic() < deadline:  # both states' reads in flight
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    result = json.loads(out)
    assert result["cancelled"] == 2 and {r["error"] for r in result["results"]} == {"interrupted (SIGINT)"}, result
    with psycopg.connect(db_url) as c:
        runs = c.execute("SELECT status, count(*) FROM refresh_runs GROUP BY 1").fetchall()
    assert runs == [("cancelled", 2)] and serials(db_url) == [1, 1]


def test_provider_crash_fails_its_instances_by_name_and_commits_nothing(run_kl, db_url, fake_cache):
    make, _ = fake_cache
    cache = make()
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_crash", "fake_echo"])).returncode == 0
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--format", "json", "--provider-parallelism", "1")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "failed" and out["to_serial"] is None
    failures = {f["address"]: f["message"] for f in out["failures"]}
    assert "fake_crash.r1" in failures and "plugin exited" in failures["fake_crash.r1"]
    assert serials(db_url) == [1] and audit(db_url)[0] == "failed"


def test_sensitive_paths_from_field_6_are_persisted_and_never_printed(run_kl, db_url, fake_cache):
    make, _ = fake_cache
    cache = make()
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_sensitive"])).returncode == 0
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache))
    assert r.returncode == 0, r.stderr
    assert b"hunter2" not in r.stdout + r.stderr
    state = json.loads(run_kl("state", "pull", "prod", "--observed").stdout)  # what the refresh read
    marks = state["resources"][0]["instances"][0]["sensitive_attributes"]
    assert [{"type": "get_attr", "value": "secret"}] in marks
    # tags["k"] was sent too, but the value has no such attribute: Terraform keeps only marks that apply.
    assert all(p[0]["value"] != "tags" for p in marks)
    assert state["resources"][0]["instances"][0]["private"]  # the fake appends "+read" to private


def test_garbage_sensitive_paths_in_field_6_fail_that_instance_naming_the_provider(run_kl, db_url, fake_cache):
    make, _ = fake_cache
    cache = make(FAKE_SENSITIVE_GARBAGE="1")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_sensitive"])).returncode == 0
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--format", "json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "failed" and out["resources_checked"] == 2, out
    assert out["failures"] == [{"address": "fake_sensitive.r1",
                                "message": "provider fake: ReadResource: malformed sensitive paths (field 6): "
                                           "AttributePath.Step without a selector"}], out["failures"]
    assert b"Traceback" not in r.stderr and b"hunter2" not in r.stdout + r.stderr
    assert serials(db_url) == [1] and audit(db_url)[0] == "failed"


def test_provider_config_env_reference_is_resolved_at_run_time_and_never_stored(run_kl, db_url, fake_cache):
    make, events = fake_cache
    cache = make()
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo"])).returncode == 0
    r = run_kl("provider", "configure", "hashicorp/fake", "--config", "-", input=b'{"token": {"env": "FAKE_TOKEN"}}')
    assert r.returncode == 0 and b"token=(env FAKE_TOKEN)" in r.stdout, r.stderr
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--format", "json", env={"FAKE_TOKEN": "s3cr3t-value"})
    assert r.returncode == 0, r.stderr
    assert "configure token=s3cr3t-value" in events.read_text().splitlines()
    assert b"s3cr3t-value" not in r.stdout + r.stderr
    with psycopg.connect(db_url) as c:
        stored = one_row(c, "SELECT config FROM provider_configs")[0]
        dumped = one_row(c, "SELECT string_agg(t::text, ' ') FROM (SELECT to_jsonb(x) AS t FROM provider_configs x UNION ALL SELECT kl_version_document(id) FROM state_versions) s")[0]
    assert stored == {"token": {"env": "FAKE_TOKEN"}} and "s3cr3t-value" not in dumped
    listing = run_kl("provider", "list").stdout.decode()
    assert "token=(env FAKE_TOKEN)" in listing and "s3cr3t" not in listing

    env_without = {k: v for k, v in os.environ.items() if k != "FAKE_TOKEN"}
    r = subprocess.run(kl_cmd("refresh", "prod", "--provider-search-path", str(cache), "--format", "json"),
                       env={**env_without, "PYTHONPATH": str(REPO)}, capture_output=True)
    out = json.loads(r.stdout)
    assert r.returncode == 1 and "environment variable FAKE_TOKEN is not set" in out["failures"][0]["message"]


def test_pinned_version_wins_over_the_highest(run_kl, db_url, fake_cache, tmp_path):
    make, _ = fake_cache
    cache = make()
    newer = cache / SOURCE / "2.0.0" / "linux_amd64"
    newer.mkdir(parents=True)
    src = cache / SOURCE / "1.0.0" / "linux_amd64" / "terraform-provider-fake_v1.0.0_x5"
    (newer / "terraform-provider-fake_v2.0.0_x5").write_text(src.read_text())
    (newer / "terraform-provider-fake_v2.0.0_x5").chmod(0o755)
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo"])).returncode == 0
    out = json.loads(run_kl("refresh", "prod", "--provider-search-path", str(cache), "--format", "json").stdout)
    assert out["status"] == "succeeded" and " 2.0.0 " in out["providers"][0]
    assert run_kl("provider", "pin", "hashicorp/fake", "1.0.0").returncode == 0
    out = json.loads(run_kl("refresh", "prod", "--provider-search-path", str(cache), "--format", "json").stdout)
    assert out["status"] == "succeeded" and " 1.0.0 " in out["providers"][0] and "v1.0.0_x5" in out["providers"][0]
    assert run_kl("provider", "pin", "hashicorp/fake", "9.9.9").returncode == 0
    out = json.loads(run_kl("refresh", "prod", "--provider-search-path", str(cache), "--format", "json").stdout)
    assert out["status"] == "failed" and "version 9.9.9" in out["failures"][0]["message"]
    assert "other versions found: 1.0.0, 2.0.0" in out["failures"][0]["message"]
