"""`kl serve --client-ca`: a client certificate is a principal (cert:CN=NAME) with grants, a bad one
is refused at the handshake with one line in the server's log, and SIGHUP reloads the certificate,
key and client CA under load without dropping a connection. Real `kl serve` processes on loopback,
certificates from a CA of the test's own."""
from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from pathlib import Path

import psycopg
import pytest

from kit.httpclient import Client
from kit.klserve import KlServe
from kit.testca import Issued, TestCA
from kit.tfcli import Workspace, tool_binary

TOKEN = "tls-env-token"


def _client_ctx(ca: TestCA, cert: Issued | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


def _serve(db_url: str, server: Issued, client_ca: Path, *extra: str) -> KlServe:
    return KlServe(db_url, "--tls-cert", str(server.cert), "--tls-key", str(server.key), "--client-ca", str(client_ca),
                   *extra, env={"KL_SERVE_TOKEN": TOKEN})


def _grant(run_kl, principal: str, role: str, states: str) -> None:
    r = run_kl("access", "grant", principal, "--role", role, "--states", states)
    assert r.returncode == 0, r.stderr.decode()


def _handshake_fails(url: str, ctx: ssl.SSLContext) -> None:
    """Under TLS 1.3 a client learns that its certificate was refused only at its first read."""
    with pytest.raises((ssl.SSLError, ConnectionError)):
        Client(url, ssl_context=ctx).request("GET", "/healthz")


def test_a_client_certificate_is_a_principal_and_bad_ones_are_refused_with_one_line(db_url, tmp_path, run_kl, make_state):
    ca, other_ca = TestCA(tmp_path / "ca"), TestCA(tmp_path / "other", "another CA")
    server = ca.issue("127.0.0.1", server=True)
    runner = ca.issue("ci-runner")
    expired = ca.issue("ci-old", expired=True)
    stranger = other_ca.issue("ci-runner", label="stranger")
    _grant(run_kl, "cert:CN=ci-runner", "write", "ci/**")
    with _serve(db_url, server, ca.cert) as kl:
        assert "client certificates" in kl.lines[1], kl.lines
        as_runner = Client(kl.https, ssl_context=_client_ctx(ca, runner))
        assert as_runner.request("POST", "/states/ci/a", make_state(1, {"a": {}})).status == 200
        refused = as_runner.request("GET", "/states/prod")
        assert refused.status == 403 and "cert:CN=ci-runner has no grant on state 'prod'" in refused.text, refused.text
        # Without a certificate: the other credentials, or nothing.
        plain = Client(kl.https, ssl_context=_client_ctx(ca))
        assert plain.request("GET", "/states/ci/a").status == 401
        assert plain.with_auth(f"Bearer {TOKEN}").request("GET", "/states/ci/a").status == 200
        # A request's own credential wins over the certificate of its connection.
        assert as_runner.with_auth("Bearer wrong").request("GET", "/states/ci/a").status == 401

        for bad, words in ((expired, "certificate has expired"),
                           (stranger, "unable to get local issuer certificate (not issued by the --client-ca)")):
            mark = len(kl.lines)
            _handshake_fails(kl.https, _client_ctx(ca, bad))
            line = kl.wait_for(lambda s: "TLS handshake" in s, start=mark)
            assert line == f"WARNING kilolock.server: TLS handshake with 127.0.0.1: client certificate refused: {words}", line
        mark = len(kl.lines)
        _handshake_fails(kl.https, _client_ctx(ca, expired))  # again within the minute: logged, not audited again
        kl.wait_for(lambda s: "TLS handshake" in s, start=mark)
        assert as_runner.request("GET", "/states/ci/a").status == 200  # still serving
    with psycopg.connect(db_url) as c:
        actors = c.execute("SELECT v.actor FROM state_versions v JOIN states s ON s.id = v.state_id "
                           "WHERE s.name = 'ci/a'").fetchall()
        audit = c.execute("SELECT actor, target, state, detail FROM access_audit WHERE action = 'refused' ORDER BY id").fetchall()
    # The handshakes refused for their certificates are audited beside the refused request.
    assert actors == [("cert:CN=ci-runner",)] and audit == [
        ("cert:CN=ci-runner", "GET /states/prod", "prod", "cert:CN=ci-runner has no grant on state 'prod' (read needs read); nothing done"),
        ("cert:unverified", "TLS handshake from 127.0.0.1", None, "client certificate refused: certificate has expired; nothing done"),
        ("cert:unverified", "TLS handshake from 127.0.0.1", None,
         "client certificate refused: unable to get local issuer certificate (not issued by the --client-ca); nothing done"),
    ], audit
    check = run_kl("access", "check", "cert:CN=ci-runner", "ci/x", "--format", "json")
    assert check.returncode == 0 and json.loads(check.stdout)["role"] == "write", check.stderr


@pytest.mark.parametrize("text, words", [
    ("cert:ci-runner", "cert:CN=NAME"),
    ("cert:CN=", "cert:CN=NAME"),
    ("robot:x", "user:NAME, token:NAME, cert:CN=NAME or oidc:TRUST:SUB-GLOB"),
])
def test_a_malformed_certificate_principal_is_one_line(run_kl, db_url, text, words):
    r = run_kl("access", "grant", text, "--role", "read", "--states", "**")
    err = r.stderr.decode()
    assert r.returncode == 2 and words in err and "Traceback" not in err, err


def test_client_ca_without_tls_is_a_usage_error(run_kl, db_url, tmp_path):
    r = run_kl("serve", "--listen", "127.0.0.1:0", "--client-ca", str(tmp_path / "ca.pem"), timeout=30)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith("kl: --client-ca needs --tls-cert and --tls-key"), err


def _presented(url_port: int, ctx: ssl.SSLContext) -> bytes:
    conn = http.client.HTTPSConnection("127.0.0.1", url_port, timeout=30, context=ctx)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() is not None
        assert isinstance(conn.sock, ssl.SSLSocket)
        der = conn.sock.getpeercert(binary_form=True)
        assert der is not None
        return der
    finally:
        conn.close()


def _ask(conn: http.client.HTTPSConnection) -> int:
    conn.request("GET", "/healthz")
    reply = conn.getresponse()
    reply.read()
    return reply.status


def _der(issued: Issued) -> bytes:
    return ssl.PEM_cert_to_DER_cert(issued.cert_pem)


def _replace(target: Path, source: Path) -> None:
    """As an operator's deploy does: the new file whole, by rename, never half written."""
    tmp = target.with_suffix(".new")
    tmp.write_bytes(source.read_bytes())
    tmp.replace(target)


def test_sighup_reloads_certificate_key_and_client_ca_under_load_without_dropping_connections(db_url, tmp_path, run_kl):
    ca = TestCA(tmp_path / "ca")
    ca2 = TestCA(tmp_path / "ca2", "second client CA")
    first, second = ca.issue("127.0.0.1", server=True, label="first"), ca.issue("127.0.0.1", server=True, label="second")
    runner, runner2 = ca.issue("ci-runner"), ca2.issue("ci-runner", label="runner2")
    live = Issued(tmp_path / "live.crt", tmp_path / "live.key")
    client_ca = tmp_path / "client-ca.pem"
    _replace(live.cert, first.cert)
    _replace(live.key, first.key)
    _replace(client_ca, ca.cert)
    _grant(run_kl, "cert:CN=ci-runner", "read", "**")

    with _serve(db_url, live, client_ca, "-q") as kl:
        ctx = _client_ctx(ca, runner)
        assert _presented(kl.port, ctx) == _der(first)
        # One connection kept alive across the reloads: it must keep being answered on its socket.
        kept = http.client.HTTPSConnection("127.0.0.1", kl.port, timeout=30, context=ctx)
        assert _ask(kept) == 200
        kept_sock = kept.sock

        stop = threading.Event()
        done: list[int] = []
        errors: list[Exception] = []

        def load() -> None:
            client = Client(kl.https, ssl_context=_client_ctx(ca)).with_auth(f"Bearer {TOKEN}")
            while not stop.is_set():
                try:
                    reply = client.request("GET", "/api/v1/states")
                    if reply.status != 200:
                        raise AssertionError(f"{reply.status}: {reply.text}")
                    done.append(1)
                except (OSError, http.client.HTTPException, AssertionError) as exc:  # a drop, a failed handshake
                    errors.append(exc)
                    return

        workers = [threading.Thread(target=load, daemon=True) for _ in range(3)]
        for w in workers:
            w.start()
        try:
            _replace(live.cert, second.cert)
            _replace(live.key, second.key)
            _replace(client_ca, ca2.cert)
            before = len(done)
            mark = kl.signal()
            kl.wait_for(lambda s: "reloaded" in s, start=mark)
            assert kl.lines[mark:] == ["kl serve: TLS certificate, key and client CA reloaded: new connections use them"]
            assert _presented(kl.port, _client_ctx(ca, runner2)) == _der(second)
            _handshake_fails(kl.https, ctx)  # the first client CA no longer vouches for anyone

            # Files that do not load: one line, and the ones loaded last stay in use.
            live.key.write_text("not a key\n")
            mark = kl.signal()
            line = kl.wait_for(lambda s: "not reloaded" in s, start=mark)
            assert line.startswith("kl serve: TLS files not reloaded, the current ones stay: cannot load the TLS "
                                   f"certificate {live.cert} / key {live.key}: "), line
            assert _presented(kl.port, _client_ctx(ca, runner2)) == _der(second)

            assert _ask(kept) == 200 and kept.sock is kept_sock
            # The load ran across both reloads: wait for requests answered after them.
            deadline_count = before + 50
            deadline = time.monotonic() + 120
            while len(done) < deadline_count and not errors and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            for w in workers:
                w.join(60)
            kept.close()
        assert errors == [] and len(done) >= deadline_count, (errors, len(done))


def test_terraform_over_https_with_and_without_a_client_certificate(db_url, tmp_path, run_kl):
    tool = "terraform-1.8.5"
    ca = TestCA(tmp_path / "ca")
    server, runner, expired = ca.issue("127.0.0.1", server=True), ca.issue("ci-runner"), ca.issue("ci-old", expired=True)
    _grant(run_kl, "cert:CN=ci-runner", "write", "ci/**")
    resources = 'resource "null_resource" "a" { triggers = { v = "1" } }\n'
    with _serve(db_url, server, ca.cert) as kl:
        def workspace(label: str, user: str | None = None, password: str | None = None) -> Workspace:
            d = tmp_path / label
            d.mkdir()
            ws = Workspace(tool, tool_binary(tool), d, f"{kl.https}/states/ci/{label}", user, password)
            ws.write(resources)
            return ws

        def tls_env(ws: Workspace, cert: Issued | None) -> dict[str, str]:
            extra = {"TF_HTTP_CLIENT_CA_CERTIFICATE_PEM": ca.cert_pem}  # the CA that signed kl serve's certificate
            if cert is not None:
                extra.update(TF_HTTP_CLIENT_CERTIFICATE_PEM=cert.cert_pem, TF_HTTP_CLIENT_PRIVATE_KEY_PEM=cert.key_pem)
            return ws.env(**extra)

        with_cert = workspace("with-cert")
        with_cert.run("init", "-input=false", "-no-color", env=tls_env(with_cert, runner))
        with_cert.run("apply", "-auto-approve", "-input=false", "-no-color", env=tls_env(with_cert, runner))

        with_token = workspace("with-token", "ci", TOKEN)
        with_token.run("init", "-input=false", "-no-color", env=tls_env(with_token, None))
        with_token.run("apply", "-auto-approve", "-input=false", "-no-color", env=tls_env(with_token, None))

        stale = workspace("expired")
        mark = len(kl.lines)
        r = stale.run("init", "-input=false", "-no-color", check=False, env=tls_env(stale, expired))
        if r.returncode == 0:  # init may not read the state; plan does
            r = stale.run("plan", "-input=false", "-no-color", check=False, env=tls_env(stale, expired))
        out = " ".join((r.stdout + r.stderr).split())
        assert r.returncode != 0 and "tls: expired certificate" in out, out
        kl.wait_for(lambda s: s.endswith("client certificate refused: certificate has expired"), start=mark)
    with psycopg.connect(db_url) as c:
        actors: dict[str, str] = dict(c.execute("SELECT s.name, max(v.actor) FROM state_versions v JOIN states s ON s.id = v.state_id "
                                "GROUP BY s.name").fetchall())
    assert actors == {"ci/with-cert": "cert:CN=ci-runner", "ci/with-token": "ci"}, actors
