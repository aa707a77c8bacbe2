"""Raw HTTP for the `kl serve` fuzz target: requests built as bytes (so they can lie about their
length, break the framing, carry any header), sent on a fresh socket, and every response on the
stream read back; plus the check of what the database holds afterwards."""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field

import psycopg

from kilolock import tfstate
from kit.states import NULL_PROVIDER


@dataclass
class Answer:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Exchange:
    answers: list[Answer] = field(default_factory=list)
    reset: bool = False  # the server reset the connection (it closed with bytes of ours unread)
    leftover: bytes = b""  # bytes after the last complete answer (must be empty)


def send_raw(address: tuple[str, int], raw: bytes, timeout: float) -> Exchange:
    """Send RAW, half-close, read to EOF. A timeout raises: the server hung on this request.
    An answer to HEAD has a Content-Length but no body (only the first request on the stream counts)."""
    head_request = raw.startswith(b"HEAD ")
    out = Exchange()
    data = bytearray()
    with socket.create_connection(address, timeout=timeout) as sock:
        try:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)  # a body shorter than its Content-Length ends here, not at a timeout
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:  # ENOTCONN: it closed while we sent
            if isinstance(exc, TimeoutError):
                raise
            out.reset = True
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, OSError) as exc:
                if isinstance(exc, TimeoutError):
                    raise
                out.reset = True
                break
            if not chunk:
                break
            data += chunk
    rest = bytes(data)
    while rest:
        parsed = _parse_one(rest, head_request and not out.answers)
        if parsed is None:
            out.leftover = rest
            break
        answer, rest = parsed
        if 100 <= answer.status < 200:  # 100 Continue before the real answer
            continue
        out.answers.append(answer)
    return out


def _parse_one(data: bytes, head_request: bool) -> tuple[Answer, bytes] | None:
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    status = int(parts[1])
    length = int(headers.get("content-length", "0")) if status >= 200 else 0
    if head_request and (not rest or rest.startswith(b"HTTP/")):
        # No body after an answer to HEAD, unless the server failed to read the request line as
        # HEAD at all (an HTTP/0.9 form or a bad version): then it is a plain error with its body.
        length = 0
    if len(rest) < length:
        return None
    return Answer(status, parts[2] if len(parts) > 2 else "", headers, rest[:length]), rest[length:]


def state_doc(serial: int, lineage: str, names: list[str]) -> dict:
    return {"version": 4, "terraform_version": "1.5.7", "serial": serial, "lineage": lineage, "outputs": {},
            "resources": [{"mode": "managed", "type": "null_resource", "name": n, "provider": NULL_PROVIDER,
                           "instances": [{"schema_version": 0, "attributes": {"id": f"{n}-{serial}", "triggers": None},
                                          "sensitive_attributes": []}]} for n in names]}


def stored_versions_problems(db_url: str) -> tuple[int, list[str]]:
    """(versions, problems): every version must parse as a state (or be an encrypted envelope),
    agree with its own serial and lineage columns, and each state's serials rise in write order."""
    problems: list[str] = []
    with psycopg.connect(db_url) as c:
        rows = c.execute(
            """SELECT s.name, v.serial, v.lineage, v.encrypted, kl_version_document(v.id)::text FROM state_versions v
               JOIN states s ON s.id = v.state_id ORDER BY s.name, v.created_at, v.serial""").fetchall()
    last: dict[str, int] = {}
    for name, serial, lineage, encrypted, raw in rows:
        where = f"state {name!r} serial {serial}"
        if name in last and serial <= last[name]:
            problems.append(f"{where}: written after serial {last[name]}")
        last[name] = serial
        doc = json.loads(raw)
        if encrypted:
            if not tfstate.is_encrypted_envelope(doc):
                problems.append(f"{where}: marked encrypted but is not an envelope")
            continue
        try:
            st = tfstate.parse_state(raw.encode(), origin=where)
        except tfstate.StateError as exc:
            problems.append(f"{where}: stored version does not parse: {exc}")
            continue
        if st.serial != serial or st.lineage != lineage:
            problems.append(f"{where}: body says serial {st.serial} lineage {st.lineage!r}, row says {serial} {lineage!r}")
    return len(rows), problems
