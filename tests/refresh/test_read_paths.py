"""Which way kl makes a group's reads (kilolock.refresh.orchestrator.read_path): from one event loop
for big groups, from threads for small ones, through the native HTTP/2 client (or grpcio with
KL_PROVIDER_TRANSPORT=grpcio), and the same result every way. The fault and real-provider suites
run on three of these through the `read_path` fixture."""
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


def test_auto_reads_from_the_event_loop_from_a_threshold_that_depends_on_the_transport(run_kl, db_url, monkeypatch):
    monkeypatch.delenv("KL_READ_PATH", raising=False)
    monkeypatch.delenv("KL_PROVIDER_TRANSPORT", raising=False)
    threshold = ASYNC_MIN_INSTANCES["native"]
    for name, n in (("small", threshold - 1), ("big", threshold)):
        assert run_kl("state", "import", name, "-", input=null_state(n, n)).returncode == 0
        out = refresh(run_kl, name)
        assert (out["status"], out["resources_checked"], out["resources_changed"], out["resources_failed"]) == ("succeeded", n, 0, 0)
        [used] = out["concurrency"]
        big = n >= threshold  # null 2.1.2 completes AutoMTLS: the native client's TLS carries both
        assert (used["reads"], used["transport"]) == ("async" if big else "threads", "native"), used
        runs = json.loads(run_kl("runs", name, "--format", "json").stdout)["runs"]
        assert runs[0]["concurrency"] == [used]
    # Through grpcio the loop needs a grpc.aio channel of its own: a group that size keeps the threads.
    monkeypatch.setenv("KL_PROVIDER_TRANSPORT", "grpcio")
    [used] = refresh(run_kl, "big")["concurrency"]
    assert (used["reads"], used["transport"]) == ("threads", "grpcio"), used


@pytest.mark.parametrize("tls", ["automtls", "plaintext"])
def test_every_path_commits_the_same_state(run_kl, db_url, monkeypatch, tls):
    if tls == "plaintext":  # as kl talks to every provider built with a current Go
        monkeypatch.setenv("KL_DISABLE_PLUGIN_TLS", "1")
    docs = {}
    ways = [(path, transport) for path in ("threads", "async") for transport in ("native", "grpcio")]
    for path, transport in ways:
        monkeypatch.setenv("KL_READ_PATH", path)
        monkeypatch.setenv("KL_PROVIDER_TRANSPORT", transport)
        name = f"{path}-{transport}"
        assert run_kl("state", "import", name, "-", input=null_state(40, 7)).returncode == 0
        out = refresh(run_kl, name)
        used = out["concurrency"][0]
        assert (used["reads"], used["transport"], out["to_serial"], out["observation"]) == (path, transport, None, "v1.1"), out
        docs[name] = json.loads(run_kl("state", "pull", name, "--observed").stdout)
    first = docs.pop("threads-native")
    assert all(doc == first for doc in docs.values()), sorted(docs)


@pytest.mark.parametrize("variable, value, allowed", [
    ("KL_READ_PATH", "bogus", "auto, async, threads"), ("KL_READ_PATH", "aio", "auto, async, threads"),
    ("KL_PROVIDER_TRANSPORT", "h2", "native, grpcio"), ("KL_PROVIDER_TRANSPORT", "grpc", "native, grpcio"),
])
def test_an_unknown_read_choice_is_one_line_naming_the_variable_before_any_provider_starts(run_kl, db_url, monkeypatch, variable,
                                                                                           value, allowed):
    """A mistyped variable is the user's mistake, not a failed run: refused before the audit row
    (which `kl runs` would list and a notification channel would hear of)."""
    import psycopg

    assert run_kl("state", "import", "prod", "-", input=null_state(3, 1)).returncode == 0
    monkeypatch.setenv(variable, value)
    r = run_kl("refresh", "prod", *SEARCH)
    err = r.stderr.decode()
    assert r.returncode == 1 and err.strip() == f"kl: {variable}={value!r} is not one of {allowed}", err
    assert "Traceback" not in err and r.stdout == b""
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM refresh_runs").fetchone() == (0,)
