"""Nobody keeps everyone out (issue 20): idle and slow-header connections are held by one selector
thread, not a thread each, so a real Terraform client is served while 1,000 of them are open; a
head that does not complete in time gets 408, a connection that never starts one is closed."""
from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from kit.tfcli import Workspace, tool_binary

IDLE, SLOW = 500, 500


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def test_terraform_is_served_while_1000_idle_and_slow_header_connections_are_open(start_server, db_url, tmp_path: Path):
    # Deadlines longer than the test, so all 1,000 stay open while Terraform runs.
    srv = start_server(timeout=300.0, header_timeout=300.0)
    address = _address(srv.url)
    held: list[socket.socket] = []
    try:
        for _ in range(IDLE):  # connected, nothing sent
            held.append(socket.create_connection(address))
        for i in range(SLOW):  # a head begun and never finished
            s = socket.create_connection(address)
            s.sendall(f"GET /states/slow{i} HTTP/1.1\r\nHost: kl\r\nX-Slow: ".encode())
            held.append(s)
        deadline = time.monotonic() + 30
        while srv.server.connections.open_connections < IDLE + SLOW:
            assert time.monotonic() < deadline, srv.server.connections.open_connections
            time.sleep(0.05)

        d = tmp_path / "ws"
        d.mkdir()
        ws = Workspace("terraform-1.8.5", tool_binary("terraform-1.8.5"), d, f"{srv.url}/states/busy")
        ws.write('resource "null_resource" "a" { triggers = { v = "1" } }\n')
        ws.run("init", "-input=false", "-no-color")
        ws.run("apply", "-auto-approve", "-input=false", "-no-color")
        for s in held[IDLE:IDLE + 10]:  # the slow heads are still being waited for, a byte at a time
            s.sendall(b"x")
        assert ws.run("plan", "-detailed-exitcode", "-input=false", "-no-color", check=False).returncode == 0
        assert srv.request("GET", "/api/v1/states").json()["states"][0]["name"] == "busy"
        # Every one of the 1,000 is still open: none was dropped to make room.
        assert srv.server.connections.open_connections >= IDLE + SLOW
    finally:
        for s in held:
            s.close()


def test_slow_head_gets_408_and_a_silent_connection_is_closed(start_server):
    srv = start_server(header_timeout=1.0, timeout=30.0)
    address = _address(srv.url)
    with socket.create_connection(address, timeout=20) as slow, socket.create_connection(address, timeout=20) as silent:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: kl\r\n")  # no blank line: the head never ends
        answer = slow.recv(1000)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"headers not complete within 1s" in answer
        assert slow.recv(100) == b""
        assert silent.recv(100) == b""  # closed without a word: it never asked anything
    # A kept-alive connection is not held to the header deadline between requests.
    with socket.create_connection(address, timeout=20) as kept:
        for _ in range(2):
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: kl\r\n\r\n")
            assert kept.recv(1000).startswith(b"HTTP/1.1 200 ")
            time.sleep(1.5)


@pytest.mark.parametrize("pipelined", [1, 3])
def test_pipelined_requests_on_one_connection(start_server, pipelined):
    srv = start_server()
    with socket.create_connection(_address(srv.url), timeout=20) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: kl\r\n\r\n" * pipelined)
        data = b""
        while data.count(b"HTTP/1.1 200 ") < pipelined:
            chunk = s.recv(65536)
            assert chunk, data
            data += chunk
    assert data.count(b'{"status": "ok"}') == pipelined


def test_open_files_limit_is_raised_where_allowed():
    import resource

    from kilolock.server.conns import raise_open_files_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
        got = raise_open_files_limit(4096)
        assert got == min(4096, hard) == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
