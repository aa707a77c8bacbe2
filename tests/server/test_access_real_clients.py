"""Grants through real Terraform and OpenTofu clients (issue 20): a read-only token can `plan`
(which locks and unlocks) but its `apply`, `apply -refresh-only`, `import` and `state rm` are refused
at the lock, before any resource is touched, with the reason in the client's output, nothing written
and no lock left; a token for state A is refused on state B; a write token applies. Offline: the
providers come from the filesystem mirror of scripts/test-providers.sh."""
from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from kit.tfcli import Workspace, local_tf, tool_binary

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
    assert applied.returncode != 0 and "lock needs write" in out, out
    assert _serials(db_url, state_a) == serials  # nothing written
    assert _locks(db_url) == []
    assert ("token:net-reader", f"LOCK /states/{state_a}", state_a) in _refusals(db_url)

    # State B: the same tokens, no grant there.
    for label, token in (("b-reader", reader), ("b-writer", writer)):
        wb = _workspace(tool, server, tmp_path, label, state_b, token)
        wb.write(V1)
        r = wb.run("init", "-input=false", "-no-color", check=False)
        # The http backend reports a GET's 401 or 403 as "invalid auth" (the audit says it was a 403);
        # init need not read the state, and plan locks first, and a refused LOCK says why.
        said = "invalid auth"
        if r.returncode == 0:
            r = wb.run("plan", "-input=false", "-no-color", check=False)
            said = f"has no grant on state '{state_b}'"
        assert r.returncode != 0 and said in " ".join((r.stdout + r.stderr).split()), r.stdout + r.stderr
    assert _serials(db_url, state_b) == []
    assert {(a, s) for a, _, s in _refusals(db_url)} >= {("token:net-reader", state_b), ("token:net-writer", state_b)}

    # The writer's apply of the change goes through.
    ws.write(V2)
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    assert _serials(db_url, state_a)[-1] > serials[-1]


# The tools whose output the refusal was checked in: the oldest Terraform, the newest, and OpenTofu.
LOCK_TOOLS = ("terraform-1.0.3", "terraform-1.12.2", "tofu-1.8.5")


def _local_files(url: str, out: Path, names: tuple[str, ...]) -> str:
    files = "".join(f'resource "local_file" "{n}" {{\n  filename = "{out / n}.txt"\n  content  = "{n}"\n}}\n'
                    for n in names)
    return local_tf(url, f"""{files}""")


@pytest.mark.parametrize("tool", LOCK_TOOLS)
def test_read_token_is_refused_at_the_lock_before_any_resource_is_created(tool, server, db_url, tmp_path, run_kl):
    """A read token's apply must not reach the provider: refused at its LOCK, with kl's reason in
    Terraform's output, no local_file created, no version, no lock. Its plan still works; so do the
    same steps with a write token."""
    state = f"net/{tool}"
    out = tmp_path / "files"
    out.mkdir()
    writer = _workspace(tool, server, tmp_path, "writer", state, _token(run_kl, "net-writer", "write", "net/**"))
    reader = _workspace(tool, server, tmp_path, "reader", state, _token(run_kl, "net-reader", "read", "net/**"))
    (writer.dir / "main.tf").write_text(_local_files(writer.url, out, ("a",)))
    writer.run("init", "-input=false", "-no-color")
    writer.run("apply", "-auto-approve", "-input=false", "-no-color")
    serials = _serials(db_url, state)
    assert serials and (out / "a.txt").exists()

    (reader.dir / "main.tf").write_text(_local_files(reader.url, out, ("a", "b")))
    reader.run("init", "-input=false", "-no-color")
    plan = reader.run("plan", "-input=false", "-no-color", "-detailed-exitcode", check=False)
    assert plan.returncode == 2, plan.stdout + plan.stderr  # locked, read, saw local_file.b to create, unlocked
    assert _locks(db_url) == []

    refused = {"apply": ("apply", "-auto-approve", "-input=false", "-no-color"),
               "apply -refresh-only": ("apply", "-refresh-only", "-auto-approve", "-input=false", "-no-color"),
               "import": ("import", "-input=false", "-no-color", "local_file.b", str(out / "b.txt")),
               "state rm": ("state", "rm", "-no-color", "local_file.a")}
    for label, args in refused.items():
        r = reader.run(*args, check=False)
        said = " ".join((r.stdout + r.stderr).split())  # the message is wrapped at 80 columns
        assert r.returncode != 0, (label, said)
        assert "Error acquiring the state lock" in said and "the state is not locked: token:net-reader has only read " \
            f"on state '{state}'" in said and "lock needs write" in said, (label, said)
        assert not (out / "b.txt").exists(), label
        assert _serials(db_url, state) == serials and _locks(db_url) == [], label
    assert [r for r in _refusals(db_url) if r[0] == "token:net-reader"] == \
        [("token:net-reader", f"LOCK /states/{state}", state)] * len(refused)

    # The write token does the same apply: the lock, the file and a new version.
    (writer.dir / "main.tf").write_text(_local_files(writer.url, out, ("a", "b")))
    writer.run("apply", "-auto-approve", "-input=false", "-no-color")
    assert (out / "b.txt").read_text() == "b"
    assert _serials(db_url, state)[-1] > serials[-1] and _locks(db_url) == []
