"""kl serve and credentials: never logged or stored, compared in constant time.

Covered elsewhere, not repeated here: a non-loopback address without authentication (or TLS) is
refused (tests/server/test_serve_cli.py::test_refuses_bad_or_unsafe_setups), and the provider's
plugin socket lives in a private 0700 directory (tests/provider/test_faults.py::
test_socket_lives_in_a_private_directory_removed_at_close; AutoMTLS by default:
test_automtls_is_the_default_and_env_turns_it_off)."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from typing import Any

import pytest

from kilolock.server import auth as auth_mod
from kit.leaks import Serve, basic, db_rows, leaks


def state_body(serial: int) -> bytes:
    return json.dumps({"version": 4, "terraform_version": "1.0.3", "serial": serial, "lineage": "cred-lineage",
                       "outputs": {}, "resources": []}).encode()


def test_credentials_reach_neither_the_server_log_nor_any_table(db_url, tmp_path, run_kl):
    tag = uuid.uuid4().hex[:10]
    creds = {"alice's password": f"pw-alice-{tag}", "token": f"tok-{tag}", "admin token": f"admintok-{tag}",
             "a mistyped password": f"pw-alicf-{tag}", "an unknown user's password": f"pw-mallory-{tag}"}
    r = run_kl("serve", "--hash-password", input=creds["alice's password"].encode() + b"\n")
    assert r.returncode == 0, r.stderr
    (tmp_path / "users").write_text(f"alice:{r.stdout.decode().strip()}\n")
    srv = Serve(db_url, "--users-file", str(tmp_path / "users"),
                env={"KL_SERVE_TOKEN": creds["token"], "KL_SERVE_ADMIN_TOKEN": creds["admin token"]})
    try:
        alice = basic("alice", creds["alice's password"])
        refused = [basic("alice", creds["a mistyped password"]), basic("mallory", creds["an unknown user's password"]),
                   f"Bearer {creds['a mistyped password']}", f"Basic {creds['a mistyped password']}",  # not base64
                   "Basic " + base64.b64encode(creds["a mistyped password"].encode()).decode()]  # no colon
        for header in refused:
            assert srv.get("/states/prod", header)[0] == 401, header
        assert srv.get("/states/prod", None)[0] == 401
        assert srv.get("/states/prod", alice, "POST", state_body(1))[0] == 200
        lock = json.dumps({"ID": str(uuid.uuid4()), "Operation": "OperationTypeApply", "Who": "ci@runner", "Version": "1.0.3",
                           "Created": "2026-01-01T00:00:00Z", "Path": "", "Info": ""}).encode()
        assert srv.get("/states/prod", f"Bearer {creds['token']}", "LOCK", lock)[0] == 200
        assert srv.get("/states/prod", basic("x", creds["token"]), "UNLOCK", lock)[0] == 200
        assert srv.get("/api/v1/states", f"Bearer {creds['admin token']}")[0] == 200
        assert srv.get("/states/prod", alice, "DELETE")[0] == 403  # alice is no admin
    finally:
        log = srv.stop()
    # Logging was on and saw these requests: the grep below is not of an empty log.
    assert b"LOCK /states/prod" in log and b" 401 " in log and b" 200 " in log, log
    spellings = {**creds, **{f"Basic of {k}": v for k, v in (("alice", "alice:" + creds["alice's password"]),
                                                            ("token", "x:" + creds["token"]))}}
    spellings = {**spellings, **{k: base64.b64encode(v.encode()).decode() for k, v in spellings.items() if k.startswith("Basic")}}
    tables = db_rows(db_url, exclude=frozenset())
    assert b'"who": "token"' in tables["table lock_events"] or b"token" in tables["table lock_events"], tables["table lock_events"]
    assert b"alice" in tables["table state_versions"]  # the actor is the user name, not the credential
    assert leaks(spellings, {"kl serve log": log, **tables}) == []


_REAL_COMPARE = hmac.compare_digest  # auth_mod.hmac is the hmac module itself, which the tests patch


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[bytes, bytes]] = []

    def __call__(self, a: bytes, b: bytes) -> bool:
        self.calls.append((bytes(a), bytes(b)))
        return _REAL_COMPARE(a, b)


def test_tokens_are_compared_in_constant_time_against_every_configured_token(monkeypatch: pytest.MonkeyPatch):
    recorder = _Recorder()
    monkeypatch.setattr(auth_mod.hmac, "compare_digest", recorder)
    auth = auth_mod.Authenticator(token="plain-token", admin_token="admin-token")
    for presented, expected in (("plain-token", "token"), ("admin-token", "token (admin)"), ("plain-tokeX", None)):
        recorder.calls.clear()
        principal = auth.authenticate(f"Bearer {presented}")
        got = None if principal is None else principal.name + (" (admin)" if principal.admin else "")
        assert got == expected
        # Both tokens are compared whatever matched, each with compare_digest: neither the match nor
        # the length of a common prefix shows in the time taken.
        assert sorted(recorder.calls) == sorted([(presented.encode(), b"admin-token"), (presented.encode(), b"plain-token")])


def test_passwords_cost_one_scrypt_and_a_digest_compare_for_known_and_unknown_users(monkeypatch: pytest.MonkeyPatch):
    line = auth_mod.hash_password("right-password", n=2**10)
    users = {"alice": auth_mod._User(auth_mod._parse_hash(line, "test"), admin=False)}
    auth = auth_mod.Authenticator(users)
    scrypts: list[bytes] = []
    real_scrypt = hashlib.scrypt

    def counting_scrypt(password: bytes, **kw: Any) -> bytes:
        scrypts.append(password)
        return real_scrypt(password, **kw)

    recorder = _Recorder()
    monkeypatch.setattr(auth_mod.hashlib, "scrypt", counting_scrypt)
    monkeypatch.setattr(auth_mod.hmac, "compare_digest", recorder)
    for user, password, ok in (("alice", "wrong-password", False), ("mallory", "any-password", False), ("alice", "right-password", True)):
        scrypts.clear()
        recorder.calls.clear()
        assert (auth.authenticate(basic(user, password)) is not None) is ok
        # An unknown user is hashed against a dummy entry, so timing does not reveal who exists.
        assert scrypts == [password.encode()], (user, scrypts)
        digest_compares = [c for c in recorder.calls if len(c[0]) == 32 and password.encode() not in c]
        assert len(digest_compares) == 1, recorder.calls
