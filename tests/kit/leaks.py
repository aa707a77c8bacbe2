"""Every place a secret could leak to, gathered for the secrets tests: kl's read commands, kl serve's
JSON API and log, and the database tables that do not hold state content by design."""
from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping

import psycopg

from kit.paths import REPO
from kit.pg import one_row

LOUD = {"KL_LOG": "debug", "TF_LOG": "trace"}  # kl's own debug logs and the providers' logs on stderr
# These hold the state itself (attributes, secrets included) by design, like a .tfstate file; the
# drift views show their attributes to SQL users (drift_records itself holds attribute names only);
# version_pieces holds each version's text in pieces (migration 0014), what state_versions held whole;
# observed_objects holds the objects an observation found different (migration 0022), as resources does.
# (inventory: a view of the resources rows, as the drift views are)
STATE_TABLES = frozenset({"state_versions", "version_pieces", "resources", "observed_objects", "current_resource_drift",
                          "resource_drift", "inventory"})

Channels = dict[str, bytes]


def read_channels(run_kl: Callable, state: str) -> Channels:
    """stdout+stderr of every read command a user has, in table and JSON form, logs on."""
    commands = [("drift", state), ("status", state), ("runs", state), ("state", "list"), ("state", "versions", state),
                ("provider", "list")]
    out: Channels = {}
    for cmd in commands:
        for fmt in ("table", "json"):
            r = run_kl(*cmd, "--format", fmt, env=LOUD)
            assert r.returncode == 0, (cmd, r.stderr)
            out[f"kl {' '.join(cmd)} --format {fmt}"] = r.stdout + r.stderr
    return out


def db_rows(db_url: str, exclude: frozenset[str] = STATE_TABLES) -> Channels:
    """Every row of every table (and the drift view), as JSON text, by table name."""
    out: Channels = {}
    with psycopg.connect(db_url) as c:
        tables = [r[0] for r in c.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")]
        assert "refresh_runs" in tables and "provider_configs" in tables, tables
        for t in tables:
            if t in exclude:
                continue
            rows = one_row(c, f'SELECT coalesce(string_agg(to_jsonb(x)::text, E\'\\n\'), \'\') FROM "{t}" x')[0]
            out[f"table {t}"] = rows.encode()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`kl serve` as a subprocess with debug logging; .log holds everything it printed once stopped."""

    def __init__(self, db_url: str, *args: str, env: Mapping[str, str] | None = None) -> None:
        self.port = _free_port()
        full_env = {**os.environ, "PYTHONPATH": str(REPO), "KL_DATABASE_URL": db_url, **LOUD, **(env or {})}
        full_env.pop("KL_DEBUG", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "kilolock", "serve", "--listen", f"127.0.0.1:{self.port}", *args],
                                     env=full_env, stderr=subprocess.PIPE)
        assert self.proc.stderr is not None
        first = self.proc.stderr.readline()
        self.log = first
        if b"kl serve:" not in first:
            self.stop()
            raise AssertionError(f"kl serve did not start: {self.log.decode(errors='replace')}")

    def get(self, path: str, auth: str | None = None, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers={"Authorization": auth} if auth else {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def stop(self) -> bytes:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, rest = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, rest = self.proc.communicate()
        self.log += rest or b""
        return self.log


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def api_channels(db_url: str, state: str, env: Mapping[str, str] | None = None, auth: str | None = None) -> tuple[Channels, bytes]:
    """The JSON API's answers and the server log; also returns GET /states/<state> (the state itself)."""
    srv = Serve(db_url, env=env)
    out: Channels = {}
    try:
        for path in ("/api/v1/states", f"/api/v1/states/{state}/versions", f"/api/v1/states/{state}/drift", "/healthz"):
            status, body = srv.get(path, auth)
            assert status == 200, (path, status, body)
            json.loads(body)
            out[f"GET {path}"] = body
        status, pulled = srv.get(f"/states/{state}", auth)
        assert status == 200, (status, pulled)
    finally:
        out["kl serve log"] = srv.stop()
    assert b"GET /api/v1/states/" in out["kl serve log"], out["kl serve log"]  # the log is on: its grep means something
    return out, pulled


def leaks(secrets: Mapping[str, str], channels: Mapping[str, bytes]) -> list[str]:
    """'<secret name> in <channel>' for every secret found, in any of its spellings."""
    found = []
    for name, value in secrets.items():
        forms = {value.encode(), json.dumps(value)[1:-1].encode()}
        found += [f"{name} in {ch}" for ch, text in channels.items() if any(f in text for f in forms)]
    return found
