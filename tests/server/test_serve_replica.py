"""`kl serve --read-url`: web UI and API pages read from a streaming replica, every write and
Terraform's state reads on the primary; a real primary and standby (kit.replication)."""
from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import psycopg
import pytest

from kit.fleet import add_states, q, wait_for
from kit.kl import run_kl
from kit.klserve import KlServe
from kit.replication import Replicated, replicated


@pytest.fixture
def pair() -> Iterator[Replicated]:
    with replicated("kl-rr-", databases=("kl",)) as p:
        yield p


def _get(url: str, token: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, dict(resp.headers.items()), resp.read()


def _api_states(serve: KlServe, token: str) -> set[str]:
    status, _, body = _get(f"{serve.http}/api/v1/states", token)
    assert status == 200
    return {s["name"] for s in json.loads(body)["states"]}


def test_ui_and_api_pages_come_from_the_replica_and_say_its_lag_while_writes_and_state_reads_use_the_primary(pair):
    primary, standby = pair.primary.url("kl"), pair.standby.url("kl")
    env = {"KL_DATABASE_URL": primary}
    assert run_kl("db", "migrate", env=env).returncode == 0
    add_states(primary, ["app/one"], instances=1)
    r = run_kl("token", "create", "reader", "--role", "read", "--states", "**", "--format", "json", env=env)
    assert r.returncode == 0, r.stderr
    token = json.loads(r.stdout)["token"]
    with KlServe(primary, "--read-url", standby) as serve:
        serve.wait_for(lambda line: "web UI and API pages read from the replica postgresql://kilolock@127.0.0.1:"
                                    f"{pair.standby.port}/kl" in line)
        status, _, page = _get(f"{serve.http}/ui/", token)
        assert status == 200 and b"app/one" in page and b"Read from a replica" in page and b"s behind the primary" in page
        # The token's last use is written on the primary (a replica refuses every write).
        assert q(primary, "SELECT last_used_at IS NOT NULL FROM access_tokens WHERE name = 'reader'") == [(True,)]

        # With the replica's replay paused, a new state reaches the primary (and the standby's WAL)
        # but not the replica's pages; Terraform's state read is the primary's and finds it.
        with psycopg.connect(standby, autocommit=True) as s:
            s.execute("SELECT pg_wal_replay_pause()")
        add_states(primary, ["app/two"], instances=1)
        assert _api_states(serve, token) == {"app/one"}
        status, headers, _ = _get(f"{serve.http}/api/v1/states", token)
        assert float(headers["X-Kilolock-Replica-Lag"]) > 0, headers
        status, _, state = _get(f"{serve.http}/states/app/two", token)
        assert status == 200 and json.loads(state)["lineage"] == "lineage-app/two"
        with psycopg.connect(standby, autocommit=True) as s:
            s.execute("SELECT pg_wal_replay_resume()")
        wait_for("the replica to replay the new state", lambda: _api_states(serve, token) == {"app/one", "app/two"},
                 timeout=30)
        status, headers, _ = _get(f"{serve.http}/api/v1/states", token)
        assert float(headers["X-Kilolock-Replica-Lag"]) >= 0
        assert serve.proc.poll() is None
    assert not any(" 500 " in line or "Traceback" in line for line in serve.lines), serve.lines


def test_an_unreachable_read_url_is_one_line(pair):
    primary = pair.primary.url("kl")
    assert run_kl("db", "migrate", env={"KL_DATABASE_URL": primary}).returncode == 0
    r = run_kl("serve", "--listen", "127.0.0.1:0", "--read-url", "postgresql://kl:pw@127.0.0.1:1/kl",
               env={"KL_DATABASE_URL": primary})
    err = r.stderr.decode()
    assert r.returncode != 0 and err.startswith("kl: --read-url: cannot connect to the database "), err
    assert len(err.strip().splitlines()) == 1 and "pw" not in err.replace("postgresql", ""), err
