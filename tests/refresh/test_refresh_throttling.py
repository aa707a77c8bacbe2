"""kl refresh against an API that throttles (issue 18), through the fault-injecting fake provider's
capacity model (fake_api reads: FAKE_CAPACITY concurrent reads, throttling diagnostics above 3x
that): throttled instances are retried rather than failed, auto shrinks, a fixed N stays, and
what was used is reported in the JSON, the table and `kl runs`."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kit.faults import fake_state, install_fake, last_run, observations, serials

pytestmark = pytest.mark.usefixtures("read_path")  # both read paths (tests/refresh/conftest.py)

def reads_report(read_path: str) -> dict[str, str]:
    """The "reads" and "transport" of a concurrency report made under the `read_path` fixture."""
    path, _, transport = read_path.partition("-")
    return {"reads": path, "transport": transport or "native"}

def _setup(run_kl, tmp_path: Path, instances: int, **env: str) -> tuple[Path, Path]:
    events = tmp_path / "events.log"
    events.touch()
    cache = install_fake(tmp_path, events, **env)
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_api"] * instances)).returncode == 0
    return cache, events


def test_throttled_reads_are_retried_and_a_fixed_limit_stays_fixed(run_kl, db_url, tmp_path, read_path):
    # Room for 3 calls, 12 sent at once: 9 are throttled at first, and every one gets through later.
    cache, events = _setup(run_kl, tmp_path, 12, FAKE_CAPACITY="1", FAKE_LATENCY="0.1")
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--provider-parallelism", "12", "--format", "json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["status"] == "succeeded" and out["resources_failed"] == 0, out["failures"]
    [used] = out["concurrency"]
    throttled = events.read_text().splitlines().count("throttled")
    assert throttled >= 9 and used == {"provider": "registry.terraform.io/hashicorp/fake", "alias": None, "mode": "fixed",
                                       "start": 12, "max": 12, "final": 12, "throttled": throttled,
                                       **reads_report(read_path)}
    assert out["observation"] == "v1.1" and serials(db_url) == [1] and observations(db_url) == ["v1.1"]
    runs = json.loads(run_kl("runs", "prod", "--format", "json").stdout)["runs"]
    assert runs[0]["concurrency"] == [used]
    table = run_kl("runs", "prod").stdout.decode()
    assert "IN FLIGHT" in table.splitlines()[0] and f"12 fixed ({throttled} throttled)" in table


def test_auto_is_the_default_and_backs_off_a_throttling_api(run_kl, db_url, tmp_path):
    # Auto starts at 10; above 3 in flight this API throttles, so auto has to come down to get on.
    cache, events = _setup(run_kl, tmp_path, 40, FAKE_CAPACITY="1", FAKE_LATENCY="0.02")
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache))
    assert r.returncode == 0, r.stderr
    [line] = [x for x in r.stdout.decode().splitlines() if x.startswith("requests in flight to ")]
    m = re.fullmatch(r"requests in flight to fake: adaptive, started at 10, reached (\d+), ended at (\d+); "
                     r"(\d+) throttled \(retried\)", line)
    assert m, line
    assert int(m[1]) == 10 and int(m[2]) <= 5 and int(m[3]) == events.read_text().splitlines().count("throttled") > 0
    assert last_run(db_url)[0] == "succeeded"
    assert "auto, max 10, final " in run_kl("runs", "prod").stdout.decode()


def test_an_instance_throttled_past_its_rpc_timeout_fails_with_the_reason(run_kl, db_url, tmp_path):
    cache, _ = _setup(run_kl, tmp_path, 2, FAKE_CAPACITY="0")  # capacity 0: every read is throttled
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--rpc-timeout", "2s", "--format", "json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "failed" and out["resources_failed"] == 2
    assert (out["to_serial"], out["observation"]) == (None, None)
    for f in out["failures"]:
        assert "api error Throttling: Rate exceeded (throttled " in f["message"], f
        assert f["message"].endswith("the --rpc-timeout per instance)")
    assert out["concurrency"][0]["throttled"] >= 8  # 4 or 5 tries each in 2 s (pauses 0.1-0.2, 0.2-0.4, 0.4-0.8, ...)
    status, summary, to_version, _ = last_run(db_url)
    assert (status, to_version) == ("failed", None) and "Throttling" in summary
    assert serials(db_url) == [1]
