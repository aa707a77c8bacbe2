"""Which way kl makes a group's reads (kilolock.refresh.orchestrator.read_path): from one event loop
through grpc.aio for big groups, from threads for small ones, and the same result either way. The
fault and real-provider suites run on both paths through the `read_path` fixture."""
from __future__ import annotations

import json

import pytest

from kilolock.refresh.orchestrator import ASYNC_MIN_INSTANCES
from kit.paths import PLUGIN_CACHE
from kit.states import null_count_state

SEARCH = ("--provider-search-path", str(PLUGIN_CACHE))


def null_state(instances: int, seed: int) -> bytes:
    return null_count_state(instances, seed, f"read-paths-{seed}")


def refresh(run_kl, name: str, *extra: str) -> dict:
    r = run_kl("refresh", name, *SEARCH, "--format", "json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_auto_reads_a_big_group_from_the_event_loop_and_a_small_one_from_threads(run_kl, db_url, monkeypatch):
    monkeypatch.delenv("KL_READ_PATH", raising=False)
    for name, n in (("small", ASYNC_MIN_INSTANCES - 1), ("big", ASYNC_MIN_INSTANCES)):
        assert run_kl("state", "import", name, "-", input=null_state(n, n)).returncode == 0
        out = refresh(run_kl, name)
        assert (out["status"], out["resources_checked"], out["resources_changed"], out["resources_failed"]) == ("succeeded", n, 0, 0)
        [used] = out["concurrency"]
        assert used["reads"] == ("async" if n >= ASYNC_MIN_INSTANCES else "threads"), used
        runs = json.loads(run_kl("runs", name, "--format", "json").stdout)["runs"]
        assert runs[0]["concurrency"] == [used]


def test_both_paths_commit_the_same_state(run_kl, db_url, monkeypatch):
    docs = {}
    for path in ("threads", "async"):
        monkeypatch.setenv("KL_READ_PATH", path)
        assert run_kl("state", "import", path, "-", input=null_state(40, 7)).returncode == 0
        out = refresh(run_kl, path)
        assert out["concurrency"][0]["reads"] == path and out["to_serial"] == 2
        docs[path] = json.loads(run_kl("state", "pull", path).stdout)
    assert docs["threads"] == docs["async"]


@pytest.mark.parametrize("value", ["bogus", "aio"])
def test_an_unknown_read_path_is_one_line_naming_the_variable_before_any_provider_starts(run_kl, db_url, monkeypatch, value):
    assert run_kl("state", "import", "prod", "-", input=null_state(3, 1)).returncode == 0
    monkeypatch.setenv("KL_READ_PATH", value)
    r = run_kl("refresh", "prod", *SEARCH)
    err = r.stderr.decode()
    assert r.returncode == 1 and err.strip() == f"kl: refresh failed: KL_READ_PATH={value!r} is not one of auto, async, threads", err
    assert "Traceback" not in err and b"checked:  0" in r.stdout
