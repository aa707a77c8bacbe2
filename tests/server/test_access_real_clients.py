"""Grants through real Terraform 1.8.5 and OpenTofu 1.6.3 clients (issue 20): a read-only token
can `plan` (which locks and unlocks) but its `apply` is refused at the write, with nothing written
and no lock left; a token for state A is refused on state B; a write token applies. Offline: the
null provider comes from the filesystem mirror of scripts/test-providers.sh."""
from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from kit.tfcli import Workspace, tool_binary

TOOLS = ("terraform-1.8.5", "tofu-1.6.3")

V1 = 'resource "null_resource" "a" { triggers = { v = "a1" } }\n'
V2 = 'resource "null_resource" "a" { triggers = { v = "a2" } }\n'


@pytest.fixture
def server(start_server, db_url):
    from kilolock.server.auth import Authenticator

    return start_server(auth=Authenticator(kl_tokens=True))


def _token(run_kl, name: str, role: str, states: str) -> str:
    r = run_kl("token", "create", name, "--role", role, "--states", states, "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    return str(json.loads(r.stdout)["token"])


def _workspace(tool: str, server, tmp_path: Path, label: str, state: str, token: str) -> Workspace:
    d = tmp_path / f"{label}-{tool}"
    d.mkdir()
    # Any user name: the token is the password (TF_HTTP_PASSWORD), as CI would set it.
    return Workspace(tool, tool_binary(tool), d, f"{server.url}/states/{state}", "ci", token)


def _serials(db_url: str, name: str) -> list[int]:
    with psycopg.connect(db_url) as c:
        return [r[0] for r in c.execute(
            "SELECT v.serial FROM state_versions v JOIN states s ON s.id = v.state_id WHERE s.name = %s ORDER BY 1",
            (name,)).fetchall()]


def _locks(db_url: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT lock_id FROM state_locks").fetchall()


def _refusals(db_url: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT actor, target, state FROM access_audit WHERE action = 'refused' ORDER BY id").fetchall()


@pytest.mark.parametrize("tool", TOOLS)
def test_read_token_plans_but_cannot_apply_and_other_states_are_refused(tool, server, db_url, tmp_path, run_kl):
    state_a, state_b = f"net/{tool}", f"pay/{tool}"
    writer = _token(run_kl, "net-writer", "write", "net/**")
    reader = _token(run_kl, "net-reader", "read", "net/**")

    ws = _workspace(tool, server, tmp_path, "writer", state_a, writer)
    ws.write(V1)
    ws.run("init", "-input=false", "-no-color")
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    serials = _serials(db_url, state_a)
    assert serials

    ro = _workspace(tool, server, tmp_path, "reader", state_a, reader)
    ro.write(V2)
    ro.run("init", "-input=false", "-no-color")
    plan = ro.run("plan", "-input=false", "-no-color", "-detailed-exitcode", check=False)
    assert plan.returncode == 2, plan.stdout + plan.stderr  # plan worked (with its lock), and sees the change
    applied = ro.run("apply", "-auto-approve", "-input=false", "-no-color", check=False)
    out = applied.stdout + applied.stderr
    assert applied.returncode != 0 and "403" in out, out
    assert _serials(db_url, state_a) == serials  # nothing written
    assert _locks(db_url) == []  # the reader released its own lock
    assert ("token:net-reader", f"POST /states/{state_a}", state_a) in _refusals(db_url)

    # State B: the same tokens, no grant there.
    for label, token in (("b-reader", reader), ("b-writer", writer)):
        wb = _workspace(tool, server, tmp_path, label, state_b, token)
        wb.write(V1)
        r = wb.run("init", "-input=false", "-no-color", check=False)
        if r.returncode == 0:  # init need not read the state; plan must
            r = wb.run("plan", "-input=false", "-no-color", check=False)
        # The http backend reports a GET's 401 or 403 as "invalid auth"; the audit says it was a 403.
        assert r.returncode != 0 and "invalid auth" in r.stdout + r.stderr, r.stdout + r.stderr
    assert _serials(db_url, state_b) == []
    assert {(a, s) for a, _, s in _refusals(db_url)} >= {("token:net-reader", state_b), ("token:net-writer", state_b)}

    # The writer's apply of the change goes through.
    ws.write(V2)
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    assert _serials(db_url, state_a)[-1] > serials[-1]
