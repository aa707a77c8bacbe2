"""Fuzzing `kl serve`: a real server (in a thread, as tests/server does) on a real PostgreSQL
database, sent raw requests with random methods, paths and state names, headers (lying
Content-Length, garbage Content-MD5 and Authorization, chunked framing), bodies (random bytes and
JSON, damaged states, LockInfo) and ?ID= values.

Every answer must be a status below 500 (4xx for bad input), with two exceptions the HTTP spec
defines for exactly this input: 501 for a method or transfer coding the server does not implement
and 505 for an HTTP version it does not speak. No answer may carry a traceback, no request may
hang, the server must log no traceback and answer /healthz afterwards, and the database must hold
only versions that parse, with serials rising per state.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kit.fuzz import FUZZ, RecordProperty, Tally, hang_guard, one_in
from kit.fuzzhttp import Exchange, send_raw, state_doc, stored_versions_problems

if TYPE_CHECKING:  # the server module is imported inside the fixture, where it is used
    from kilolock.server.http import KilolockHTTPServer

    Server = tuple[KilolockHTTPServer, threading.Thread]

TOKEN, ADMIN = "fuzz-token", "fuzz-admin-token"
MAX_BODY = 64 * 1024
CLIENT_TIMEOUT = 20.0  # a request that gets no complete answer in this long is a hang
ALLOWED_5XX = {501, 505}

# A few names reused on purpose, so writes, locks and deletes meet on the same states.
NAMES = ["prod", "team/dev", "a.b-c_d@e+f=g", "x", "y", "z/1", "w", "v"]
LOCK_IDS = ["lock-a", "lock-b", "", " ", "x" * 300, "\u00e9t\u00e9", "a\tb"]
LINEAGES = ["lin-1", "lin-2"]
# Half the generated states carry this serial, which the test replaces on the wire by the next
# number of a counter (same width, so Content-Length stays true): states that advance get stored,
# and later requests meet a store with history, locks and conflicts.
NEXT_SERIAL = 9999999

METHODS = ["GET", "POST", "PUT", "DELETE", "LOCK", "UNLOCK", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT",
           "get", "Lock", "PROPFIND", "", "G\u00c9T", "GET GET", "\x00", "X" * 300]
HTTP_VERSIONS = ["HTTP/1.1"] * 8 + ["HTTP/1.0", "HTTP/2.0", "HTTP/0.9", "HTTP/1.1.1", "HTTPS/1.1", "HTTP/a.b", ""]

# --- pieces of a request ------------------------------------------------------------------------------

name_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


@st.composite
def state_name(draw: st.DrawFn) -> str:
    """The part after /states/, as it goes on the wire (percent-escapes included)."""
    if not one_in(draw, 3):
        return draw(st.sampled_from(NAMES))
    kind = draw(st.sampled_from(range(3, 8)))
    if kind == 3:
        return draw(st.sampled_from(["", ".", "..", "../../etc/passwd", "a/../b", "a//b", "a/", "/a", "%2e%2e", "a%2Fb",
                                     "%ff", "%c3%28", "%", "%zz", "%00", "a%0a", "prod%20x", "%e2%82%ac", "-a", "_a",
                                     "a b", "a?b", "a#b", "a;b", "a\\b", "\u00e9", "\U0001f600", "a" * 255, "a" * 256,
                                     "a" * 5000, "a/" * 200 + "a", "%41" * 300]))
    if kind == 4:  # unicode, percent-encoded as a client would
        return "".join(f"%{b:02X}" for b in draw(name_text).encode())
    if kind == 5:  # unicode sent raw (the request line is then not ASCII)
        return draw(name_text)
    if kind == 6:
        return draw(st.text(alphabet="ab/.%2F5e-_@+=~!$&'()*,;:", max_size=20))
    return draw(st.sampled_from(NAMES)) + draw(st.sampled_from(["/", "/x", "%2F", "/..", "/.", "%00"]))


@st.composite
def request_target(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(range(15)))
    if kind <= 10:
        target = "/states/" + draw(state_name())
    elif kind == 11:
        target = draw(st.sampled_from(["/healthz", "/healthz/", "/", "*", "", "/states", "/states/", "/api/v1/states",
                                       "/api/v1/states/", "/api/v1/", "/api/v1/nope", "http://h/states/prod", "//states/prod",
                                       "/STATES/prod", "/states/prod/../x", "/api/v1/states/prod/versions/x"]))
    elif kind == 12:
        target = "/api/v1/states/" + draw(state_name()) + draw(st.sampled_from(["/versions", "/drift", "", "/x"]))
    elif kind == 13:
        target = draw(st.text(max_size=30))
    else:
        target = "/" + "a" * draw(st.integers(1000, 70000))
    if one_in(draw, 3):
        ids = st.sampled_from(LOCK_IDS) | st.text(max_size=10)
        query = draw(st.sampled_from(["ID={}", "ID={}&ID=other", "id={}", "ID", "ID=", "{}", "ID={}&x=%zz", "ID=%ff{}"]))
        target += "?" + query.format(draw(ids).replace(" ", "%20").replace("\t", "%09"))
    return target


ODD_LOCK_VALUES = [float("nan"), float("inf"), -float("inf"), "a\x00b", "\x00", "\u202e", "\U0001f512", "x" * 5000,
                   {"nested": float("nan")}, ["\x00"], 10**400]
LOCK_KEYS = ["ID", "Operation", "Info", "Who", "Version", "Created", "Path"]
# floats() includes NaN and ±inf, which json.dumps writes as NaN/Infinity (not JSON, but Python accepts them).
scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=8)


@st.composite
def lock_info(draw: st.DrawFn) -> bytes:
    doc: dict[str, Any] = {"ID": draw(st.sampled_from(["lock-a", "lock-b"]) if draw(st.booleans()) else st.sampled_from(LOCK_IDS)), "Operation": "OperationTypeApply", "Info": "",
                           "Who": draw(st.sampled_from(["alice@h", "", "bob"])), "Version": "1.5.7",
                           "Created": "2026-11-29T12:00:00Z", "Path": ""}
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(LOCK_KEYS + ["extra"]))
        action = draw(st.sampled_from(["drop", "any", "odd", "odd"]))
        if action == "drop":
            doc.pop(key, None)
        else:  # NaN, infinities and NUL parse in Python but PostgreSQL's jsonb refuses them
            doc[key] = draw(json_values) if action == "any" else draw(st.sampled_from(ODD_LOCK_VALUES))
    return json.dumps(doc).encode()


@st.composite
def state_body(draw: st.DrawFn) -> bytes:
    serial = NEXT_SERIAL if not one_in(draw, 4) else draw(st.integers(0, 60))
    doc = state_doc(serial, LINEAGES[1] if one_in(draw, 6) else LINEAGES[0],  # another lineage: 409 unless empty
                    draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3)))
    damage = draw(st.sampled_from(range(14)))  # 1-4 damage it; the rest stay valid
    if damage == 1:  # a top-level or instance key replaced or removed
        target = draw(st.sampled_from(["top", "resource", "instance"])) if doc["resources"] else "top"
        obj = doc if target == "top" else doc["resources"][0] if target == "resource" else doc["resources"][0]["instances"][0]
        key = draw(st.sampled_from(sorted(obj)))
        if draw(st.booleans()):
            del obj[key]
        else:
            obj[key] = draw(json_values)
    elif damage == 2:  # OpenTofu's encrypted envelope, well- or ill-formed
        doc = {"encryption_version": draw(st.sampled_from(["v0", 0, None])), "encrypted_data": draw(st.sampled_from(["AAAA", "", 5])),
               "meta": {"key_provider.pbkdf2.x": "e30="}}
    elif damage == 3:  # a huge or odd serial / lineage
        doc["serial"] = draw(st.sampled_from([2**63, -1, 1.5, "3", 10**30, True, None]))
    elif damage == 4 and doc["resources"]:  # an attribute nested deep (json.loads stops near 1,000)
        depth = draw(st.sampled_from([60, 130, 300, 600, 900]))
        doc["resources"][0]["instances"][0]["attributes"]["deep"] = json.loads("[" * depth + "]" * depth)
    text = json.dumps(doc)
    if one_in(draw, 10):  # cut or flipped bytes
        raw = bytearray(text.encode())
        pos = draw(st.integers(0, len(raw) - 1))
        return bytes(raw[:pos]) if draw(st.booleans()) else bytes(raw[:pos]) + bytes([draw(st.integers(0, 255))]) + bytes(raw[pos + 1:])
    return text.encode()


@st.composite
def body(draw: st.DrawFn, method: str) -> bytes:
    """Mostly the body the method expects (so requests reach the store), else anything."""
    kind = draw(st.sampled_from(range(10)))
    if kind <= 6 and method in ("LOCK", "UNLOCK"):
        return draw(lock_info())
    if kind <= 6:
        return draw(state_body())
    if kind == 7:
        return json.dumps(draw(json_values)).encode() if draw(st.booleans()) else draw(st.binary(max_size=200))
    if kind == 8:
        return b""
    return draw(st.sampled_from([b"null", b"[]", b"{}", b'"x"', b"1e999", b'{"serial": NaN}', b"\xef\xbb\xbf{}", b"{" * 5000,
                                 b'{"version":4,"serial":1,"lineage":"l","resources":[' + b"[" * 3000 + b"]" * 3000 + b"]}"]))


def _auth(draw: st.DrawFn) -> str | None:
    kind = draw(st.sampled_from(range(12)))
    if kind <= 6:
        return f"Bearer {ADMIN}"
    if kind == 7:
        return f"Bearer {TOKEN}"
    if kind == 8:
        return "Basic " + base64.b64encode(f"someone:{draw(st.sampled_from([TOKEN, ADMIN]))}".encode()).decode()
    if kind == 9:
        return None
    return draw(st.sampled_from(["Bearer", "Bearer ", "Basic", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode(),
                                 "Basic " + base64.b64encode(b"\xff\xfe:x").decode(), "Digest x", "bearer " + ADMIN,
                                 "Bearer " + ADMIN + "x", "\u00e9", "Basic " + "A" * 2000]) | st.text(max_size=20))


@st.composite
def http_request(draw: st.DrawFn) -> tuple[bytes, dict[str, Any]]:
    """(raw request bytes, a description for failure messages)."""
    pick = draw(st.sampled_from(range(20)))
    if pick < 16:  # mostly what the backend serves, so requests get past the framing
        method = draw(st.sampled_from(["POST"] * 4 + ["PUT", "GET", "LOCK", "LOCK", "UNLOCK", "UNLOCK"]))
    elif pick == 16:
        method = "DELETE"  # rarer: it drops a state's whole history
    elif pick < 19:
        method = draw(st.sampled_from(METHODS))
    else:
        method = draw(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ-", min_size=1, max_size=8))
    target = draw(request_target())
    if method in ("POST", "PUT", "DELETE") and "?" not in target and target.startswith("/states/"):
        lock_id = draw(st.sampled_from(["", "", "", "lock-a", "lock-b"]))  # the usual holders' IDs, or none
        target += f"?ID={lock_id}" if lock_id else ""
    version = draw(st.sampled_from(HTTP_VERSIONS)) if one_in(draw, 12) else "HTTP/1.1"
    payload = draw(body(method))
    headers: list[tuple[str, str]] = [("Host", "127.0.0.1")]
    auth = _auth(draw)
    if auth is not None:
        headers.append(("Authorization", auth))
    framing = draw(st.sampled_from(range(20)))
    if framing <= 13:
        headers.append(("Content-Length", str(len(payload))))
    elif framing in (14, 15):  # a lie
        lie = draw(st.sampled_from([len(payload) + 1, len(payload) + 1000, max(0, len(payload) - 1), 0, MAX_BODY + 1, 10**20]))
        headers.append(("Content-Length", str(lie)))
    elif framing == 16:
        headers.append(("Content-Length", draw(st.sampled_from(["-1", "abc", "", "1e3", "0x10", " 5", "5, 5", "\u0665"]))))
        if draw(st.booleans()):
            headers.append(("Content-Length", str(len(payload))))
    elif framing in (17, 18):
        headers.append(("Transfer-Encoding", draw(st.sampled_from(["chunked", "Chunked", "gzip", "chunked, gzip", "identity"]))))
        if draw(st.booleans()) and payload:
            cut = draw(st.integers(0, len(payload)))
            payload = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in (payload[:cut], payload[cut:]) if p) + b"0\r\n\r\n"
        elif draw(st.booleans()):
            payload = draw(st.sampled_from([b"zz\r\n", b"5\r\nab", b"ffffffffffffffffff\r\n", b"-1\r\n", b"3\r\nabcXX0\r\n\r\n",
                                            b"0\r\n", b"1;ext=1\r\na\r\n0\r\nTrailer: x\r\n\r\n"]))
    # framing 19: no length at all (a body then follows as the next "request")
    if one_in(draw, 4):
        md5 = base64.b64encode(hashlib.md5(payload).digest()).decode()
        headers.append(("Content-MD5", draw(st.sampled_from([md5, md5[:-2], "!!", "", "AAAA", base64.b64encode(b"x" * 16).decode(),
                                                             " " + md5 + " ", md5 + "=="]))))
    for _ in range(draw(st.integers(1, 2)) if one_in(draw, 6) else 0):
        headers.append(draw(st.sampled_from([("Expect", "100-continue"), ("Connection", "close"), ("Connection", "keep-alive"),
                                             ("X-Junk", "\u00e9\u00e9"), ("", "empty-name"), ("Bad Header", "x"),
                                             ("X-Long", "v" * 70000), ("Content-Type", "application/json")])))
    if one_in(draw, 60):
        headers.extend(("X-Many", str(n)) for n in range(120))
    head = f"{method} {target} {version}".rstrip() + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    raw = head.encode("utf-8", "surrogatepass") + payload
    return raw, {"method": method, "target": target[:200], "version": version, "headers": [(k, v[:80]) for k, v in headers[:12]],
                 "body": payload[:200]}


@st.composite
def backend_request(draw: st.DrawFn) -> tuple[bytes, dict[str, Any]]:
    """A well-framed request of Terraform's protocol with random content: random method of the
    backend, state, ?ID=, credential, body and Content-MD5, so most reach the store."""
    method = draw(st.sampled_from(["POST", "POST", "PUT", "LOCK", "LOCK", "UNLOCK", "UNLOCK", "GET", "DELETE", "API"]))
    name = draw(st.sampled_from(NAMES)) if not one_in(draw, 5) else draw(state_name())
    if method == "API":
        method, target = "GET", "/api/v1/states" + draw(st.sampled_from(["", f"/{name}/versions", f"/{name}/drift"]))
    else:
        target = f"/states/{name}"
    if method in ("POST", "PUT", "DELETE"):
        lock_id = draw(st.sampled_from(["", "", "lock-a", "lock-b"]) | st.sampled_from(LOCK_IDS))
        target += f"?ID={lock_id.replace(' ', '%20').replace(chr(9), '%09')}" if lock_id else ""
    if method == "UNLOCK" and one_in(draw, 4):
        payload = b""  # Terraform's force-unlock
    else:
        payload = draw(body(method))
    auth = f"Bearer {ADMIN}" if not one_in(draw, 5) else _auth(draw)
    headers = [("Host", "127.0.0.1"), ("Content-Length", str(len(payload)))]
    if auth is not None:
        headers.append(("Authorization", auth))
    if one_in(draw, 3):
        md5 = base64.b64encode(hashlib.md5(payload).digest()).decode()
        headers.append(("Content-MD5", md5 if draw(st.booleans()) else draw(st.sampled_from(["!!", "", "AAAA", md5[::-1]]))))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode("utf-8", "surrogatepass") + payload, {"method": method, "target": target, "headers": headers, "body": payload[:300]}


# --- checking one exchange ----------------------------------------------------------------------------


def check_exchange(ex: Exchange, raw: bytes, what: dict[str, Any], tally: Tally) -> None:
    for n, a in enumerate(ex.answers):
        bodiless = n == 0 and raw.startswith(b"HEAD ")  # an answer to HEAD has headers only
        assert a.status < 500 or a.status in ALLOWED_5XX, f"{a.status} {a.body[:300]!r} for {what}"
        assert b"Traceback" not in a.body and b"internal error" not in a.body, f"{a.status} {a.body[:500]!r} for {what}"
        if a.headers.get("content-type", "").startswith("text/plain") and a.status >= 400 and not bodiless:
            msg = a.body.decode("utf-8", "replace")
            assert msg.endswith("\n") and msg.count("\n") == 1 and msg.strip(), f"{a.status} not one line: {msg!r} for {what}"
    assert not ex.leftover, f"unparseable bytes after the answers: {ex.leftover[:200]!r} for {what}"
    if not ex.answers:
        # Only a request line that is blank, or a connection the server reset after answering, may
        # end without an answer we can read.
        assert ex.reset or not raw.split(b"\r\n", 1)[0].strip(), f"no answer for {what}"
        tally.count("no answer (reset)" if ex.reset else "no answer (blank request)")
    else:
        first = ex.answers[0]
        stored = first.status == 200 and b": stored " in first.body
        tally.count("200 stored a version" if stored else str(first.status))


def check_read_back(address: tuple[str, int], raw: bytes, answer: bytes) -> None:
    """What the server stored, it must serve: GET answers 200 with that serial and a true Content-MD5."""
    target = raw.split(b" ", 2)[1].split(b"?", 1)[0]
    auth = b"Authorization: Bearer " + ADMIN.encode()
    ex = send_raw(address, b"GET " + target + b" HTTP/1.1\r\nHost: h\r\n" + auth + b"\r\n\r\n", CLIENT_TIMEOUT)
    assert [a.status for a in ex.answers] == [200], f"{answer!r}, then GET {target!r}: {ex.answers}"
    got = ex.answers[0]
    assert got.headers["content-md5"] == base64.b64encode(hashlib.md5(got.body).digest()).decode()
    serial = int(answer.rsplit(b" serial ", 1)[1])
    doc = json.loads(got.body)
    assert "encryption_version" in doc or doc["serial"] == serial, (answer, got.body[:300])


class _LogSink(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server(db_url: str) -> Iterator[Server]:
    from kilolock.server.auth import Authenticator
    from kilolock.server.http import KilolockHTTPServer, ServerConfig, serve_in_thread
    from kilolock.store import db

    cfg = ServerConfig(max_body=MAX_BODY, timeout=10.0, pool_size=4)
    srv = KilolockHTTPServer(("127.0.0.1", 0), cfg, Authenticator(token=TOKEN, admin_token=ADMIN), lambda: db.connect(db_url))
    thread = serve_in_thread(srv)
    yield srv, thread
    srv.shutdown()
    srv.server_close()


def _request(method: str, target: str, payload: bytes) -> tuple[bytes, dict[str, Any]]:
    head = f"{method} {target} HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer {ADMIN}\r\nContent-Length: {len(payload)}\r\n\r\n"
    return head.encode() + payload, {"method": method, "target": target, "body": payload[:300]}


def _deep_state(depth: int) -> bytes:
    doc = state_doc(NEXT_SERIAL, "lin-deep", ["a"])
    doc["resources"][0]["instances"][0]["attributes"]["deep"] = json.loads("[" * depth + "]" * depth)
    return json.dumps(doc).encode()


# Found by these targets (each was a 500 "internal error"): a LockInfo nested too deep for
# json.loads (RecursionError), and one holding NaN, an infinity or a NUL character, which
# PostgreSQL's jsonb refuses at the INSERT; and a state nested a few hundred levels deep, which was
# stored but could then never be read back (GET and `kl state pull` recursed out).
REGRESSIONS = [
    (400, _request("LOCK", "/states/deep", b'{"ID":"d","x":' + b"[" * 5000 + b"]" * 5000 + b"}")),
    (400, _request("LOCK", "/states/nan", b'{"ID":"n","Operation":"OperationTypeApply","Who":"w","extra":NaN}')),
    (400, _request("LOCK", "/states/inf", b'{"ID":"i","extra":1e999}')),
    (400, _request("LOCK", "/states/nul", b'{"ID":"z","Info":"a\\u0000b"}')),
    (400, _request("POST", "/states/deepstate", _deep_state(600))),
    (200, _request("POST", "/states/deepstate", _deep_state(100))),  # deep but within the limit: stored and served
]


def _fuzz_server(server: Server, db_url: str, capfd: pytest.CaptureFixture[str], strategy: st.SearchStrategy[tuple[bytes, dict[str, Any]]],
                 tally: Tally) -> int:
    """Send every generated request and check it; then the server's health, its log and stderr,
    and what the database holds. Returns the number of versions left in the database."""
    srv, thread = server
    host, port = srv.server_address[:2]
    assert isinstance(host, str)  # an AF_INET server bound to "127.0.0.1": its host is that string
    address = (host, port)
    sink = _LogSink()
    logger = logging.getLogger("kilolock")
    logger.addHandler(sink)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    serials = [NEXT_SERIAL - 100000 * 9]  # 7 digits for the whole run, like NEXT_SERIAL

    def run_one(req: tuple[bytes, dict[str, Any]]) -> Exchange:
        raw, what = req
        serials[0] += 1
        raw = raw.replace(b'"serial": %d' % NEXT_SERIAL, b'"serial": %d' % serials[0])
        start = time.monotonic()
        ex = send_raw(address, raw, CLIENT_TIMEOUT)
        tally.timed(time.monotonic() - start)
        check_exchange(ex, raw, what, tally)
        if ex.answers and ex.answers[0].status == 200 and b": stored " in ex.answers[0].body:
            check_read_back(address, raw, ex.answers[0].body)
        return ex

    @FUZZ
    @given(strategy)
    def run(req: tuple[bytes, dict[str, Any]]) -> None:
        run_one(req)

    try:
        for status, req in REGRESSIONS:
            answers = run_one(req).answers
            assert [a.status for a in answers] == [status], (req[1], answers)
        with hang_guard():
            run()
    finally:
        logger.removeHandler(sink)
        logger.setLevel(old_level)

    assert thread.is_alive(), "the server thread died"
    health = send_raw(address, b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n", CLIENT_TIMEOUT)
    assert [a.status for a in health.answers] == [200], health
    logged_tracebacks = [r for r in sink.records if r.exc_info or "Traceback" in r.getMessage() or r.levelno >= logging.ERROR]
    assert not logged_tracebacks, [f"{r.levelname} {r.getMessage()}" for r in logged_tracebacks[:5]]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err[-3000:]

    versions, problems = stored_versions_problems(db_url)
    assert not problems, problems[:10]
    print(f"FUZZ {tally.target}: {versions} versions left in the database afterwards, all parse")
    return versions


def test_fuzz_http_protocol_junk(server: Server, db_url: str, capfd: pytest.CaptureFixture[str], record_property: RecordProperty) -> None:
    """Anything on the wire: bad methods, versions, paths, framing, headers, credentials."""
    tally = Tally("kl serve protocol: random raw HTTP requests (framing, methods, paths, headers)")
    _fuzz_server(server, db_url, capfd, http_request(), tally)
    # The property must not hold by everything being refused at the door.
    assert sum(n for k, n in tally.outcomes.items() if k.startswith("2")) >= 50, tally.report()
    tally.finish(record_property)


def test_fuzz_http_backend(server: Server, db_url: str, capfd: pytest.CaptureFixture[str], record_property: RecordProperty) -> None:
    """Well-framed Terraform requests with random content: states, LockInfo, ?ID=, Content-MD5."""
    tally = Tally("kl serve backend: well-framed requests with random states, LockInfo, ?ID=, credentials")
    _fuzz_server(server, db_url, capfd, backend_request(), tally)
    assert tally.outcomes.get("200 stored a version", 0) >= 25, tally.report()
    assert tally.outcomes.get("200", 0) >= 100, tally.report()  # locks, unlocks, reads
    tally.finish(record_property)
