"""Sockets and HTTP framing: connections held by one selector thread until a request head is
complete, then answered by a worker pool (kilolock.server.conns) with the standard library's
BaseHTTPRequestHandler; one pooled database connection per request. Bounded bodies, socket
timeouts, optional TLS. Every route asks kilolock.server.access whether its principal may.

Routing: /states/<name> (the Terraform backend), /api/v1/... (read-only JSON), /ui/ (the web UI,
kilolock/server/ui), /metrics (Prometheus), /healthz.
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from socketserver import TCPServer, _SocketWriter  # type: ignore[attr-defined]
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg

from kilolock.errors import KlError
from kilolock.names import parse_state_name
from kilolock.server import api, backend, store_ops
from kilolock.server.access import Access, Decision, Grants, lock_action
from kilolock.server.auth import ANONYMOUS, Authenticator, PresentedJwt, PresentedToken, Principal
from kilolock.server.backend import Response, text
from kilolock.server.conns import Connection, ConnectionManager, Reader, raise_open_files_limit
from kilolock.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from kilolock.server.metrics import ServerMetrics, route_of
from kilolock.server.oidc import REFETCH_EVERY_S, Refused, Verifier
from kilolock.server.options import DEFAULT_MAX_BODY
from kilolock.server.pool import ConnectionPool, PoolExhausted
from kilolock.server.tls import TlsFiles, principal_name
from kilolock.store.db import DatabaseError

log = logging.getLogger("kilolock.server")

# An API answer read from a read replica: seconds the replica was behind its primary.
REPLICA_LAG_HEADER = "X-Kilolock-Replica-Lag"

# Retry-After of a 503 for a database that is unavailable (a restart, a lost connection). Terraform's
# http backend (go-retryablehttp) sleeps exactly that long between its retries, 2 by default
# (TF_HTTP_RETRY_MAX): 2 x 10 s spans PgBouncer's default server_login_retry (15 s), during which it
# refuses every new client after a PostgreSQL restart; with 1 s an apply gave up after 2 s.
DB_UNAVAILABLE_RETRY_AFTER_S = 10

# One line per request (kl serve turns it on at INFO): method, path, status, duration, user. Never
# a header, a query string or a body: those carry credentials, lock IDs and state.
access_log = logging.getLogger("kilolock.server.access")


def _printable(text: str, limit: int = 200) -> str:
    """A request path as one safe log field: a crafted path must not forge a second line."""
    out = "".join(c if c.isprintable() and c != " " else f"%{ord(c):02X}" if ord(c) < 256 else "?" for c in text)
    return out if len(out) <= limit else out[:limit] + "…"

_CHUNK = 1024 * 1024
# What each backend method needs (kilolock.server.access), checked before the body is read; for
# LOCK the least it needs (a plan's lock), the rest once its LockInfo says what it is for (_may_lock).
# UNLOCK depends on whose lock it is.
_BACKEND_ACTIONS = {"GET": "read", "POST": "write", "PUT": "write", "DELETE": "delete", "LOCK": "lock-plan"}
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "LOCK", "UNLOCK"})
# What an OIDC token past its expiry (within its trust's lock grace) may still do to a state its
# subject holds locked: what ends an apply. Terraform reads the state before it writes it.
_GRACE_METHODS = frozenset({"GET", "POST", "UNLOCK"})


@dataclass(frozen=True)
class ServerConfig:
    max_body: int = DEFAULT_MAX_BODY
    timeout: float = 60.0  # per socket operation while a request is answered; and how long a kept-alive connection may idle
    pool_size: int = 16
    pool_wait: float = 30.0
    # Open client connections at once; idle ones and ones still sending their headers cost no
    # thread (kilolock.server.conns). Beyond this, new connections get 503 at once.
    max_connections: int = 4096
    workers: int = 32  # requests answered at once, a thread each
    header_timeout: float = 10.0  # a request's head must be complete this long after its first byte
    policy: backend.BackendPolicy = field(default_factory=backend.BackendPolicy)
    # /metrics without credentials for clients on this host only (a local Prometheus); everything
    # else keeps the server's authentication.
    metrics_open_on_loopback: bool = False
    # An OIDC trust's keys are fetched again for an unknown key id at most this often (seconds).
    oidc_refetch_every: float = REFETCH_EVERY_S


# File descriptors kept aside for the database pool, the listener, logs and the providers' pipes.
_FD_RESERVE = 64


class KilolockHTTPServer(TCPServer):
    """Accepts on the calling thread (serve_forever); connections live in a ConnectionManager."""

    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], config: ServerConfig, auth: Authenticator,
                 connect: Callable[[], psycopg.Connection], tls: ssl.SSLContext | None = None,
                 read_connect: Callable[[], psycopg.Connection] | None = None) -> None:
        self.config = config
        self.auth = auth
        self.access = Access()
        self.oidc = Verifier(config.oidc_refetch_every)
        self.pool = ConnectionPool(connect, config.pool_size, config.pool_wait)
        # UI and API pages only (read_connect: a read replica); every write, and Terraform's state
        # reads (it must read what it wrote), stay on the primary's pool.
        self.replica = read_connect is not None
        self.replica_said = ""  # the replica's URL without its password, for the start-up line
        self.read_pool = ConnectionPool(read_connect, config.pool_size, config.pool_wait) if read_connect else self.pool
        self.metrics = ServerMetrics(self.pool.connection)
        self.tls = tls  # swapped whole by a reload (kl serve's SIGHUP); read once per accepted connection
        self.tls_files: TlsFiles | None = None  # where tls came from, for that reload
        pools = config.pool_size * (2 if self.replica else 1)
        fd_limit = raise_open_files_limit(config.max_connections + pools + _FD_RESERVE)
        self.max_connections = max(1, min(config.max_connections, fd_limit - pools - _FD_RESERVE))
        if self.max_connections < config.max_connections:
            log.warning("open-files limit %d allows %d client connections, not %d (--max-connections)",
                        fd_limit, self.max_connections, config.max_connections)
        # Before the bind: when it fails (the port is taken), TCPServer calls server_close, which
        # closes these too.
        self.connections = ConnectionManager(self._answer, workers=config.workers, max_connections=self.max_connections,
                                             header_timeout=config.header_timeout, idle_timeout=config.timeout,
                                             request_timeout=config.timeout,
                                             on_refused_certificate=self._audit_refused_certificate)
        super().__init__(address, _Handler)

    def _audit_refused_certificate(self, address: str, reason: str) -> None:
        """A handshake refused for the client's certificate, in the access audit beside the refused
        requests (`kl access log`): the certificate's subject is not known, only that it failed."""
        try:
            with self.pool.connection() as conn:
                self.access.refused_handshake(conn, address, reason + "; nothing done")
        except Exception as exc:  # noqa: BLE001 - the log line said it already; the audit is best effort
            log.warning("TLS handshake refusal from %s not audited: %s", address, exc)

    def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
        self.connections.add(request, client_address)

    def _answer(self, connection: Connection) -> bool:
        handler = _Handler(connection, connection.address, self)  # type: ignore[arg-type]
        return not handler.close_connection

    def get_request(self):  # type: ignore[no-untyped-def]
        sock, addr = super().get_request()
        if self.tls is not None:
            # The handshake happens in the connection thread, non-blocking, so a slow or silent
            # client cannot stall accept() for everyone else.
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def server_close(self) -> None:
        super().server_close()
        self.connections.close()
        self.pool.close()
        self.read_pool.close()

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
    # Headers and body are small separate segments: with Nagle on, the second one waits for the
    # client's delayed ACK (~40 ms per response).
    disable_nagle_algorithm = True

    def version_string(self) -> str:
        # The standard library's is server_version + " " + sys_version (Python's version): the
        # Server header says "kilolock" and nothing about the interpreter.
        return self.server_version

    def setup(self) -> None:
        # The connection's socket and what the selector thread already read of it (the request
        # head): self.request is a kilolock.server.conns.Connection.
        conn: Connection = self.request
        self.connection = conn.sock
        self.rfile = Reader(conn)  # type: ignore[assignment]
        self.wfile = _SocketWriter(conn.sock)
        if conn.served == 0 and not isinstance(conn.sock, ssl.SSLSocket):
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)

    def handle(self) -> None:
        # One request: a kept-alive connection goes back to the selector thread, not a loop here.
        self.close_connection = True
        try:
            self.handle_one_request()
        except OSError:  # the peer went away, timed out, or broke TLS: nothing to answer
            self.close_connection = True

    def finish(self) -> None:
        pass  # the ConnectionManager keeps or closes the socket

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
        self._url_path = ""
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
            resp = text(503, "database unavailable; retry", **{"Retry-After": str(DB_UNAVAILABLE_RETRY_AFTER_S)})
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
        self._url_path = path
        if path == "/healthz" and method == "GET":
            with self.server.pool.connection() as conn:
                return api.health(conn)
        self._credential_refused: Refused | None = None
        principal, grants = self._who()
        self._principal = principal
        if path == "/metrics" and method == "GET":
            if principal is not None:
                return Response(200, self.server.metrics.exposition(self._grants_of(principal, grants).may_read),
                                METRICS_CONTENT_TYPE)
            if self._metrics_open():
                return Response(200, self.server.metrics.exposition(), METRICS_CONTENT_TYPE)
        if principal is None:
            if self._credential_refused is not None:
                return self._refuse_credential(self._credential_refused)
            return text(401, "authentication required (HTTP Basic or a Bearer token)", **{"WWW-Authenticate": 'Basic realm="kilolock"'})
        self._grants = self._grants_of(principal, grants)
        if principal.grace is not None and not (path.startswith("/states/") and method in _GRACE_METHODS):
            return self._refuse_grace(principal, None)
        if path.startswith("/states/"):
            return self._backend(method, parse_state_name(path[len("/states/"):]), url.query, principal)
        if path.startswith("/api/v1/"):
            if method != "GET":
                return text(405, f"{method} is not allowed on {path}: the API is read-only", Allow="GET")
            return self._api(path[len("/api/v1/"):], parse_qs(url.query, keep_blank_values=True))
        if path == "/ui" or path.startswith("/ui/"):
            from kilolock.server import ui

            return ui.handle(self.server.read_pool.connection, principal, self.grants, method, path,
                             parse_qs(url.query, keep_blank_values=True), replica=self.server.replica)
        if path == "/metrics":
            return text(405, f"{method} is not allowed on /metrics", Allow="GET")
        return text(404, f"no such endpoint {path!r}: the backend is at /states/<name>, the API at /api/v1/, the web UI at /ui/, metrics at /metrics")

    def _who(self) -> tuple[Principal | None, Grants | None]:
        """The principal and, for a kl token, its grants (read with it, at every request: a revoked
        or expired token is refused at once)."""
        header = self.headers.get("Authorization")
        if header is None and isinstance(self.connection, ssl.SSLSocket):
            # A request's own credential wins over its connection's certificate: a client that
            # sends both (Terraform with a client certificate and a password) is who it says.
            by_cert = self.server.auth.by_certificate(principal_name(self.connection.getpeercert()))
            if by_cert is not None:
                return by_cert, None
        who = self.server.auth.identify(header)
        if isinstance(who, PresentedToken):
            with self.server.pool.connection() as conn:
                found = self.server.access.token(conn, who)
            return found if found is not None else (None, None)
        if isinstance(who, PresentedJwt):
            try:
                with self.server.pool.connection() as conn:
                    return self.server.access.jwt(conn, who, self.server.oidc)
            except Refused as exc:
                self._credential_refused = exc
                return None, None
        return who, None

    def _refuse_credential(self, refused: Refused) -> Response:
        """401 for a JWT that does not check out: one line in the server's log and in the access
        audit, naming who it claims to be and why, never the token."""
        reason = f"bearer token refused: {refused.reason}"
        log.warning("%s %s %s: %s: %s", self.client_address[0], self.command, _printable(self._url_path),
                    _printable(refused.actor, 200), reason)
        with self.server.pool.connection() as conn:
            self.server.access.refused(conn, Principal(refused.actor, kind="oidc"), f"{self.command} {_printable(self._url_path)}",
                                       None, reason)
        return text(401, reason, **{"WWW-Authenticate": 'Bearer realm="kilolock", error="invalid_token"'})

    def _refuse_grace(self, principal: Principal, state: str | None) -> Response:
        reason = (f"{principal.id}: {principal.grace}; past its expiry a token may only read, save (POST) and "
                  "unlock a state its subject holds locked, within its trust's lock grace")
        log.warning("%s %s %s: %s", self.client_address[0], self.command, _printable(self._url_path), reason)
        with self.server.pool.connection() as conn:
            self.server.access.refused(conn, principal, f"{self.command} {_printable(self._url_path)}", state, reason)
        return text(401, reason, **{"WWW-Authenticate": 'Bearer realm="kilolock", error="invalid_token"'})

    def _grants_of(self, principal: Principal, grants: Grants | None) -> Grants:
        if grants is not None:
            return grants
        if principal.kind not in ("user", "cert"):
            return self.server.access.grants_for(None, principal)
        with self.server.pool.connection() as conn:
            return self.server.access.grants_for(conn, principal)

    @property
    def grants(self) -> Grants:
        """The authenticated principal's grants (every route after authentication)."""
        return self._grants

    def _refuse(self, decision: Decision, state: str | None, hint: str = "") -> Response:
        """403 with the one-line reason, recorded in the access audit (who, what, when)."""
        return text(403, self._audit_refusal(decision, state, hint))

    def _refuse_lock(self, decision: Decision, state: str, hint: str, info: dict[str, Any] | str = "") -> Response:
        """A refused LOCK, audited as any refusal, in the answer whose reason Terraform prints
        (backend.lock_refused): of a 403 it shows only "invalid auth"."""
        return backend.lock_refused(self._audit_refusal(decision, state, hint), info)

    def _audit_refusal(self, decision: Decision, state: str | None, hint: str) -> str:
        principal = self._principal
        assert principal is not None
        reason = decision.reason + hint + "; nothing done"
        with self.server.pool.connection() as conn:
            self.server.access.refused(conn, principal, f"{self.command} {_printable(self._url_path)}", state, reason)
        return reason

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
        if principal.grace is not None:
            with self.server.pool.connection() as conn:
                locked, holder = store_ops.lock_holder(conn, name)
            if not (locked and holder == principal.id):
                return self._refuse_grace(principal, name)
        action = _BACKEND_ACTIONS.get(method)
        if action is not None:
            decision = self.grants.allows(action, name)
            if not decision:
                return self._refuse_lock(decision, name, "") if method == "LOCK" else self._refuse(decision, name)
        body = self._read_body() if method in ("POST", "PUT", "LOCK", "UNLOCK") else b""
        if method == "LOCK":
            refused = self._may_lock(name, body)
            if refused is not None:
                return refused
        params = parse_qs(query, keep_blank_values=True)
        lock_id = (params.get("ID") or [""])[0] or None
        with self.server.pool.connection() as conn:
            if method == "GET":
                return backend.get_state(conn, name)
            if method in ("POST", "PUT"):
                return backend.put_state(conn, name, body, lock_id, principal, self.headers.get("Content-MD5"))
            if method == "DELETE":
                return backend.delete_state(conn, name, lock_id)
            if method == "LOCK":
                return backend.lock_state(conn, name, body, principal)
            refused = self._may_unlock(conn, name, body, principal)
            if refused is not None:
                return refused
            return backend.unlock_state(conn, name, body, principal)

    def _may_lock(self, name: str, body: bytes) -> Response | None:
        """LOCK for a plan needs read (checked already); for anything else, or a body that does not
        say, write: the lock comes before the work, and an apply refused only at its state POST has
        already changed real resources."""
        info = backend.parse_lock_info(body)
        operation = info.get("Operation") if isinstance(info, dict) else None
        decision = self.grants.allows(lock_action(operation), name)
        if decision:
            return None
        asked = f"a LOCK for {_printable(operation, 60)}" if operation else "a LOCK without an Operation"
        return self._refuse_lock(decision, name, f" ({asked}; read may lock only for terraform plan)", info)

    def _may_unlock(self, conn: psycopg.Connection, name: str, body: bytes, principal: Principal) -> Response | None:
        """UNLOCK of its own lock needs read; of another principal's lock (with its ID) write; without
        any ID (terraform force-unlock) admin, or write with kl serve --allow-force-unlock."""
        allow_flag = self.server.config.policy.allow_empty_force_unlock
        if not body.strip():
            if principal is ANONYMOUS and not allow_flag:  # as before grants: only with the flag
                return self._refuse(Decision(False, "admin", None, "UNLOCK without a lock ID (terraform force-unlock) "
                                             "needs an admin credential, or kl serve --allow-force-unlock"), name)
            decision = self.grants.allows("write" if allow_flag else "force-unlock", name)
            return None if decision else self._refuse(
                decision, name, "" if allow_flag else " (UNLOCK without a lock ID is terraform force-unlock; "
                                                       "or kl serve --allow-force-unlock)")
        locked, holder = store_ops.lock_holder(conn, name)
        decision = self.grants.allows("unlock" if not locked or holder == principal.id else "unlock-other", name)
        return None if decision else self._refuse(decision, name, " (the lock is another principal's)")

    def _api(self, rest: str, params: dict[str, list[str]]) -> Response:
        if rest == "states":
            with self.server.read_pool.connection() as conn:
                return self._lag_said(conn, api.states(conn, self.grants.may_read))
        if rest == "resources":
            with self.server.read_pool.connection() as conn:
                return self._lag_said(conn, api.resources(conn, params, self.grants.may_read))
        if rest.startswith("states/"):
            inner = rest[len("states/"):]
            for suffix in ("/drift", "/versions"):
                if inner.endswith(suffix):
                    name = parse_state_name(inner[: -len(suffix)])
                    decision = self.grants.allows("read", name)
                    if not decision:
                        return self._refuse(decision, name)
                    with self.server.read_pool.connection() as conn:
                        if suffix == "/versions":
                            return self._lag_said(conn, api.versions(conn, name))
                        include_resolved = (params.get("all") or ["0"])[0] in ("1", "true")  # as kl drift --all
                        return self._lag_said(conn, api.drift_report(conn, name, include_resolved))
        return text(404, f"no such API endpoint /api/v1/{rest}: the API offers GET /api/v1/states, "
                         "/api/v1/states/<name>/versions, /api/v1/states/<name>/drift and /api/v1/resources")

    def _lag_said(self, conn: psycopg.Connection, resp: Response) -> Response:
        """RESP, read on CONN, with how far behind the primary it may be when CONN is a replica's."""
        if self.server.replica and resp.status == 200:
            from kilolock.store.ui_queries import replica_lag

            lag = replica_lag(conn)
            if lag is not None:
                resp.headers[REPLICA_LAG_HEADER] = f"{lag:.3f}"
        return resp


def serve_in_thread(server: KilolockHTTPServer) -> threading.Thread:
    """Run the server in a background thread (tests; embedding)."""
    t = threading.Thread(target=server.serve_forever, name="kl-serve", daemon=True)
    t.start()
    return t
