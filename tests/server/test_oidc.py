"""OIDC principals: `kl access trust oidc`, JWTs signed by an issuer of the test's own (its JWKS served
on loopback), checked by a real kl serve over HTTP against the real database: accepted, expired,
wrong audience or issuer, unknown key, alg none, a forged signature, a key rotated at the issuer;
grants by sub glob; the lock grace of a token that expired under its lock; every refusal one line
in the log and in the access audit, never the token."""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator

import psycopg
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from kit.oidc import AUDIENCE, Issuer, unsigned

MAIN = "repo:acme/infra:ref:refs/heads/main"


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    i = Issuer()
    yield i
    i.close()


def _trust(run_kl, issuer: Issuer, *extra: str, name: str = "ci") -> None:
    r = run_kl("access", "trust", "oidc", "--issuer", issuer.url, "--audience", AUDIENCE, "--jwks", issuer.jwks_url,
               "--name", name, *extra)
    assert r.returncode == 0, r.stderr.decode()


def _grant(run_kl, principal: str, role: str, states: str) -> None:
    r = run_kl("access", "grant", principal, "--role", role, "--states", states)
    assert r.returncode == 0, r.stderr.decode()


@pytest.fixture
def server(start_server):
    from kilolock.server.auth import Authenticator

    # As kl serve starts once a trust exists: the store's credentials accepted.
    return start_server(auth=Authenticator(kl_tokens=True), oidc_refetch_every=0.0)


def _refusals(db_url: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT actor, target, detail FROM access_audit WHERE action = 'refused' ORDER BY id").fetchall()


def _whole_audit(db_url: str) -> str:
    with psycopg.connect(db_url) as c:
        return json.dumps(c.execute("SELECT * FROM access_audit").fetchall(), default=str)


def test_a_token_is_accepted_only_when_signature_issuer_audience_and_time_check_out(
        server, issuer, run_kl, db_url, make_state, caplog):
    _trust(run_kl, issuer)
    _grant(run_kl, f"oidc:ci:{MAIN}", "write", "prod/**")
    good = issuer.token(MAIN)
    assert server.with_auth(f"Bearer {good}").request("POST", "/states/prod/a", make_state(1, {"a": {}})).status == 200
    # Terraform's backend "http" sends it as the Basic password (any user name); an ES256 key too.
    assert server.basic("oidc", issuer.token(MAIN, kind="ec")).request("GET", "/states/prod/a").status == 200
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT actor FROM state_versions").fetchall() == [(f"oidc:ci:{MAIN}",)]

    forger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    bad = {
        "expired": (issuer.token(MAIN, exp=time.time() - 7200), "expired at "),
        "audience": (issuer.token(MAIN, aud="someone-else"), "audience 'someone-else' is not 'kilolock-test' (trust ci)"),
        "issuer": (issuer.token(MAIN, iss="https://evil.example"), "issuer 'https://evil.example' is not trusted"),
        "kid": (issuer.token(MAIN, kid="no-such-key"), "key id 'no-such-key' is not among the keys of trust ci"),
        "none": (unsigned({"iss": issuer.url, "aud": AUDIENCE, "sub": MAIN, "exp": time.time() + 600}),
                 "alg 'none' is not accepted (RS256 or ES256 only)"),
        "forged": (issuer.token(MAIN, key=forger), "bad signature"),
        "not yet": (issuer.token(MAIN, nbf=int(time.time()) + 3600), "not valid before "),
    }
    for label, (token, words) in bad.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kilolock.server"):
            for client in (server.with_auth(f"Bearer {token}"), server.basic("oidc", token)):
                r = client.request("GET", "/states/prod/a")
                assert r.status == 401 and r.text.startswith("bearer token refused: ") and words in r.text, (label, r.text)
                assert r.text.count("\n") == 1 and token not in r.text
        lines = [rec.getMessage() for rec in caplog.records if "bearer token refused" in rec.getMessage()]
        assert len(lines) == 2 and all(words in line and token not in line for line in lines), (label, lines)
    refused = _refusals(db_url)
    assert len(refused) == 2 * len(bad) and all(t == "GET /states/prod/a" for _, t, _ in refused), refused
    # Who it claimed to be, once its signature checked out; never the token, nor its signature.
    audience_refused = "bearer token refused: audience 'someone-else' is not 'kilolock-test' (trust ci)"
    assert (f"oidc:ci:{MAIN}", "GET /states/prod/a", audience_refused) in refused
    audit = _whole_audit(db_url)
    for token, _ in bad.values():
        signature = token.split(".")[2]
        assert token not in audit and (not signature or signature not in audit)
    # The log line of kl access log, as an operator reads it.
    log = run_kl("access", "log", "--format", "json")
    assert log.returncode == 0 and "bearer token refused: bad signature" in log.stdout.decode()


def test_grants_match_the_sub_glob_where_star_stays_within_a_colon_part(server, issuer, run_kl, make_state):
    _trust(run_kl, issuer)
    _grant(run_kl, "oidc:ci:repo:acme/*:ref:refs/heads/main", "write", "prod/**")
    _grant(run_kl, "oidc:ci:repo:acme/infra:**", "read", "**")

    def post(sub: str, state: str) -> int:
        return server.with_auth(f"Bearer {issuer.token(sub)}").request("POST", f"/states/{state}",
                                                                       make_state(1, {"a": {}})).status

    assert post(MAIN, "prod/x") == 200  # repo:acme/* and refs/heads/main
    assert post("repo:acme/web:ref:refs/heads/main", "prod/y") == 200
    dev = server.with_auth(f"Bearer {issuer.token('repo:acme/infra:ref:refs/heads/dev')}")
    assert dev.request("GET", "/states/prod/x").status == 200  # read through repo:acme/infra:**
    r = dev.request("POST", "/states/prod/x", make_state(2, {"a": {}}))
    assert r.status == 403 and "has only read" in r.text, r.text
    # * does not cross ':': a sub that smuggles a part into the repository name is not acme/*.
    r = server.with_auth(f"Bearer {issuer.token('repo:acme/x:evil:ref:refs/heads/main')}").request("GET", "/states/prod/x")
    assert r.status == 403 and "oidc:ci:repo:acme/x:evil:ref:refs/heads/main has no grant" in r.text, r.text
    assert post("repo:other/infra:ref:refs/heads/main", "prod/z") == 403

    check = run_kl("access", "check", f"oidc:ci:{MAIN}", "prod/x", "--format", "json")
    assert check.returncode == 0 and json.loads(check.stdout)["role"] == "write", check.stderr


def test_a_trusts_claim_rules_apply_to_every_token(server, issuer, run_kl):
    _trust(run_kl, issuer, "--claim", "repository_owner=acme", "--claim", "ref=refs/heads/*")
    _grant(run_kl, "oidc:ci:**", "read", "**")
    ok = issuer.token(MAIN, repository_owner="acme", ref="refs/heads/main")
    assert server.with_auth(f"Bearer {ok}").request("GET", "/api/v1/states").status == 200
    for claims, words in (({"repository_owner": "evil", "ref": "refs/heads/main"}, "claim 'repository_owner' is 'evil'"),
                          ({"repository_owner": "acme"}, "the token has no 'ref' claim; trust ci requires 'refs/heads/*'")):
        r = server.with_auth(f"Bearer {issuer.token(MAIN, **claims)}").request("GET", "/api/v1/states")
        assert r.status == 401 and words in r.text, r.text


def test_a_key_rotated_at_the_issuer_is_fetched_and_a_flood_of_unknown_key_ids_is_not(
        start_server, issuer, run_kl, make_state):
    from kilolock.server.auth import Authenticator

    _trust(run_kl, issuer)
    _grant(run_kl, "oidc:ci:**", "read", "**")
    eager = start_server(auth=Authenticator(kl_tokens=True), oidc_refetch_every=0.0)
    old = issuer.token(MAIN)
    assert eager.with_auth(f"Bearer {old}").request("GET", "/api/v1/states").status == 200
    assert issuer.fetches == 1
    assert eager.with_auth(f"Bearer {issuer.token(MAIN)}").request("GET", "/api/v1/states").status == 200
    assert issuer.fetches == 1  # cached
    issuer.rotate()
    assert eager.with_auth(f"Bearer {issuer.token(MAIN)}").request("GET", "/api/v1/states").status == 200
    assert issuer.fetches == 2  # the new key id fetched the keys again
    r = eager.with_auth(f"Bearer {old}").request("GET", "/api/v1/states")
    assert r.status == 401 and "is not among the keys" in r.text, r.text

    # A server that fetches again at most once an hour: made-up key ids cost the issuer nothing.
    patient = start_server(auth=Authenticator(kl_tokens=True), oidc_refetch_every=3600.0)
    before = issuer.fetches
    assert patient.with_auth(f"Bearer {issuer.token(MAIN)}").request("GET", "/api/v1/states").status == 200
    for n in range(20):
        r = patient.with_auth(f"Bearer {issuer.token(MAIN, kid=f'made-up-{n}')}").request("GET", "/api/v1/states")
        assert r.status == 401, r.text
    assert issuer.fetches == before + 1


def test_an_expired_token_may_still_save_and_unlock_the_state_its_subject_holds_locked(
        server, issuer, run_kl, db_url, make_state):
    _trust(run_kl, issuer, "--lock-grace", "1h")
    _grant(run_kl, "oidc:ci:**", "write", "**")
    live = server.with_auth(f"Bearer {issuer.token(MAIN)}")
    assert live.request("POST", "/states/app", make_state(1, {"a": {}})).status == 200
    lock = {"ID": "lock-1", "Operation": "OperationTypeApply", "Who": "ci", "Version": "1.8.5", "Created": "", "Path": ""}
    assert live.request("LOCK", "/states/app", lock).status == 200

    # The same subject, its token expired 10 minutes ago (past the skew, within the grace).
    late = server.with_auth(f"Bearer {issuer.token(MAIN, exp=time.time() - 600)}")
    r = late.request("GET", "/api/v1/states")
    assert r.status == 401 and "may only read, save (POST) and unlock a state its subject holds locked" in r.text, r.text
    assert late.request("GET", "/states/other").status == 401
    assert late.request("GET", "/states/app").status == 200  # Terraform reads before it writes
    assert late.request("LOCK", "/states/other", {**lock, "ID": "lock-2"}).status == 401
    assert late.request("POST", "/states/app?ID=lock-1", make_state(2, {"a": {}})).status == 200
    other = server.with_auth(f"Bearer {issuer.token('repo:acme/web:ref:refs/heads/main', exp=time.time() - 600)}")
    assert other.request("POST", "/states/app?ID=lock-1", make_state(3, {"a": {}})).status == 401  # not its lock
    too_late = server.with_auth(f"Bearer {issuer.token(MAIN, exp=time.time() - 7200)}")
    assert too_late.request("POST", "/states/app?ID=lock-1", make_state(3, {"a": {}})).status == 401
    assert late.request("UNLOCK", "/states/app", lock).status == 200
    # Unlocked: the grace is over for this state.
    assert late.request("POST", "/states/app", make_state(3, {"a": {}})).status == 401
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT serial FROM state_versions ORDER BY serial").fetchall() == [(1,), (2,)]
        assert c.execute("SELECT count(*) FROM state_locks").fetchone() == (0,)


def test_trust_commands_and_their_mistakes(run_kl, issuer, db_url, tmp_path):
    _trust(run_kl, issuer, "--claim", "repository_owner=acme")
    r = run_kl("access", "trust", "list", "--format", "json")
    trusts = json.loads(r.stdout)["trusts"]
    assert [(t["name"], t["issuer"], t["claims"]) for t in trusts] == [("ci", issuer.url, {"repository_owner": "acme"})]
    for args, words in (
        (["access", "trust", "oidc", "--issuer", "ftp://x", "--audience", "a"], "expected an https:// URL"),
        (["access", "trust", "oidc", "--issuer", "https://x", "--audience", "a", "--jwks", str(tmp_path / "none.json")],
         "no such file"),
        (["access", "trust", "oidc", "--issuer", issuer.url, "--audience", "a", "--name", "other"],
         "is trusted already as 'ci'"),
        (["access", "trust", "oidc", "--issuer", "https://x", "--audience", "a", "--claim", "owner"], "expected CLAIM=GLOB"),
        (["access", "grant", "oidc:nope:repo:*", "--role", "read", "--states", "**"], "no OIDC trust named 'nope'"),
        (["access", "grant", "oidc:ci", "--role", "read", "--states", "**"], "oidc:TRUST:SUB-GLOB"),
        (["access", "trust", "remove", "nope"], "no OIDC trust named 'nope'"),
    ):
        r = run_kl(*args)
        err = r.stderr.decode()
        assert r.returncode in (1, 2) and words in err and "Traceback" not in err, (args, err)
        assert err.startswith("kl: ") and len(err.splitlines()) <= 2, err
    _grant(run_kl, "oidc:ci:**", "read", "**")
    r = run_kl("access", "trust", "remove", "ci")
    assert r.returncode == 0 and "1 grant still name oidc:ci:" in r.stdout.decode(), r.stdout
    actions = [a for (a,) in psycopg.connect(db_url).execute("SELECT action FROM access_audit ORDER BY id").fetchall()]
    assert actions == ["trust.add", "grant", "trust.remove"], actions


# --- Terraform ---------------------------------------------------------------------------------------

TF = "terraform-1.8.5"


def _workspace(server, tmp_path, label: str, state: str, password: str):
    from kit.tfcli import Workspace, tool_binary

    d = tmp_path / label
    d.mkdir()
    # Terraform sends username/password as HTTP Basic: the JWT is the password, any user name.
    return Workspace(TF, tool_binary(TF), d, f"{server.url}/states/{state}", "oidc", password)


def test_terraform_uses_the_jwt_as_its_backend_password(server, issuer, run_kl, db_url, tmp_path):
    _trust(run_kl, issuer)
    _grant(run_kl, "oidc:ci:repo:acme/*:ref:refs/heads/main", "write", "prod/**")
    ws = _workspace(server, tmp_path, "main", "prod/app", issuer.token(MAIN))
    ws.write('resource "null_resource" "a" { triggers = { v = "1" } }\n')
    ws.run("init", "-input=false", "-no-color")
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT DISTINCT actor FROM state_versions").fetchall() == [(f"oidc:ci:{MAIN}",)]

    wrong = _workspace(server, tmp_path, "wrong-aud", "prod/app", issuer.token(MAIN, aud="elsewhere"))
    wrong.write('resource "null_resource" "a" { triggers = { v = "1" } }\n')
    r = wrong.run("init", "-input=false", "-no-color", check=False)
    if r.returncode == 0:
        r = wrong.run("plan", "-input=false", "-no-color", check=False)
    assert r.returncode != 0 and "requires auth" in " ".join((r.stdout + r.stderr).split()), r.stdout + r.stderr
    assert any("audience 'elsewhere'" in detail for _, _, detail in _refusals(db_url))


def test_an_apply_whose_token_expires_under_its_lock_still_saves_its_state(server, issuer, run_kl, db_url, tmp_path):
    from kit.tfcli import wait_for_lock_holder

    _trust(run_kl, issuer, "--clock-skew", "1s", "--lock-grace", "10m")
    _grant(run_kl, f"oidc:ci:{MAIN}", "write", "prod/**")
    ws = _workspace(server, tmp_path, "long", "prod/long", issuer.token(MAIN))
    go = tmp_path / "go"
    # The apply's one resource waits for the test's word: by then its token has expired.
    ws.write(f'resource "null_resource" "a" {{\n  provisioner "local-exec" {{\n'
             f'    command = "while [ ! -e {go} ]; do sleep 0.1; done"\n  }}\n}}\n')
    ws.run("init", "-input=false", "-no-color")
    ws.password = issuer.token(MAIN, lifetime=20)
    expires = time.time() + 20
    apply = ws.start("apply", "-auto-approve", "-input=false", "-no-color")
    try:
        wait_for_lock_holder(db_url, "prod/long", apply, timeout=60)
        assert time.time() < expires, "the apply took its lock only after its token expired: give the token longer"
        while time.time() < expires + 2:  # past exp and the 1s skew
            assert apply.poll() is None
            time.sleep(0.2)
        go.touch()
        out, err = apply.communicate(timeout=300)
    finally:
        if apply.poll() is None:
            apply.kill()
            apply.communicate()
    assert apply.returncode == 0, out + err
    with psycopg.connect(db_url) as c:
        rows = c.execute("SELECT v.actor, v.created_at FROM state_versions v JOIN states s ON s.id = v.state_id "
                         "WHERE s.name = 'prod/long' ORDER BY v.serial").fetchall()
        assert c.execute("SELECT count(*) FROM state_locks").fetchone() == (0,)
    assert rows and rows[-1][0] == f"oidc:ci:{MAIN}" and rows[-1][1].timestamp() > expires, rows
    assert _refusals(db_url) == []
