"""Client connections without a thread each: one selector thread holds every open connection
while it is idle or still sending its request head, and hands a connection to the worker pool only
once a complete head (request line and headers) has arrived. A worker answers that request (body
read and response written with the socket timeout) and gives a keep-alive connection back.

So idle connections, and clients that send their headers a byte at a time, cost a file descriptor
and a few hundred bytes, not a thread: a thousand of them leave every worker free for real clients.
A head must be complete within ``header_timeout`` of its first byte (else 408), a fresh connection
must start one within ``header_timeout`` (else it is closed), and a kept-alive connection may idle
for ``idle_timeout``. Beyond ``max_connections`` open connections a new one gets 503 at once.
"""
from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kilolock.server import tls

log = logging.getLogger("kilolock.server")

_REFUSAL_EVERY_S = 60.0
_REFUSALS_REMEMBERED = 10_000
MAX_HEAD = 64 * 1024  # request line and headers together; BaseHTTPRequestHandler's own line limit is 64 KiB


def raise_open_files_limit(wanted: int = 65536) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard one (as far as WANTED); the soft limit now."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.info("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    return wanted if soft == resource.RLIM_INFINITY else soft


def _simple_response(status: str, message: str) -> bytes:
    body = (message + "\n").encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class Connection:
    """One client connection and what it sent beyond the request being handled."""

    __slots__ = ("address", "buffer", "handshaken", "head_started", "idle_since", "served", "sock")

    def __init__(self, sock: socket.socket, address: tuple[str, int]) -> None:
        self.sock = sock
        self.address = address
        self.buffer = bytearray()
        self.head_started: float | None = None  # when the first byte of the pending head came
        self.idle_since = time.monotonic()
        self.handshaken = not isinstance(sock, ssl.SSLSocket)
        self.served = 0  # requests answered on it

    def has_head(self) -> bool:
        return b"\r\n\r\n" in self.buffer or b"\n\n" in self.buffer


class Reader:
    """A file-like reader over a connection's socket that first returns what the selector thread
    already read (readline and read, as BaseHTTPRequestHandler and the body reader use them);
    what it reads beyond the current request stays in ``connection.buffer``."""

    def __init__(self, connection: Connection) -> None:
        self._conn = connection

    def _fill(self) -> bool:
        data = self._conn.sock.recv(65536)
        if not data:
            return False
        self._conn.buffer += data
        return True

    def readline(self, limit: int = -1) -> bytes:
        buf = self._conn.buffer
        scanned = 0
        while True:
            i = buf.find(b"\n", scanned)
            if i >= 0 and (limit < 0 or i < limit):
                out = bytes(buf[: i + 1])
                del buf[: i + 1]
                return out
            if 0 <= limit <= len(buf):
                out = bytes(buf[:limit])
                del buf[:limit]
                return out
            scanned = len(buf)
            if not self._fill():
                out = bytes(buf)
                buf.clear()
                return out

    def read(self, n: int = -1) -> bytes:
        buf = self._conn.buffer
        if n < 0:
            while self._fill():
                pass
            out = bytes(buf)
            buf.clear()
            return out
        if len(buf) >= n:
            out = bytes(buf[:n])
            del buf[:n]
            return out
        # A large body: receive straight into one buffer rather than through the connection's.
        out_buf = bytearray(n)
        view = memoryview(out_buf)
        have = len(buf)
        view[:have] = buf
        buf.clear()
        while have < n:
            got = self._conn.sock.recv_into(view[have:], min(n - have, 1 << 20))
            if not got:
                break
            have += got
        view.release()
        return bytes(out_buf[:have])

    def close(self) -> None:
        pass


Handle = Callable[[Connection], bool]  # answer the connection's next request; False: close it


class ConnectionManager:
    """The selector thread and the worker pool. ``handle`` (run by a worker) answers one request
    whose head is in ``connection.buffer`` and says whether the connection stays open."""

    def __init__(self, handle: Handle, *, workers: int, max_connections: int, header_timeout: float,
                 idle_timeout: float, request_timeout: float,
                 on_refused_certificate: Callable[[str, str], None] | None = None) -> None:
        self._handle = handle
        # Called on a worker with (client address, one-line reason) for a handshake refused because
        # of the client's certificate: at most once a minute per address and reason, so a client
        # retrying in a loop costs the audit one row a minute, and the selector never waits for it.
        self._on_refused_certificate = on_refused_certificate
        self._refusals_said: dict[tuple[str, str], float] = {}
        self._max = max_connections
        self._header_timeout = header_timeout
        self._idle_timeout = idle_timeout
        self._request_timeout = request_timeout
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kl-serve-worker")
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._incoming: list[Connection] = []
        self._incoming_lock = threading.Lock()
        self._open = 0  # connections held, in the selector or in a worker
        self._open_lock = threading.Lock()
        self._watched: set[Connection] = set()  # the selector thread's own
        self._busy: set[Connection] = set()  # in a worker
        self._busy_lock = threading.Lock()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="kl-serve-connections", daemon=True)
        self._thread.start()

    @property
    def open_connections(self) -> int:
        return self._open

    def add(self, sock: socket.socket, address: tuple[str, int]) -> bool:
        """Take a new connection; False (and it is closed, with a 503 where possible) at the cap."""
        with self._open_lock:
            full = self._open >= self._max
            if not full:
                self._open += 1
        if full:
            if not isinstance(sock, ssl.SSLSocket):  # before a TLS handshake there is no way to say anything
                try:
                    sock.setblocking(False)
                    sock.send(_simple_response("503 Service Unavailable",
                                               "server busy: too many open connections; retry").replace(
                        b"Connection: close\r\n", b"Connection: close\r\nRetry-After: 1\r\n"))
                except OSError:
                    pass
            _close(sock)
            return False
        sock.setblocking(False)
        self._give_back(Connection(sock, address))
        return True

    def _give_back(self, conn: Connection) -> None:
        with self._incoming_lock:
            self._incoming.append(conn)
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is pending already

    def close(self) -> None:
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=5)
        # A worker blocked on a slow client would keep the process alive until its timeout.
        with self._busy_lock:
            busy = list(self._busy)
        for conn in busy:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- the selector thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        last_sweep = time.monotonic()
        try:
            while not self._closing:
                for key, _ in self._selector.select(timeout=0.5):
                    if key.data is None:
                        self._drain_wake()
                    else:
                        self._on_readable(key.data)
                self._take_incoming()
                now = time.monotonic()
                if now - last_sweep >= 0.25:
                    last_sweep = now
                    self._sweep(now)
        finally:
            for conn in list(self._watched):
                self._drop(conn)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _take_incoming(self) -> None:
        with self._incoming_lock:
            batch, self._incoming = self._incoming, []
        for conn in batch:
            conn.idle_since = time.monotonic()
            conn.head_started = time.monotonic() if conn.buffer else None
            if conn.buffer and conn.has_head():
                self._dispatch(conn)
                continue
            try:
                conn.sock.setblocking(False)
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            except (OSError, ValueError):
                self._release(conn)
                continue
            self._watched.add(conn)
            # TLS may already hold decrypted bytes the selector will never signal.
            if isinstance(conn.sock, ssl.SSLSocket) and conn.handshaken and conn.sock.pending():
                self._on_readable(conn)

    def _on_readable(self, conn: Connection) -> None:
        sock = conn.sock
        if not conn.handshaken:
            assert isinstance(sock, ssl.SSLSocket)
            try:
                sock.do_handshake()
                conn.handshaken = True
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except (ssl.SSLError, OSError) as exc:
                refused = tls.refusal(exc) if isinstance(exc, ssl.SSLError) else None
                if refused is not None:  # a client that tried to authenticate: its operator needs to hear why
                    log.warning("TLS handshake with %s: %s", conn.address[0], refused)
                    self._say_refused(conn.address[0], refused)
                else:
                    log.info("TLS handshake with %s failed: %s", conn.address[0], exc)
                self._drop(conn)
                return
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    self._drop(conn)
                    return
                if conn.head_started is None:
                    conn.head_started = time.monotonic()
                conn.buffer += data
                if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                    break
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except OSError:
            self._drop(conn)
            return
        if conn.has_head():
            self._unwatch(conn)
            self._dispatch(conn)
        elif len(conn.buffer) > MAX_HEAD:
            self._refuse(conn, "431 Request Header Fields Too Large",
                         f"request line and headers exceed {MAX_HEAD // 1024} KiB")

    def _say_refused(self, address: str, reason: str) -> None:
        if self._on_refused_certificate is None:
            return
        now = time.monotonic()
        if now - self._refusals_said.get((address, reason), -_REFUSAL_EVERY_S) < _REFUSAL_EVERY_S:
            return
        if len(self._refusals_said) > _REFUSALS_REMEMBERED:
            self._refusals_said = {k: t for k, t in self._refusals_said.items() if now - t < _REFUSAL_EVERY_S}
        self._refusals_said[(address, reason)] = now
        try:
            self._pool.submit(self._on_refused_certificate, address, reason)
        except RuntimeError:  # closing: the log line above is all there is
            pass

    def _sweep(self, now: float) -> None:
        for conn in list(self._watched):
            if conn.head_started is not None:
                if now - conn.head_started > self._header_timeout:
                    self._refuse(conn, "408 Request Timeout",
                                 f"request headers not complete within {self._header_timeout:g}s; closing the connection")
            elif now - conn.idle_since > (self._idle_timeout if conn.served else self._header_timeout):
                self._drop(conn)  # nothing was asked: nothing to answer

    def _refuse(self, conn: Connection, status: str, message: str) -> None:
        if conn.handshaken:
            try:
                conn.sock.send(_simple_response(status, message))
            except (OSError, ssl.SSLError):
                pass
        self._drop(conn)

    def _unwatch(self, conn: Connection) -> None:
        if conn in self._watched:
            self._watched.discard(conn)
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass

    def _drop(self, conn: Connection) -> None:
        self._unwatch(conn)
        _close(conn.sock)
        self._release(conn)

    def _release(self, conn: Connection) -> None:
        with self._open_lock:
            self._open -= 1

    def _dispatch(self, conn: Connection) -> None:
        try:
            self._pool.submit(self._work, conn)
        except RuntimeError:  # shutting down
            _close(conn.sock)
            self._release(conn)

    # --- a worker --------------------------------------------------------------------------------

    def _work(self, conn: Connection) -> None:
        keep = False
        with self._busy_lock:
            self._busy.add(conn)
        try:
            conn.sock.setblocking(True)
            conn.sock.settimeout(self._request_timeout)
            while True:
                keep = self._handle(conn)
                conn.served += 1
                # A pipelined request already read: answer it here rather than going round.
                if not keep or self._closing or not conn.has_head():
                    break
        except Exception:
            log.exception("connection from %s failed", conn.address[0])
            keep = False
        finally:
            with self._busy_lock:
                self._busy.discard(conn)
        if keep and not self._closing:
            self._give_back(conn)
        else:
            _close(conn.sock)
            self._release(conn)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
