"""Access control per state (issue 20): kl token and kl access from the command line, and every
kl serve route checking the grant of the state it touches, over HTTP: the backend, the JSON API,
/metrics and the lists. Real Terraform / OpenTofu clients are in test_access_real_clients.py."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from kit.httpclient import Client
from kit.invariants import wait_for
from kit.pg import one_row
from kit.procs import stderr_line

REPO = Path(__file__).resolve().parents[2]
STATE_A = "net/prod"  # the tokens' grants cover net/**
STATE_B = "pay/prod"  # and never this one


def _lock_info(lock_id: str, operation: str = "OperationTypePlan") -> dict:
    return {"ID": lock_id, "Operation": operation, "Info": "", "Who": "ci@runner", "Version": "1.8.5",
            "Created": "2026-11-30T12:00:00Z", "Path": ""}


def _start_kl_serve(db_url: str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int, str]:
    """A real kl serve process, its port and its banner (two lines: the URLs, then authentication)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    full_env = {**os.environ, "KL_DATABASE_URL": db_url, "PYTHONPATH": str(REPO), "KL_SERVE_TOKEN": "", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "kilolock", "serve", "--listen", f"127.0.0.1:{port}", *args],
                            env=full_env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    banner = proc.stderr.readline()
    assert "kl serve:" in banner, banner + (proc.stderr.read() if proc.poll() is not None else "")
    banner += stderr_line(proc)
    return proc, port, banner


def _stop(proc: subprocess.Popen) -> str:
    """Stop kl serve as systemd would; the rest of what it printed."""
    try:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        return str(proc.stderr.read())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _create_token(run_kl, name: str, role: str, states: str, *extra: str) -> str:
    r = run_kl("token", "create", name, "--role", role, "--states", states, "--format", "json", *extra)
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    assert doc["name"] == name and doc["role"] == role and doc["states"] == states
    return str(doc["token"])


@pytest.fixture
def server(start_server, db_url, tmp_path):
    """kl serve accepting kl tokens, with a users file (alice plain, root admin) and KL_SERVE_TOKEN."""
    from kilolock.server.auth import Authenticator, hash_password

    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\nroot:{hash_password('root-pw', n=2**10)}:admin\n")
    auth = Authenticator.from_config(str(users), env={"KL_SERVE_TOKEN": "env-token"}, kl_tokens=True)
    return start_server(auth=auth)


@pytest.fixture
def seeded(server, make_state):
    """Both states exist with a version, written by the admin user."""
    root = server.basic("root", "root-pw")
    for name in (STATE_A, STATE_B):
        assert root.request("POST", f"/states/{name}", make_state(1, {"a": {"id": "1"}})).status == 200
    return server


# What each role may do, per route: (route, allowed for read, write, admin) on a state it has.
MATRIX = (
    ("GET /states", True, True, True),
    ("LOCK own + UNLOCK own", True, True, True),
    ("LOCK for apply + UNLOCK own", False, True, True),
    ("POST /states", False, True, True),
    ("UNLOCK another's lock by ID", False, True, True),
    ("force-unlock (no ID)", False, False, True),
    ("DELETE /states", False, False, True),
    ("GET /api/v1/states/NAME/versions", True, True, True),
    ("GET /api/v1/states/NAME/drift", True, True, True),
)


def _attempt(client: Client, admin: Client, route: str, state: str, make_state, serial: int) -> int:
    """Try ROUTE on STATE; the status of the request under test."""
    if route == "GET /states":
        return client.request("GET", f"/states/{state}").status
    if route in ("LOCK own + UNLOCK own", "LOCK for apply + UNLOCK own"):
        info = _lock_info("own", "OperationTypePlan" if route.startswith("LOCK own") else "OperationTypeApply")
        status = client.request("LOCK", f"/states/{state}", info).status
        if status != 200:
            return status
        return client.request("UNLOCK", f"/states/{state}", info).status
    if route == "POST /states":
        return client.request("POST", f"/states/{state}", make_state(serial, {"a": {"id": "1"}})).status
    if route == "UNLOCK another's lock by ID":
        assert admin.request("LOCK", f"/states/{state}", _lock_info("admins")).status == 200
        status = client.request("UNLOCK", f"/states/{state}", {"ID": "admins"}).status
        admin.request("UNLOCK", f"/states/{state}", _lock_info("admins"))
        return status
    if route == "force-unlock (no ID)":
        assert admin.request("LOCK", f"/states/{state}", _lock_info("stuck")).status == 200
        status = client.request("UNLOCK", f"/states/{state}", b"").status
        admin.request("UNLOCK", f"/states/{state}", _lock_info("stuck"))
        return status
    if route == "DELETE /states":
        status = client.request("DELETE", f"/states/{state}").status
        if status == 200:  # put it back for the next routes
            assert admin.request("POST", f"/states/{state}", make_state(1, {"a": {"id": "1"}})).status == 200
        return status
    if route.startswith("GET /api/v1/states/NAME/"):
        return client.request("GET", f"/api/v1/states/{state}/{route.rsplit('/', 1)[1]}").status
    raise AssertionError(route)


@pytest.mark.parametrize("role", ["read", "write", "admin"])
def test_roles_by_routes_by_two_states(role, seeded, run_kl, make_state, db_url):
    token = _create_token(run_kl, f"ci-{role}", role, "net/**")
    client, admin = seeded.with_auth(f"Bearer {token}"), seeded.basic("root", "root-pw")
    serial = 10
    for route, *allowed in MATRIX:
        want = allowed[("read", "write", "admin").index(role)]
        serial += 1
        refused = 409 if route.startswith("LOCK") else 403  # a refused LOCK: see test_a_refused_lock_...
        got_a = _attempt(client, admin, route, STATE_A, make_state, serial)
        assert got_a == (200 if want else refused), (role, route, STATE_A, got_a)
        got_b = _attempt(client, admin, route, STATE_B, make_state, serial)
        assert got_b == refused, (role, route, STATE_B, got_b)  # no grant there: refused, whatever the role
    # The refusals are one line each, and each is in the audit with who, what and the state.
    refused = client.request("GET", f"/states/{STATE_B}")
    assert refused.status == 403 and refused.text.count("\n") == 1
    assert f"token:ci-{role} has no grant on state 'pay/prod'" in refused.text
    with psycopg.connect(db_url) as c:
        rows = c.execute("SELECT actor, action, target, state, detail, at FROM access_audit WHERE action = 'refused' "
                         "ORDER BY id").fetchall()
    assert rows and all(r[0] == f"token:ci-{role}" and r[5] is not None for r in rows)
    assert ("GET /states/pay/prod", STATE_B) in {(r[2], r[3]) for r in rows}
    assert len(rows) == sum(1 for _, *a in MATRIX if not a[("read", "write", "admin").index(role)]) + len(MATRIX) + 1


def test_lists_and_metrics_show_only_readable_states(seeded, run_kl):
    token = _create_token(run_kl, "ci-net", "read", "net/*")
    client = seeded.with_auth(f"Bearer {token}")
    names = [s["name"] for s in client.request("GET", "/api/v1/states").json()["states"]]
    assert names == [STATE_A]
    admin_names = [s["name"] for s in seeded.basic("root", "root-pw").request("GET", "/api/v1/states").json()["states"]]
    assert admin_names == [STATE_A, STATE_B]
    metrics = client.request("GET", "/metrics")
    assert metrics.status == 200
    assert f'kilolock_state_open_drift{{state="{STATE_A}"}}' in metrics.text
    assert STATE_B not in metrics.text
    assert STATE_B in seeded.basic("root", "root-pw").request("GET", "/metrics").text
    for sort in ("name", "drift", "updated"):  # the web UI's overview filters in SQL, by the grants' globs
        overview = client.request("GET", f"/ui/?sort={sort}")
        assert overview.status == 200 and STATE_A in overview.text and STATE_B not in overview.text, sort
        everything = seeded.basic("root", "root-pw").request("GET", f"/ui/?sort={sort}").text
        assert STATE_A in everything and STATE_B in everything, sort


def test_users_file_and_env_token_keep_todays_rights_until_granted(seeded, run_kl, make_state):
    alice, env = seeded.basic("alice", "alice-pw"), seeded.with_auth("Bearer env-token")
    for who in (alice, env):  # write on **: reads and writes everywhere, never DELETE
        for state in (STATE_A, STATE_B):
            assert who.request("GET", f"/states/{state}").status == 200
        assert who.request("DELETE", f"/states/{STATE_B}").status == 403
    assert alice.request("POST", f"/states/{STATE_B}", make_state(2, {"a": {"id": "1"}})).status == 200
    r = run_kl("access", "check", "alice", STATE_B)
    assert r.returncode == 0 and "users file decides" in r.stdout.decode()
    # A grant narrows alice to her grants; the admin flag of root still gives admin on **.
    r = run_kl("access", "grant", "alice", "--role", "read", "--states", "net/**")
    assert r.returncode == 0 and "only its grants" in r.stdout.decode(), r.stderr
    assert alice.request("GET", f"/states/{STATE_B}").status == 403
    assert alice.request("POST", f"/states/{STATE_A}", make_state(3, {"a": {"id": "1"}})).status == 403
    assert alice.request("GET", f"/states/{STATE_A}").status == 200
    check = json.loads(run_kl("access", "check", "user:alice", STATE_A, "--format", "json").stdout)
    assert check["role"] == "read" and check["through"].endswith("read on net/**") and check["allowed"]["write"] is False
    assert run_kl("access", "revoke", "alice", "--all").returncode == 0
    assert alice.request("GET", f"/states/{STATE_B}").status == 200  # back to the users file's rights
    assert seeded.basic("root", "root-pw").request("DELETE", f"/states/{STATE_B}").status == 200


def test_expired_or_revoked_token_is_refused_at_once(seeded, run_kl, db_url):
    token = _create_token(run_kl, "short", "read", "**", "--expires", "1h")
    other = _create_token(run_kl, "gone", "read", "**")
    client, gone = seeded.with_auth(f"Bearer {token}"), seeded.basic("terraform", other)
    assert client.request("GET", f"/states/{STATE_A}").status == 200
    assert gone.request("GET", f"/states/{STATE_A}").status == 200
    listed = {t["name"]: t for t in json.loads(run_kl("token", "list", "--format", "json").stdout)["tokens"]}
    assert listed["short"]["expires_at"] is not None and listed["short"]["last_used_at"] is not None
    # Expiry passes (moved, rather than waited for) and the revocation is one command: the next
    # request is refused, with no cache to wait out.
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("UPDATE access_tokens SET expires_at = now() - interval '1 second' WHERE name = 'short'")
    assert run_kl("token", "revoke", "gone").returncode == 0
    assert client.request("GET", f"/states/{STATE_A}").status == 401
    assert gone.request("GET", f"/states/{STATE_A}").status == 401
    listed = {t["name"]: t for t in json.loads(run_kl("token", "list", "--format", "json").stdout)["tokens"]}
    assert listed["short"]["expired"] and listed["gone"]["revoked_at"] is not None
    again = run_kl("token", "create", "gone", "--role", "read", "--states", "**")
    assert again.returncode == 1 and "exists already" in again.stderr.decode()


def test_last_used_is_written_at_most_once_a_minute(seeded, run_kl, db_url):
    token = _create_token(run_kl, "busy", "read", "**")
    client = seeded.with_auth(f"Bearer {token}")
    assert client.request("GET", f"/states/{STATE_A}").status == 200
    with psycopg.connect(db_url, autocommit=True) as c:
        first = one_row(c, "SELECT last_used_at FROM access_tokens WHERE name = 'busy'")[0]
        c.execute("UPDATE access_tokens SET last_used_at = NULL WHERE name = 'busy'")
        for _ in range(5):
            assert client.request("GET", f"/states/{STATE_A}").status == 200
        assert first is not None and one_row(c, "SELECT last_used_at FROM access_tokens WHERE name = 'busy'")[0] is None


def test_a_lock_records_its_principal_and_read_may_release_only_its_own(seeded, run_kl, db_url):
    reader = seeded.with_auth("Bearer " + _create_token(run_kl, "planner", "read", "net/**"))
    other = seeded.with_auth("Bearer " + _create_token(run_kl, "planner2", "read", "net/**"))
    assert reader.request("LOCK", f"/states/{STATE_A}", _lock_info("plan-1")).status == 200
    with psycopg.connect(db_url) as c:
        assert one_row(c, "SELECT principal FROM state_locks")[0] == "token:planner"
    assert other.request("UNLOCK", f"/states/{STATE_A}", _lock_info("plan-1")).status == 403
    assert reader.request("UNLOCK", f"/states/{STATE_A}", _lock_info("plan-1")).status == 200


# LockInfo Operations as Terraform and OpenTofu send them (plan, apply, refresh and the state
# commands; import and console say OperationTypeInvalid), and what a body may leave out.
OPERATIONS = ("OperationTypePlan", "OperationTypeApply", "OperationTypeRefresh", "OperationTypeInvalid", "state-rm",
              "state-mv", "state-push", "state-replace-provider", "taint", "untaint", "import", "workspace-new", "",
              "operationtypeplan", None)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_only_a_plan_lock_is_a_read(operation):
    """The decision itself, per Operation: read may take a plan's lock and nothing else; write any."""
    from kilolock.server.access import Grant, Grants, lock_action

    reader = Grants("token:r", (Grant("read", "net/**", "grant 1"),))
    writer = Grants("token:w", (Grant("write", "net/**", "grant 2"),))
    action = lock_action(operation)
    assert bool(reader.allows(action, STATE_A)) is (operation == "OperationTypePlan"), action
    assert writer.allows(action, STATE_A)
    assert not writer.allows(action, STATE_B) and not reader.allows(action, STATE_B)
    if operation != "OperationTypePlan":
        assert reader.allows(action, STATE_A).reason.endswith("lock needs write")


def test_a_refused_lock_says_why_in_the_lock_id_and_locks_nothing(seeded, run_kl, db_url):
    """A read token's LOCK for anything but a plan: refused before anything is locked, audited, and
    answered as Terraform prints it: a 409 whose LockInfo ID is the one-line reason."""
    reader = seeded.with_auth("Bearer " + _create_token(run_kl, "ci-reader", "read", "net/**"))
    bodies = {"apply": _lock_info("L1", "OperationTypeApply"), "state-rm": _lock_info("L2", "state-rm"),
              "no Operation": {"ID": "L3"}, "not a LockInfo": b"{"}
    for label, body in bodies.items():
        r = reader.request("LOCK", f"/states/{STATE_A}", body)
        assert r.status == 409 and r.headers["content-type"] == "application/json", (label, r.status, r.text)
        doc = r.json()
        assert set(doc) == {"ID", "Operation", "Info", "Who", "Version", "Created", "Path"}, doc
        assert doc["ID"].startswith("none, the state is not locked: token:ci-reader has only read on state 'net/prod'")
        assert "lock needs write" in doc["ID"] and "read may lock only for terraform plan" in doc["ID"], doc
        assert doc["ID"].endswith("; nothing done") and "\n" not in doc["ID"] and doc["Info"] in doc["ID"]
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM state_locks").fetchone() == (0,)
        audit = c.execute("SELECT actor, target, state, detail FROM access_audit WHERE action = 'refused' "
                          "ORDER BY id").fetchall()
    assert [(a, t, s) for a, t, s, _ in audit] == [("token:ci-reader", f"LOCK /states/{STATE_A}", STATE_A)] * 4
    assert "(a LOCK for OperationTypeApply;" in audit[0][3] and "(a LOCK for state-rm;" in audit[1][3]
    assert "(a LOCK without an Operation;" in audit[2][3] and "(a LOCK without an Operation;" in audit[3][3]
    # Its plan still locks and unlocks; a write token locks for an apply.
    assert reader.request("LOCK", f"/states/{STATE_A}", _lock_info("P")).status == 200
    assert reader.request("UNLOCK", f"/states/{STATE_A}", _lock_info("P")).status == 200
    writer = seeded.with_auth("Bearer " + _create_token(run_kl, "ci-writer", "write", "net/**"))
    assert writer.request("LOCK", f"/states/{STATE_A}", _lock_info("A", "OperationTypeApply")).status == 200
    assert writer.request("UNLOCK", f"/states/{STATE_A}", _lock_info("A", "OperationTypeApply")).status == 200


def test_grant_and_token_changes_are_audited_and_tokens_never_stored(seeded, run_kl, db_url, make_state):
    token = _create_token(run_kl, "ci-net", "write", "net/**", "--actor", "ops@cli")
    assert run_kl("access", "grant", "token:ci-net", "--role", "read", "--states", "pay/*", "--actor", "ops@cli").returncode == 0
    assert run_kl("access", "grant", "token:ci-net", "--role", "admin", "--states", "pay/*", "--actor", "ops@cli").returncode == 0
    assert run_kl("access", "revoke", "token:ci-net", "--states", "pay/*", "--actor", "ops@cli").returncode == 0
    client = seeded.with_auth(f"Bearer {token}")
    assert client.request("POST", f"/states/{STATE_A}", make_state(5, {"a": {"id": "1"}})).status == 200
    assert client.request("GET", f"/states/{STATE_B}").status == 403
    assert run_kl("token", "revoke", "ci-net", "--actor", "ops@cli").returncode == 0
    with psycopg.connect(db_url) as c:
        audit = c.execute("SELECT actor, action, target, detail FROM access_audit ORDER BY id").fetchall()
        # Every table's every row, as text: the secret is nowhere, only its SHA-256.
        tables = [r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()]
        dump = "\n".join(str(row) for t in tables for row in c.execute(f'SELECT * FROM "{t}"').fetchall())
    assert [(a[0], a[1], a[2]) for a in audit] == [
        ("ops@cli", "token.create", "token:ci-net"), ("ops@cli", "grant", "token:ci-net"),
        ("ops@cli", "grant", "token:ci-net"), ("ops@cli", "revoke", "token:ci-net"),
        ("token:ci-net", "refused", f"GET /states/{STATE_B}"), ("ops@cli", "token.revoke", "token:ci-net")]
    assert audit[2][3] == "admin on pay/* (was read)"
    assert token not in dump and token.removeprefix("klt_") not in dump
    listing = run_kl("token", "list").stdout.decode() + run_kl("token", "list", "--format", "json").stdout.decode()
    assert token not in listing and "ci-net" in listing
    logged = run_kl("access", "log").stdout.decode()
    assert "token.revoke" in logged and token not in logged


def test_tokens_never_appear_in_the_request_log(db_url, run_kl, make_state):
    token = _create_token(run_kl, "logged", "write", "**")
    proc, port, banner = _start_kl_serve(db_url)  # a token in the store: kl serve now asks for credentials
    assert "kl serve: authentication: on (1 kl token)" in banner, banner
    try:
        client = Client(f"http://127.0.0.1:{port}")
        assert client.request("GET", "/api/v1/states").status == 401
        assert client.with_auth(f"Bearer {token}").request("POST", "/states/t", make_state(1, {"a": {}})).status == 200
        assert client.basic("x", token).request("GET", "/states/nope/..").status in (400, 404)
        assert client.with_auth(f"Bearer {token}x").request("GET", "/states/t").status == 401
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "token:logged" in err and token not in err and token[4:20] not in err


@pytest.mark.parametrize(("args", "fragment"), [
    (["access", "grant", "group:x", "--role", "read", "--states", "a"], "user:NAME, token:NAME, cert:CN=NAME or oidc:TRUST:SUB-GLOB"),
    (["access", "grant", "token:nope", "--role", "read", "--states", "a"], "no token named 'nope'"),
    (["access", "grant", "alice", "--role", "owner", "--states", "a"], "invalid choice"),
    (["access", "revoke", "alice", "--states", "a/**"], "has no grant on a/**"),
    (["token", "create", "bad name", "--role", "read", "--states", "a"], "a token name is"),
    (["token", "create", "t", "--role", "read", "--states", "a", "--expires", "soon"], "--expires"),
    (["token", "revoke", "never-made"], "no token named 'never-made'"),
])
def test_bad_access_commands_are_one_line_errors(run_kl, db_url, args, fragment):
    r = run_kl(*args)
    err = r.stderr.decode()
    assert r.returncode in (1, 2) and fragment in err and "Traceback" not in err, err


def test_kl_access_check_names_the_grant(run_kl, db_url):
    assert run_kl("token", "create", "ci", "--role", "write", "--states", "net/**").returncode == 0
    assert run_kl("access", "grant", "token:ci", "--role", "admin", "--states", "net/prod").returncode == 0
    out = run_kl("access", "check", "token:ci", "net/prod").stdout.decode()
    assert "token:ci on net/prod: admin" in out and "admin on net/prod" in out
    out = run_kl("access", "check", "token:ci", "net/dev/eu").stdout.decode()
    assert "write" in out and "net/**" in out
    out = run_kl("access", "check", "token:ci", "pay/prod").stdout.decode()
    assert "nothing" in out
    listed = json.loads(run_kl("access", "list", "--format", "json").stdout)["grants"]
    assert [(g["principal"], g["role"], g["states"]) for g in listed] == [("token:ci", "write", "net/**"),
                                                                          ("token:ci", "admin", "net/prod")]


def test_grants_api_for_other_routes():
    """The API the web UI uses: allows -> Decision, readable, sql_regexes."""
    from kilolock.server.access import Grant, Grants

    g = Grants("token:ci", (Grant("read", "net/*", "grant 1"), Grant("write", "net/prod", "grant 2")))
    assert g.allows("write", "net/prod") and not g.allows("write", "net/dev")
    assert not g.allows("read", "net/dev/eu") and "no grant" in g.allows("read", "pay/x").reason
    assert g.readable(["net/a", "pay/b", "net/a/b"]) == ["net/a"]
    assert g.sql_regexes("write") == ["^net/prod$"] and Grants("x", (Grant("read", "**", "s"),)).sql_regexes() is None


def test_cli_is_an_operator_without_any_grant(run_kl, db_url, make_state, tmp_path):
    """kl on the database directly is not checked: grants bind kl serve's clients only."""
    path = tmp_path / "s.tfstate"
    path.write_bytes(make_state(1, {"a": {}}))
    assert run_kl("token", "create", "ci", "--role", "read", "--states", "nothing/**").returncode == 0
    assert run_kl("state", "import", STATE_B, str(path)).returncode == 0
    assert run_kl("state", "pull", STATE_B).returncode == 0


def test_without_authentication_force_unlock_still_needs_the_flag_and_is_audited(client, db_url):
    assert client.request("LOCK", "/states/open", _lock_info("held")).status == 200
    refused = client.request("UNLOCK", "/states/open", b"")
    assert refused.status == 403 and "--allow-force-unlock" in refused.text
    assert client.request("DELETE", "/states/open?ID=held").status == 200  # an operator otherwise: admin on **
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT actor, target, state FROM access_audit").fetchall() == [
            ("anonymous", "UNLOCK /states/open", "open")]


def test_tokens_and_grants_made_while_kl_serve_runs_take_effect_without_a_restart(db_url, run_kl, make_state):
    """A server started without credentials (the open loopback default) asks for them within a few
    seconds of the first kl token create, and for good: a grant change, a revocation, and the last
    token's revocation (which must not reopen it) all apply to the running server."""
    proc, port, banner = _start_kl_serve(db_url, "-q")
    try:
        assert banner.splitlines()[1] == "kl serve: authentication: off (loopback only; kl token create turns it on)", banner
        anonymous = Client(f"http://127.0.0.1:{port}")
        assert anonymous.request("POST", f"/states/{STATE_A}", make_state(1, {"a": {"id": "1"}})).status == 200
        token = _create_token(run_kl, "late", "read", "net/**")
        bearer = anonymous.with_auth(f"Bearer {token}")
        wait_for(lambda: anonymous.request("GET", "/api/v1/states").status == 401, 30, "kl serve to ask for credentials",
                 every=0.1)
        assert anonymous.request("GET", f"/states/{STATE_A}").status == 401
        assert bearer.request("GET", f"/states/{STATE_A}").status == 200
        assert bearer.request("POST", f"/states/{STATE_A}", make_state(2, {"a": {"id": "2"}})).status == 403
        assert run_kl("access", "grant", "token:late", "--role", "write", "--states", "net/**").returncode == 0
        wait_for(lambda: bearer.request("POST", f"/states/{STATE_A}", make_state(2, {"a": {"id": "2"}})).status == 200,
                 30, "the grant change to be honoured", every=0.1)
        assert run_kl("token", "revoke", "late").returncode == 0
        wait_for(lambda: bearer.request("GET", f"/states/{STATE_A}").status == 401, 30, "the revoked token to be refused",
                 every=0.1)
        # No usable token is left, and the server stays closed: authentication once on stays on.
        assert anonymous.request("GET", f"/states/{STATE_A}").status == 401
        assert anonymous.request("GET", "/api/v1/states").status == 401
    finally:
        rest = _stop(proc)
    assert [line for line in rest.splitlines() if "authentication" in line] == [
        "kl serve: authentication: on from now: a kl token exists (kl token create); every request needs credentials"], rest


def test_banner_counts_the_principals_and_kl_tokens_join_a_users_file_while_running(db_url, run_kl, tmp_path):
    from kilolock.server.auth import hash_password

    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password('alice-pw', n=2**10)}\nroot:{hash_password('root-pw', n=2**10)}:admin\n")
    _create_token(run_kl, "early", "read", "**")
    _create_token(run_kl, "revoked", "read", "**")
    assert run_kl("token", "revoke", "revoked").returncode == 0
    proc, port, banner = _start_kl_serve(db_url, "-q", "--users-file", str(users), env={"KL_SERVE_TOKEN": "env-tok"})
    try:
        assert banner.splitlines()[1] == "kl serve: authentication: on (2 users, 1 environment token, 1 kl token)", banner
        assert Client(f"http://127.0.0.1:{port}").basic("root", "root-pw").request("GET", "/api/v1/states").status == 200
    finally:
        _stop(proc)
    assert run_kl("token", "revoke", "early").returncode == 0
    proc, port, banner = _start_kl_serve(db_url, "-q", "--users-file", str(users))
    try:
        assert banner.splitlines()[1] == "kl serve: authentication: on (2 users, 0 kl tokens)", banner
        token = _create_token(run_kl, "later", "read", "**")
        bearer = Client(f"http://127.0.0.1:{port}").with_auth(f"Bearer {token}")
        wait_for(lambda: bearer.request("GET", "/api/v1/states").status == 200, 30, "the new kl token to be accepted",
                 every=0.1)
    finally:
        rest = _stop(proc)
    assert "kl serve: kl tokens are accepted from now (kl token create made one)" in rest.splitlines(), rest


def test_the_first_token_says_it_closes_an_open_server(db_url, run_kl):
    """Who makes the first kl token hears that a kl serve running without credentials requires
    them from now on; the second token changes nothing, and says nothing of it."""
    first = run_kl("token", "create", "one", "--role", "read", "--states", "**", "--format", "json")
    assert first.returncode == 0 and "the first kl token" in first.stderr.decode(), first.stderr
    second = run_kl("token", "create", "two", "--role", "read", "--states", "**")
    assert second.returncode == 0 and second.stderr == b"", second.stderr
    assert run_kl("token", "revoke", "one").returncode == 0 and run_kl("token", "revoke", "two").returncode == 0
    # Revoked tokens make no server require credentials: the next one is the first again.
    third = run_kl("token", "create", "three", "--role", "read", "--states", "**")
    assert "the first kl token" in third.stderr.decode(), third.stderr
