"""Load for kl serve: N clients doing GET / LOCK / POST / UNLOCK cycles on a few states over
keep-alive connections, with every answer checked as it arrives and the database checked after.

Used by tests/server/test_load.py (a few seconds) and benches/test_serve_load.py (30 s)."""
from __future__ import annotations

import http.client
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psycopg

from kit.pg import one_row

NULL = 'provider["registry.terraform.io/hashicorp/null"]'


def state_body(serial: int, lineage: str, writer: str) -> bytes:
    return json.dumps({
        "version": 4, "terraform_version": "1.8.5", "serial": serial, "lineage": lineage, "outputs": {},
        "resources": [{"mode": "managed", "type": "null_resource", "name": "r", "provider": NULL,
                       "instances": [{"schema_version": 0, "attributes": {"id": f"{writer}-{serial}"},
                                      "sensitive_attributes": []}]}],
    }).encode()


@dataclass
class Outcome:
    requests: int = 0
    cycles: int = 0
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    writes: list[tuple[str, int, str]] = field(default_factory=list)  # (state, serial, writer)
    seconds: float = 0.0

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


class _Client(threading.Thread):
    def __init__(self, n: int, url: str, states: list[str], stop_at: float, issued: set[str], token: str | None) -> None:
        super().__init__(name=f"load-{n}", daemon=True)
        self.n, self.states, self.stop_at, self.issued = n, states, stop_at, issued
        u = urlsplit(url)
        assert u.hostname is not None, f"no host in {url!r}"
        self.host, self.port = u.hostname, u.port
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.out = Outcome()
        self.rng = random.Random(n)

    def _req(self, conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn.request(method, path, body=body, headers=self.headers)
        resp = conn.getresponse()
        self.out.requests += 1
        return resp.status, resp.read()

    def _fail(self, what: str) -> None:
        self.out.errors.append(f"client {self.n}: {what}")

    def run(self) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            while time.monotonic() < self.stop_at and len(self.out.errors) < 5:
                self._cycle(conn)
        except Exception as exc:  # noqa: BLE001 - a timeout here is a hang or deadlock: report it, do not mask it
            self._fail(f"{type(exc).__name__}: {exc}")
        finally:
            conn.close()

    def _cycle(self, conn: http.client.HTTPConnection) -> None:
        name = self.rng.choice(self.states)
        path = f"/states/{name}"
        status, _ = self._req(conn, "GET", path)
        if status not in (200, 204):
            return self._fail(f"GET {path} -> {status}")
        lock_id = str(uuid.uuid4())
        self.issued.add(lock_id)
        info = json.dumps({"ID": lock_id, "Operation": "OperationTypeApply", "Info": "", "Who": f"load-{self.n}@bench",
                           "Version": "1.8.5", "Created": "2026-11-29T12:00:00Z", "Path": ""}).encode()
        status, body = self._req(conn, "LOCK", path, info)
        if status == 423:
            holder = json.loads(body).get("ID")
            if not holder or holder == lock_id or holder not in self.issued:
                self._fail(f"LOCK {path} -> 423 with holder {holder!r}, not another client's lock")
            self.out.conflicts += 1
            return
        if status != 200:
            return self._fail(f"LOCK {path} -> {status}: {body[:200]!r}")
        # Under the lock nobody else writes: read the serial, write the next one.
        status, body = self._req(conn, "GET", path)
        serial = json.loads(body)["serial"] if status == 200 else 0
        lineage = json.loads(body)["lineage"] if status == 200 else f"lineage-{name}"
        status, body = self._req(conn, "POST", f"{path}?ID={lock_id}", state_body(serial + 1, lineage, f"c{self.n}"))
        if status != 200:
            self._fail(f"POST {path} serial {serial + 1} under lock -> {status}: {body[:200]!r}")
        else:
            self.out.writes.append((name, serial + 1, f"c{self.n}"))
        status, body = self._req(conn, "UNLOCK", path, info)
        if status != 200:
            return self._fail(f"UNLOCK {path} by the holder -> {status}: {body[:200]!r}")
        self.out.cycles += 1


def run_load(url: str, states: list[str], clients: int, seconds: float, token: str | None = None) -> Outcome:
    issued: set[str] = set()  # set.add is atomic under the GIL: every lock ID any client sent
    start = time.monotonic()
    workers = [_Client(i, url, states, start + seconds, issued, token) for i in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=seconds + 120)
    total = Outcome(seconds=time.monotonic() - start)
    for w in workers:
        if w.is_alive():
            total.errors.append(f"client {w.n} still running {seconds + 120:.0f}s after the end: deadlock or hang")
        total.requests += w.out.requests
        total.cycles += w.out.cycles
        total.conflicts += w.out.conflicts
        total.errors += w.out.errors
        total.writes += w.out.writes
    return total


def check_database(db_url: str, outcome: Outcome) -> list[str]:
    """Every acknowledged write is exactly one version, with no gaps, and no lock is left."""
    problems = []
    with psycopg.connect(db_url) as c:
        rows = c.execute(
            """SELECT s.name, v.serial, kl_version_document(v.id) -> 'resources' -> 0 -> 'instances' -> 0 -> 'attributes' ->> 'id'
               FROM state_versions v JOIN states s ON s.id = v.state_id ORDER BY s.name, v.serial""").fetchall()
        locks_left = one_row(c, "SELECT count(*) FROM state_locks")[0]
        open_rows = one_row(c, "SELECT count(*) FROM resources WHERE delete_serial IS NULL")[0]
    stored = sorted((name, serial, ident.rsplit("-", 1)[0]) for name, serial, ident in rows)
    acked = sorted(outcome.writes)
    if stored != acked:
        missing = sorted(set(acked) - set(stored))[:5]
        extra = sorted(set(stored) - set(acked))[:5]
        problems.append(f"versions differ from acknowledged writes: missing {missing}, unacknowledged {extra}")
    by_state: dict[str, list[int]] = {}
    for name, serial, _ in stored:
        by_state.setdefault(name, []).append(serial)
    for name, serials in by_state.items():
        if serials != list(range(1, len(serials) + 1)):
            problems.append(f"state {name}: serials are not 1..{len(serials)} without gaps")
    if locks_left:
        problems.append(f"{locks_left} lock(s) left held")
    if open_rows != len(by_state):
        problems.append(f"{open_rows} open lifecycle rows, expected one per state ({len(by_state)})")
    return problems
