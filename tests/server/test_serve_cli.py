"""`kl serve` as a user runs it: refusal to expose state unsafely, TLS, password hashes, timeouts,
and the refresh sharing the backend's lock."""
from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kit.httpclient import Client
from kit.procs import stderr_line

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, env, fragment", [
    (["--listen", "0.0.0.0:0"], {}, "without authentication"),
    (["--listen", "0.0.0.0:0"], {"KL_SERVE_TOKEN": "t"}, "without TLS"),
    (["--listen", "nonsense"], {}, "expected HOST:PORT"),
    (["--listen", "127.0.0.1:0", "--tls-cert", "x.pem"], {}, "go together"),
    (["--listen", "127.0.0.1:0", "--max-body", "lots"], {}, "--max-body"),
    (["--listen", "127.0.0.1:0", "--users-file", "/nonexistent/users"], {}, "cannot read the users file"),
])
def test_refuses_bad_or_unsafe_setups(run_kl, db_url, args, env, fragment):
    r = run_kl("serve", *args, env={"KL_SERVE_TOKEN": "", **env}, timeout=30)
    err = r.stderr.decode()
    lines = err.splitlines()
    # One line; a usage error (exit 2) adds the command's usage line.
    assert r.returncode in (1, 2) and fragment in lines[0] and lines[0].startswith("kl: "), err
    assert lines[1:] == [] or (r.returncode == 2 and len(lines) == 2 and lines[1].startswith("usage: kl serve ")), err


def test_hash_password_output_is_accepted_by_the_users_file(run_kl, tmp_path):
    import base64

    from kilolock.server.auth import Authenticator

    r = run_kl("serve", "--hash-password", input=b"correct horse\n")
    assert r.returncode == 0, r.stderr
    line = r.stdout.decode().strip()
    assert line.startswith("scrypt$") and "correct horse" not in line
    users = tmp_path / "users"
    users.write_text(f"carol:{line}\n")
    auth = Authenticator.from_config(str(users), env={})
    good = "Basic " + base64.b64encode(b"carol:correct horse").decode()
    bad = "Basic " + base64.b64encode(b"carol:correct horsE").decode()
    principal = auth.authenticate(good)
    assert principal is not None and principal.name == "carol" and auth.authenticate(bad) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_kl_serve(db_url: str, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    full_env = dict(os.environ, KL_DATABASE_URL=db_url, PYTHONPATH=str(REPO), **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "kilolock", "serve", "--listen", f"127.0.0.1:{port}", *args],
                            env=full_env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None  # piped just above
    line = proc.stderr.readline()
    assert "kl serve:" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
    line = stderr_line(proc)  # the banner's second line
    assert line.startswith("kl serve: authentication: "), line
    return proc, port


@pytest.mark.parametrize("host, args, words", [
    ("127.0.0.1", [], "address already in use"),  # the port is taken (below)
    ("192.0.2.1", ["--insecure"], "cannot assign requested address"),  # TEST-NET-1: no address of this host
])
def test_an_address_it_cannot_listen_on_is_one_line_naming_it(run_kl, db_url, host, args, words):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = run_kl("serve", "--listen", f"{host}:{port}", *args, env={"KL_SERVE_TOKEN": ""}, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 1 and err.splitlines() == [f"kl: cannot listen on {host}:{port}: {words}"], err


def test_server_header_and_404s_speak_http_not_the_cli(client):
    r = client.request("GET", "/healthz")
    assert r.status == 200 and r.headers["server"] == "kilolock", r.headers
    for path in ("/api/v1/states/nope/versions", "/api/v1/states/nope/drift"):
        r = client.request("GET", path)
        assert r.status == 404 and r.headers["server"] == "kilolock", (path, r.text)
        assert r.text == "no state named 'nope' (GET /api/v1/states lists them)\n", (path, r.text)
    r = client.request("GET", "/api/v1/nothing")
    assert r.status == 404 and "`kl" not in r.text and "/api/v1/states" in r.text, r.text


def test_tls_with_a_token(db_url, tmp_path, make_state):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    proc, port = _start_kl_serve(db_url, "--tls-cert", str(cert), "--tls-key", str(key), env={"KL_SERVE_TOKEN": "tls-token"})
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        client = Client(f"https://127.0.0.1:{port}", ssl_context=ctx).with_auth("Bearer tls-token")
        assert client.request("POST", "/states/t", make_state(1, {"a": {}})).status == 200
        assert client.request("GET", "/states/t").json()["serial"] == 1
        assert client.with_auth(None).request("GET", "/states/t").status == 401
        # A plain-HTTP client gets nowhere, and the server keeps serving TLS clients afterwards.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                s.recv(100)
            except OSError:
                pass
        assert client.request("GET", "/healthz").status == 200
        proc.terminate()
        assert proc.wait(timeout=30) == 0  # SIGTERM is a clean stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_stalled_client_does_not_block_others_and_is_dropped(start_server, make_state):
    srv = start_server(timeout=1.0)
    host, port = srv.url.removeprefix("http://").split(":")
    stalled = socket.create_connection((host, int(port)))
    stalled.sendall(b"POST /states/s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")  # and then nothing
    try:
        assert srv.request("POST", "/states/s", make_state(1, {})).status == 200
        stalled.settimeout(10)
        start = time.monotonic()
        answer = stalled.recv(1000)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"Connection: close" in answer
        assert stalled.recv(100) == b""  # and closed
        assert time.monotonic() - start < 9
    finally:
        stalled.close()


def test_unknown_method_and_bad_request_line_are_one_line(client):
    r = client.request("PATCH", "/states/x")
    assert r.status == 501 and r.text.count("\n") == 1 and "PATCH" in r.text
    host, port = client.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"garbage\r\n\r\n")
        data = s.recv(1000)
    assert data.startswith(b"HTTP/1.") and b" 400 " in data.split(b"\r\n")[0] and b"<html" not in data.lower()


def test_refresh_refuses_a_state_locked_through_the_backend(client, run_kl, make_state):
    client.request("POST", "/states/r", make_state(1, {"a": {"id": "1"}}))
    info = {"ID": "held-by-tf", "Operation": "OperationTypeApply", "Info": "", "Who": "dana@laptop", "Version": "1.8.5",
            "Created": "2026-11-29T12:00:00Z", "Path": ""}
    assert client.request("LOCK", "/states/r", json.dumps(info)).status == 200
    r = run_kl("refresh", "r")
    err = r.stderr.decode()
    assert r.returncode == 1 and "locked by dana@laptop" in err and "held-by-tf" in err, err


def test_connections_beyond_the_cap_get_503_not_a_hang(start_server):
    srv = start_server(max_connections=2, timeout=5.0)
    host, port = srv.url.removeprefix("http://").split(":")
    idle = [socket.create_connection((host, int(port))) for _ in range(2)]  # each holds a thread
    try:
        time.sleep(0.2)
        r = srv.request("GET", "/healthz")
        assert r.status == 503 and "too many open connections" in r.text
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while srv.request("GET", "/healthz").status != 200:  # slots come back when those close
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_database_down_is_503_with_retry_after(db_url):
    from kilolock.server.auth import Authenticator
    from kilolock.server.http import DB_UNAVAILABLE_RETRY_AFTER_S, KilolockHTTPServer, ServerConfig, serve_in_thread
    from kilolock.store import db

    dead = f"postgresql://127.0.0.1:{_free_port()}/nothing?connect_timeout=2"
    server = KilolockHTTPServer(("127.0.0.1", 0), ServerConfig(), Authenticator(), lambda: db.connect(dead))
    serve_in_thread(server)
    try:
        client = Client(server.url)
        for method, path in (("GET", "/healthz"), ("GET", "/states/x"), ("LOCK", "/states/x")):
            r = client.request(method, path, b'{"ID": "a"}' if method == "LOCK" else None)
            assert r.status == 503 and "database unavailable" in r.text
            assert r.headers["retry-after"] == str(DB_UNAVAILABLE_RETRY_AFTER_S)
    finally:
        server.shutdown()
        server.server_close()


def test_after_the_database_dropped_the_pools_connections_no_request_fails(start_server, db_url, make_state):
    """A PostgreSQL restart (or PgBouncer's, or pg_terminate_backend) ends every idle pooled
    connection at once, unnoticed until used: each dead one is found so when a request takes it,
    before anything is sent on it, and the request goes on on a new one. It used to cost the first
    request a 503, and Terraform waits Retry-After (10 s) for its retry."""
    from contextlib import ExitStack

    import psycopg

    client = start_server()
    pool = client.server.pool
    with ExitStack() as held:  # three connections at once, then idle in the pool
        pids = [held.enter_context(pool.connection()).info.backend_pid for _ in range(3)]
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        deadline = time.monotonic() + 30
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "the terminated backends did not end"
            time.sleep(0.05)
    # Terraform's state write first: it meets the dead connections, and is written once.
    assert client.request("POST", "/states/after", make_state(1, {"a": {}})).status == 200
    assert [client.request("GET", "/states/none").status for _ in range(3)] == [204] * 3  # no state: no content
    with psycopg.connect(db_url, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM state_versions").fetchone() == (1,)


def test_one_log_line_per_request_by_default_never_a_credential(db_url, make_state):
    proc, port = _start_kl_serve(db_url, env={"KL_SERVE_TOKEN": "tok-s3cret"})
    try:
        client = Client(f"http://127.0.0.1:{port}").basic("alice", "tok-s3cret")
        assert client.request("POST", "/states/logged", make_state(1, {"a": {}})).status == 200
        assert client.request("GET", "/states/logged?ID=lock-1").status == 200  # the query is not logged
        assert client.with_auth(None).request("GET", "/api/v1/states").status == 401
        assert client.request("GET", "/states/a%0Aforged").status in (400, 404)
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stderr is not None
        lines = [line for line in proc.stderr.read().splitlines() if line.startswith("kl serve: ")]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(lines) == 4, lines
    # "kl serve: TIME+ZONE CLIENT METHOD PATH STATUS DURATION USER"
    fields = [line.split()[3:] for line in lines]
    assert [f[:4] for f in fields] == [["127.0.0.1", "POST", "/states/logged", "200"], ["127.0.0.1", "GET", "/states/logged", "200"],
                                       ["127.0.0.1", "GET", "/api/v1/states", "401"],
                                       ["127.0.0.1", "GET", "/states/a%0Aforged", fields[3][3]]], lines
    assert [f[5] for f in fields] == ["alice", "alice", "-", "alice"] and all(f[4].endswith("ms") for f in fields), lines
    assert all(line.split()[2][-5] in "+-" for line in lines), lines  # the timestamp carries its zone
    text = "\n".join(lines)
    assert "tok-s3cret" not in text and "lock-1" not in text and "Basic" not in text


def test_quiet_serve_logs_no_requests(db_url):
    proc, port = _start_kl_serve(db_url, "-q")
    try:
        assert Client(f"http://127.0.0.1:{port}").request("GET", "/healthz").status == 200
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stderr is not None
        assert "GET" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
