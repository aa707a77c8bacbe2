"""Sockets and HTTP framing: the standard library's ThreadingHTTPServer, one thread per connection,
one pooled database connection per request. Bounded bodies, socket timeouts, optional TLS.

Routing: /states/<name> (the Terraform backend), /api/v1/... (read-only JSON), /ui/ (the web UI,
kilolock/server/ui), /metrics (Prometheus), /healthz.
"""
from __future__ import annotations

import ipaddress
import logging
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import psycopg

from kilolock.errors import KlError
from kilolock.names import parse_state_name
from kilolock.server import api, backend
from kilolock.server.auth import Authenticator, Principal
from kilolock.server.backend import Response, text
from kilolock.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from kilolock.server.metrics import ServerMetrics, route_of
from kilolock.server.options import DEFAULT_MAX_BODY
from kilolock.server.pool import ConnectionPool, PoolExhausted
from kilolock.store.db import DatabaseError

log = logging.getLogger("kilolock.server")
# One line per request (kl serve turns it on at INFO): method, path, status, duration, user. Never
# a header, a query string or a body: those carry credentials, lock IDs and state.
access_log = logging.getLogger("kilolock.server.access")


def _printable(text: str, limit: int = 200) -> str:
    """A request path as one safe log field: a crafted path must not forge a second line."""
    out = "".join(c if c.isprintable() and c != " " else f"%{ord(c):02X}" if ord(c) < 256 else "?" for c in text)
    return out if len(out) <= limit else out[:limit] + "…"

_CHUNK = 1024 * 1024
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "LOCK", "UNLOCK"})


@dataclass(frozen=True)
class ServerConfig:
    max_body: int = DEFAULT_MAX_BODY
    timeout: float = 60.0  # per socket operation: a stalled client frees its thread after this
    pool_size: int = 16
    pool_wait: float = 30.0
    max_connections: int = 256  # one thread each; beyond this, new connections get 503 at once
    policy: backend.BackendPolicy = field(default_factory=backend.BackendPolicy)
    # /metrics without credentials for clients on this host only (a local Prometheus); everything
    # else keeps the server's authentication.
    metrics_open_on_loopback: bool = False


_BUSY_TEXT = b"server busy: too many open connections; retry\n"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\n"
         b"Connection: close\r\nContent-Length: " + str(len(_BUSY_TEXT)).encode() + b"\r\n\r\n" + _BUSY_TEXT)


class KilolockHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], config: ServerConfig, auth: Authenticator,
                 connect: Callable[[], psycopg.Connection], tls: ssl.SSLContext | None = None) -> None:
        self.config = config
        self.auth = auth
        self.pool = ConnectionPool(connect, config.pool_size, config.pool_wait)
        self.metrics = ServerMetrics(self.pool.connection)
        self.tls = tls
        self._connection_slots = threading.BoundedSemaphore(config.max_connections)
        super().__init__(address, _Handler)

    def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
        if not self._connection_slots.acquire(blocking=False):
            if self.tls is None:  # before a TLS handshake there is no way to say anything
                try:
                    request.sendall(_BUSY)
                except OSError:
                    pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):  # type: ignore[no-untyped-def]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connection_slots.release()

    def get_request(self):  # type: ignore[no-untyped-def]
        sock, addr = super().get_request()
        if self.tls is not None:
            # The handshake happens in the connection's own thread (see _Handler.setup), so a slow
            # or silent client cannot stall accept() for everyone else.
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def server_close(self) -> None:
        super().server_close()
        self.pool.close()

    @property
    def url(self) -> str:
        address, port = self.server_address[:2]
        host = address.decode() if isinstance(address, (bytes, bytearray)) else str(address)
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.tls else 'http'}://{host}:{port}"


class _BodyError(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


class _Handler(BaseHTTPRequestHandler):
    server: KilolockHTTPServer
    protocol_version = "HTTP/1.1"  # keep-alive: Terraform reuses its connection
    server_version = "kilolock"
    sys_version = ""
    # Headers and body are small separate segments: with Nagle on, the second one waits for the
    # client's delayed ACK (~40 ms per response).
    disable_nagle_algorithm = True

    def setup(self) -> None:
        # Per server, so per handler instance; typeshed declares it a ClassVar.
        self.timeout = self.server.config.timeout  # type: ignore[misc]
        super().setup()
        if isinstance(self.request, ssl.SSLSocket):
            try:
                self.request.do_handshake()
            except (ssl.SSLError, OSError) as exc:
                log.info("TLS handshake with %s failed: %s", self.client_address[0], exc)
                self.close_connection = True
                raise ConnectionAbortedError() from None

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # the peer went away, timed out, or broke TLS: nothing to answer
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # The standard library's own errors (malformed request line, unknown method, oversized
        # headers) as one plain line like every other answer, not an HTML page.
        if code == 501 and getattr(self, "command", None):
            message = f"method {self.command} is not supported: use GET, POST, PUT, DELETE, LOCK or UNLOCK"
        self.close_connection = True
        self.log_error("code %d, message %s", code, message)
        try:
            self._send(text(code, message or self.responses.get(code, ("error",))[0]))
        except (ConnectionError, TimeoutError):
            pass

    def log_message(self, format: str, *args: object) -> None:
        log.info("%s %s", self.client_address[0], format % args)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        started = getattr(self, "_started", None)
        took = f"{(time.monotonic() - started) * 1000:.1f}ms" if started is not None else "-"
        principal: Principal | None = getattr(self, "_principal", None)
        path = urlsplit(getattr(self, "path", "") or "").path or "-"
        access_log.info("%s %s %s %s %s %s", self.client_address[0], getattr(self, "command", None) or "-",
                        _printable(path), code, took, principal.name if principal is not None else "-")

    do_GET = do_POST = do_PUT = do_DELETE = do_LOCK = do_UNLOCK = lambda self: self._dispatch()

    # --- plumbing ------------------------------------------------------------------------------

    def _send(self, resp: Response) -> None:
        self.log_request(resp.status)
        started = getattr(self, "_started", None)
        method = getattr(self, "command", None) or "-"
        self.server.metrics.observe(route_of(urlsplit(getattr(self, "path", "") or "").path),
                                    method if method in _METHODS else "other", resp.status,
                                    time.monotonic() - started if started is not None else 0.0)
        reason = self.responses.get(resp.status, ("",))[0]
        headers = {"Server": self.version_string(), "Date": self.date_time_string(),
                   "Content-Type": resp.content_type, "Content-Length": str(len(resp.body))}
        if resp.status == 503:
            headers["Retry-After"] = "1"
        headers.update(resp.headers)
        if self.close_connection:
            headers["Connection"] = "close"
        head = f"{self.protocol_version} {resp.status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        out = head.encode("latin-1") + b"\r\n"
        if self.command != "HEAD" and resp.status not in (204, 304):
            out += resp.body
        # One write: headers and body as separate small segments would let Nagle hold the second
        # until the client's delayed ACK (~40 ms per response).
        self.wfile.write(out)

    def _read_body(self) -> bytes:
        self._body_read = True  # from here on, a failure closes the connection itself when needed
        te = self.headers.get("Transfer-Encoding")
        if te:
            if te.strip().lower() != "chunked":
                self.close_connection = True
                raise _BodyError(text(501, f"Transfer-Encoding {te!r} is not supported (only chunked)"))
            # Terraform's force-unlock sends its empty body chunked (a reader of unknown length).
            return self._read_chunked()
        raw_len = self.headers.get("Content-Length")
        if raw_len is None:
            return b""
        try:
            length = int(raw_len)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise _BodyError(text(400, f"Content-Length {raw_len!r} is not a non-negative number")) from None
        limit = self.server.config.max_body
        if length > limit:
            self.close_connection = True  # the body is not read, so the connection cannot be reused
            raise _BodyError(text(413, f"request body is {length} bytes; this server accepts at most {limit} (kl serve --max-body)"))
        parts, left = [], length
        while left:
            chunk = self.rfile.read(min(left, _CHUNK))
            if not chunk:
                self.close_connection = True
                raise _BodyError(text(400, f"request body ended after {length - left} of {length} bytes"))
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def _read_chunked(self) -> bytes:
        limit = self.server.config.max_body
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1026)
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
                if size < 0 or not line.endswith(b"\n"):
                    raise ValueError
            except ValueError:
                self.close_connection = True
                raise _BodyError(text(400, "malformed chunked request body")) from None
            if size == 0:
                break
            total += size
            if total > limit:
                self.close_connection = True
                raise _BodyError(text(413, f"request body exceeds {limit} bytes, the most this server accepts (kl serve --max-body)"))
            chunk = self.rfile.read(size)
            if len(chunk) != size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
                self.close_connection = True
                raise _BodyError(text(400, "chunked request body ended early or is malformed"))
            parts.append(chunk)
        for _ in range(100):  # trailer fields, up to the empty line
            if self.rfile.readline(8192) in (b"\r\n", b"\n", b""):
                break
        return b"".join(parts)

    def _dispatch(self) -> None:
        self._body_read = False
        self._started = time.monotonic()
        self._principal: Principal | None = None
        try:
            resp = self._route()
        except _BodyError as exc:
            resp = exc.response
        except TimeoutError:
            self.close_connection = True
            resp = text(408, f"request not received within {self.server.config.timeout:g}s; closing the connection")
        except PoolExhausted:
            resp = text(503, "server busy: no database connection free; retry")
        except (psycopg.OperationalError, DatabaseError) as exc:
            log.warning("database error: %s", str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
            resp = text(503, "database unavailable; retry")
        except KlError as exc:
            resp = text(400, str(exc))
        except Exception:
            log.exception("internal error on %s %s", self.command, self.path)
            resp = text(500, "internal error (logged by the server)")
        if not self._body_read and self._has_unread_body():
            # Answered before the body was read (auth, bad name): the rest of the stream is not a
            # request, so this connection cannot carry another one.
            self.close_connection = True
        try:
            self._send(resp)
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def _route(self) -> Response:
        url = urlsplit(self.path)
        method = self.command
        path = url.path
        if path == "/healthz" and method == "GET":
            with self.server.pool.connection() as conn:
                return api.health(conn)
        principal = self.server.auth.authenticate(self.headers.get("Authorization"))
        self._principal = principal
        if path == "/metrics" and method == "GET" and (principal is not None or self._metrics_open()):
            return Response(200, self.server.metrics.exposition(), METRICS_CONTENT_TYPE)
        if principal is None:
            return text(401, "authentication required (HTTP Basic or a Bearer token)", **{"WWW-Authenticate": 'Basic realm="kilolock"'})
        if path.startswith("/states/"):
            return self._backend(method, parse_state_name(path[len("/states/"):]), url.query, principal)
        if path.startswith("/api/v1/"):
            if method != "GET":
                return text(405, f"{method} is not allowed on {path}: the API is read-only", Allow="GET")
            return self._api(path[len("/api/v1/"):], parse_qs(url.query, keep_blank_values=True))
        if path == "/ui" or path.startswith("/ui/"):
            from kilolock.server import ui

            return ui.handle(self.server.pool.connection, principal, method, path, parse_qs(url.query, keep_blank_values=True))
        if path == "/metrics":
            return text(405, f"{method} is not allowed on /metrics", Allow="GET")
        return text(404, f"no such endpoint {path!r}: the backend is at /states/<name>, the API at /api/v1/, the web UI at /ui/, metrics at /metrics")

    def _metrics_open(self) -> bool:
        if not self.server.config.metrics_open_on_loopback:
            return False
        try:
            return ipaddress.ip_address(self.client_address[0]).is_loopback
        except ValueError:
            return False

    def _has_unread_body(self) -> bool:
        return bool(self.headers.get("Content-Length", "0") not in ("", "0") or self.headers.get("Transfer-Encoding"))

    def _backend(self, method: str, name: str, query: str, principal: Principal) -> Response:
        body = self._read_body() if method in ("POST", "PUT", "LOCK", "UNLOCK") else b""
        params = parse_qs(query, keep_blank_values=True)
        lock_id = (params.get("ID") or [""])[0] or None
        with self.server.pool.connection() as conn:
            if method == "GET":
                return backend.get_state(conn, name)
            if method in ("POST", "PUT"):
                return backend.put_state(conn, name, body, lock_id, principal, self.headers.get("Content-MD5"))
            if method == "DELETE":
                # It drops the whole history, which Terraform itself never asks for over this backend.
                if self.server.auth.enabled and not principal.admin:
                    return text(403, f"DELETE of state {name!r} (and all its versions) needs an admin credential")
                return backend.delete_state(conn, name, lock_id)
            if method == "LOCK":
                return backend.lock_state(conn, name, body, principal)
            return backend.unlock_state(conn, name, body, principal, self.server.config.policy)

    def _api(self, rest: str, params: dict[str, list[str]]) -> Response:
        if rest == "states":
            with self.server.pool.connection() as conn:
                return api.states(conn)
        if rest.startswith("states/"):
            inner = rest[len("states/"):]
            if inner.endswith("/drift"):  # ?all=1: resolved drift too, as `kl drift --all`
                name = parse_state_name(inner[: -len("/drift")])
                include_resolved = (params.get("all") or ["0"])[0] in ("1", "true")
                with self.server.pool.connection() as conn:
                    return api.drift_report(conn, name, include_resolved)
            if inner.endswith("/versions"):
                name = parse_state_name(inner[: -len("/versions")])
                with self.server.pool.connection() as conn:
                    return api.versions(conn, name)
        return text(404, f"no such API endpoint /api/v1/{rest}: try states, states/<name>/versions, states/<name>/drift")


def serve_in_thread(server: KilolockHTTPServer) -> threading.Thread:
    """Run the server in a background thread (tests; embedding)."""
    t = threading.Thread(target=server.serve_forever, name="kl-serve", daemon=True)
    t.start()
    return t
