"""Real Terraform and OpenTofu against kl serve: init, apply, plan, change and removal, locking
between two concurrent applies, force-unlock, a stale push, pull, and kl refresh in between.
Offline: the null provider comes from the filesystem mirror of scripts/test-providers.sh."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import psycopg
import pytest

from kit.pg import one_row
from kit.tfcli import PLUGIN_CACHE, TOOLS, Workspace, tool_binary, wait_for_lock_holder

V1 = """
resource "null_resource" "a" { triggers = { v = "a1" } }
resource "null_resource" "b" { triggers = { v = "b1" } }
resource "null_resource" "c" { triggers = { v = "c1" } }
"""
# b changes (replaced), c is removed, a stays, d is new.
V2 = """
resource "null_resource" "a" { triggers = { v = "a1" } }
resource "null_resource" "b" { triggers = { v = "b2" } }
resource "null_resource" "d" { triggers = { v = "d1" } }
"""


@pytest.fixture
def users_server(start_server, tmp_path):
    from kilolock.server.auth import Authenticator, hash_password

    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\nroot:{hash_password('root-pw', n=2**10)}:admin\n")
    return start_server(auth=Authenticator.from_config(str(users), env={}))


COMPACT_STATES = {"tofu-1.8.5"}


def _workspace(tool: str, server, tmp_path: Path, name: str) -> Workspace:
    d = tmp_path / f"ws-{tool}"
    d.mkdir()
    return Workspace(tool, tool_binary(tool), d, f"{server.url}/states/{name}", "alice", "alice-pw")


def _lifecycles(db_url: str, name: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute(
            """SELECT r.address, r.create_serial, r.delete_serial, r.attributes -> 'triggers' ->> 'v'
               FROM resources r JOIN states s ON s.id = r.state_id WHERE s.name = %s
               ORDER BY r.address, r.create_serial""", (name,)).fetchall()


def _versions(db_url: str, name: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute(
            """SELECT v.serial, v.source, v.actor FROM state_versions v JOIN states s ON s.id = v.state_id
               WHERE s.name = %s AND v.kind = 'terraform' ORDER BY v.serial""", (name,)).fetchall()


def _events(db_url: str, name: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute(
            """SELECT e.event, e.actor, e.who FROM lock_events e JOIN states s ON s.id = e.state_id
               WHERE s.name = %s ORDER BY e.created_at""", (name,)).fetchall()


@pytest.mark.parametrize("tool", TOOLS)
def test_apply_change_remove_pull_push_refresh(tool, users_server, db_url, tmp_path, run_kl):
    ws = _workspace(tool, users_server, tmp_path, f"life-{tool}")
    name = f"life-{tool}"
    ws.write(V1)
    ws.run("init", "-input=false", "-no-color")
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    first = _versions(db_url, name)
    assert first and all(src == "apply" and actor == "alice" for _, src, actor in first)
    s1 = first[-1][0]
    assert [(a, c, d) for a, c, _, d in _lifecycles(db_url, name)] == [
        ("null_resource.a", s1, "a1"), ("null_resource.b", s1, "b1"), ("null_resource.c", s1, "c1")]
    assert ws.run("plan", "-detailed-exitcode", "-input=false", "-no-color", check=False).returncode == 0

    ws.write(V2)
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    s2 = _versions(db_url, name)[-1][0]
    assert s2 > s1
    assert _lifecycles(db_url, name) == [
        ("null_resource.a", s1, None, "a1"),
        ("null_resource.b", s1, s2, "b1"), ("null_resource.b", s2, None, "b2"),
        ("null_resource.c", s1, s2, "c1"),
        ("null_resource.d", s2, None, "d1"),
    ]
    # Every lock the CLI took was released, and audited as alice's.
    events = _events(db_url, name)
    assert events and {e[0] for e in events} == {"lock", "unlock"} and len(events) % 2 == 0
    assert all(actor == "alice" for _, actor, _ in events)

    pulled = ws.run("state", "pull").stdout
    # Terraform re-serialises what it pulled (and its UI may add a final newline): equal bytes mean
    # kl serves, and `kl state pull` prints, exactly Terraform's own layout. OpenTofu 1.8 writes its
    # states as compact JSON (json.Marshal, not MarshalIndent): the same document.
    ours = run_kl("state", "pull", name).stdout.decode()
    if tool in COMPACT_STATES:
        assert json.loads(pulled) == json.loads(ours)
    else:
        assert pulled.rstrip("\n") == ours.rstrip("\n")

    # A stale serial, forced past the CLI's own check: the server refuses it and keeps history.
    stale = json.loads(pulled)
    stale["serial"] = s1
    stale["resources"] = []
    (ws.dir / "stale.tfstate").write_text(json.dumps(stale))
    before = _versions(db_url, name)
    pushed = ws.run("state", "push", "-force", "stale.tfstate", check=False)
    assert pushed.returncode != 0 and "409" in pushed.stdout + pushed.stderr
    assert _versions(db_url, name) == before

    # A refresh records an observation: Terraform's versions stay as they were, and its plan too.
    r = run_kl("refresh", name, "--provider-search-path", str(PLUGIN_CACHE), cwd=ws.dir)
    assert r.returncode == 0, r.stderr.decode()
    assert _versions(db_url, name) == before
    assert ws.run("plan", "-detailed-exitcode", "-input=false", "-no-color", check=False).returncode == 0
    # With --commit the refreshed state is Terraform's next version, which the CLI reads and plans on.
    r = run_kl("refresh", name, "--commit", "--provider-search-path", str(PLUGIN_CACHE), cwd=ws.dir)
    assert r.returncode == 0, r.stderr.decode()
    versions = _versions(db_url, name)
    assert versions[-1][1] == "refresh" and versions[-1][0] > s2
    assert ws.run("plan", "-detailed-exitcode", "-input=false", "-no-color", check=False).returncode == 0


# Terraform 1.0.3's http client turns a 423 into a plain error, not a LockError, so -lock-timeout
# cannot wait there whatever the server answers; later clients retry while the body names a holder.
WAITS_ON_LOCK = {"terraform-1.8.5", "terraform-1.12.2", "tofu-1.6.3", "tofu-1.8.5"}

SLOW = """
resource "null_resource" "slow" {
  triggers = { v = "slow" }
  provisioner "local-exec" { command = "sleep 8" }
}
"""


@pytest.mark.parametrize("tool", TOOLS)
def test_two_concurrent_applies(tool, users_server, db_url, tmp_path):
    name = f"race-{tool}"
    ws = _workspace(tool, users_server, tmp_path, name)
    ws.write(SLOW)
    ws.run("init", "-input=false", "-no-color")
    other = Workspace(tool, ws.binary, tmp_path / "second", ws.url, "alice", "alice-pw")
    shutil.copytree(ws.dir, other.dir, symlinks=True)
    other.write(SLOW + 'resource "null_resource" "more" { triggers = { v = "more" } }\n')

    first = ws.start("apply", "-auto-approve", "-input=false", "-no-color")
    try:
        holder = wait_for_lock_holder(db_url, name, first)
        refused = other.run("apply", "-auto-approve", "-input=false", "-no-color", "-lock-timeout=0s", check=False)
        assert refused.returncode != 0
        # These versions print the holder's lock ID from our 423 body (the holder's Who is printed
        # only from Terraform 1.15 / OpenTofu 1.9 on).
        assert f"ID={holder['ID']}" in refused.stderr, refused.stderr
        if tool in WAITS_ON_LOCK:
            # With -lock-timeout the second one waits for the first (it retries while the 423 body
            # names a holder) and then goes ahead.
            waited = other.run("apply", "-auto-approve", "-input=false", "-no-color", "-lock-timeout=120s")
            assert "Apply complete" in waited.stdout
            assert first.poll() is not None, "the second apply finished while the first still held the lock"
            assert first.wait(timeout=120) == 0, first.communicate()
        else:
            assert first.wait(timeout=120) == 0, first.communicate()
            other.run("apply", "-auto-approve", "-input=false", "-no-color")
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    addresses = [(a, d) for a, _, d, _ in _lifecycles(db_url, name)]
    assert addresses == [("null_resource.more", None), ("null_resource.slow", None)]
    serials = [s for s, _, _ in _versions(db_url, name)]
    assert serials == sorted(set(serials))
    with psycopg.connect(db_url) as c:
        assert one_row(c, "SELECT count(*) FROM state_locks")[0] == 0


@pytest.mark.parametrize("tool", TOOLS)
def test_force_unlock(tool, users_server, db_url, tmp_path):
    name = f"stuck-{tool}"
    ws = _workspace(tool, users_server, tmp_path, name)
    ws.write('resource "null_resource" "a" {}\n')
    ws.run("init", "-input=false", "-no-color")
    # A client that died holding the lock.
    crashed = {"ID": "6a1c9f4e-1111-2222-3333-444455556666", "Operation": "OperationTypeApply", "Info": "",
               "Who": "ghost@crashed-runner", "Version": "1.0.3", "Created": "2026-11-29T10:00:00Z", "Path": ""}
    assert users_server.basic("alice", "alice-pw").request("LOCK", f"/states/{name}", crashed).status == 200
    blocked = ws.run("apply", "-auto-approve", "-input=false", "-no-color", check=False)
    assert blocked.returncode != 0 and crashed["ID"] in blocked.stderr, blocked.stderr

    # Terraform's force-unlock sends no lock ID: a plain user may not, an admin may.
    denied = ws.run("force-unlock", "-force", crashed["ID"], check=False)
    assert denied.returncode != 0 and "403" in denied.stdout + denied.stderr, denied.stdout + denied.stderr
    admin = Workspace(tool, ws.binary, ws.dir, ws.url, "root", "root-pw")
    admin.run("force-unlock", "-force", crashed["ID"])
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    events = _events(db_url, name)
    assert events[:2] == [("lock", "alice", "ghost@crashed-runner"), ("force_unlock", "root", "ghost@crashed-runner")]


LONG = """
resource "null_resource" "a" { triggers = { v = "a" } }
resource "null_resource" "b" {
  triggers   = { v = "b" }
  depends_on = [null_resource.a]
  provisioner "local-exec" { command = "sleep 22" }
}
resource "null_resource" "c" {
  triggers   = { v = "c" }
  depends_on = [null_resource.b]
}
"""


def test_intermediate_snapshots_of_a_long_apply(users_server, db_url, tmp_path):
    """Terraform >= 1.5 persists state about every 20 s during an apply: each snapshot that changed
    something is a version, with lifecycles opened once, never duplicated by the final write."""
    name = "long-apply"
    ws = _workspace("terraform-1.8.5", users_server, tmp_path, name)
    ws.write(LONG)
    ws.run("init", "-input=false", "-no-color")
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    serials = [s for s, _, _ in _versions(db_url, name)]
    assert len(serials) >= 2, f"expected an intermediate snapshot and the final state, got serials {serials}"
    life = _lifecycles(db_url, name)
    assert [(a, d) for a, _, d, _ in life] == [("null_resource.a", None), ("null_resource.b", None), ("null_resource.c", None)]
    created = {a: c for a, c, _, _ in life}
    assert created["null_resource.a"] < created["null_resource.c"] == serials[-1]
