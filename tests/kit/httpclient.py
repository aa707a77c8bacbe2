"""A minimal HTTP client for the server tests (one connection per request, like a fresh client)."""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    def __init__(self, url: str, server: Any = None, auth: str | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.url = url
        self.server = server
        self.auth = auth
        self._ssl = ssl_context

    def with_auth(self, header: str | None) -> Client:
        return Client(self.url, self.server, header, self._ssl)

    def basic(self, user: str, password: str) -> Client:
        return self.with_auth("Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())

    def request(self, method: str, path: str, body: bytes | str | dict | None = None, headers: dict[str, str] | None = None,
                md5: bool = False) -> Reply:
        u = urlsplit(self.url)
        assert u.hostname is not None, f"no host in {self.url!r}"
        if u.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(u.hostname, u.port, timeout=30, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        h = dict(headers or {})
        if self.auth:
            h["Authorization"] = self.auth
        if md5 and body is not None:
            h["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
        try:
            conn.request(method, path, body=body, headers=h)
            resp = conn.getresponse()
            return Reply(resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()})
        finally:
            conn.close()
