"""A real webhook receiver for notification tests: http.server on 127.0.0.1 in a thread, keeping
every request it gets (headers and raw body) and answering with the statuses it is told to."""
from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def signed_by(self, secret: str) -> bool:
        expected = "sha256=" + hmac.new(secret.encode(), self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.headers.get("X-Kilolock-Signature", ""), expected)


class Receiver:
    """``statuses``: the answers to the first requests, in order; 200 after them."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.requests: list[Received] = []
        self.statuses = list(statuses or [])
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.requests.append(Received(self.path, dict(self.headers.items()), body))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def events(self, kind: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if kind is None or r.headers.get("X-Kilolock-Event") == kind]

    def wait_for(self, count: int, kind: str | None = None, timeout: float = 30.0) -> list[Received]:
        """The requests (of KIND) once there are at least COUNT, or what came within TIMEOUT."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.events(kind)
            if len(got) >= count:
                return got
            time.sleep(0.05)
        return self.events(kind)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
