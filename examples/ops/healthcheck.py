#!/usr/bin/env python3
"""Health checks for `kl serve` and `kl worker`, for a container's HEALTHCHECK and systemd's
ExecStartPost. Exit 0 when healthy, 1 with one line on stderr saying why not.

    healthcheck.py serve [URL]          kl serve answers GET URL/healthz (it pings the database);
                                        default http://127.0.0.1:8080
    healthcheck.py worker PID           the kl worker process PID on this host is alive in the
                                        fleet: its heartbeat is within its lease (kl fleet status)
    healthcheck.py auto [PID]           whichever of the two PID (default 1: a container's kl) is,
                                        read from its command line (serve: its --listen address)
    --wait SECONDS                      retry until healthy or SECONDS have passed (a service
                                        that is still starting)

KL: how to run kl for `worker` (default: python3 /opt/kilolock/kl.pyz), with the worker's
environment (KL_DATABASE_URL). Standard library only, as kl.pyz needs nothing else.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_KL = "python3 /opt/kilolock/kl.pyz"


class Unhealthy(Exception):
    pass


def check_serve(url: str) -> str:
    target = url.rstrip("/") + "/healthz"
    # A probe of this host's own server: its certificate names the address clients use, not
    # 127.0.0.1, and what is checked is that it answers, not who it is.
    context = ssl._create_unverified_context() if target.startswith("https:") else None
    try:
        with urllib.request.urlopen(target, timeout=10, context=context) as reply:
            body = json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        raise Unhealthy(f"{target} answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise Unhealthy(f"{target}: {getattr(exc, 'reason', exc)}") from None
    if body.get("status") != "ok":
        raise Unhealthy(f"{target} answered {body!r}")
    return f"kl serve healthy at {url}"


def check_worker(pid: int) -> str:
    host = socket.gethostname()
    kl = shlex.split(os.environ.get("KL") or DEFAULT_KL)
    done = subprocess.run([*kl, "fleet", "status", "--format", "json"], check=False, capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise Unhealthy(f"kl fleet status failed: {done.stderr.strip() or done.returncode}")
    workers = json.loads(done.stdout)["workers"]
    mine = [w for w in workers if w["host"] == host and w["pid"] == pid]
    if not mine:
        raise Unhealthy(f"no kl worker with pid {pid} on {host} has registered in the fleet")
    worker = max(mine, key=lambda w: w["id"])  # pids are reused: the newest registration is this process
    if worker["state"] != "alive":
        raise Unhealthy(f"kl worker {worker['name']} is {worker['state']} (last heartbeat {worker['heartbeat_at']})")
    return f"kl worker {worker['name']} alive (heartbeat {worker['heartbeat_at']})"


def command_line(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError as exc:
        raise Unhealthy(f"no process {pid}: {exc.strerror}") from None


def listen_url(args: list[str]) -> str:
    """kl serve's --listen HOST:PORT as a URL to reach it on this host."""
    listen = "127.0.0.1:8080"
    for i, arg in enumerate(args):
        if arg == "--listen" and i + 1 < len(args):
            listen = args[i + 1]
        elif arg.startswith("--listen="):
            listen = arg.split("=", 1)[1]
    host, _, port = listen.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    scheme = "https" if any(a == "--tls-cert" or a.startswith("--tls-cert=") for a in args) else "http"
    return f"{scheme}://{host}:{port}"


def check_auto(pid: int) -> str:
    args = command_line(pid)
    if "serve" in args:
        return check_serve(listen_url(args[args.index("serve") + 1:]))
    if "worker" in args:
        return check_worker(pid)
    raise Unhealthy(f"process {pid} is neither kl serve nor kl worker: {' '.join(args)}")


def check(argv: list[str]) -> str:
    if argv[:1] == ["serve"] and len(argv) <= 2:
        return check_serve(argv[1] if len(argv) == 2 else DEFAULT_URL)
    if argv[:1] == ["worker"] and len(argv) == 2 and argv[1].isdigit():
        return check_worker(int(argv[1]))
    if argv[:1] == ["auto"] and len(argv) <= 2 and (len(argv) == 1 or argv[1].isdigit()):
        return check_auto(int(argv[1]) if len(argv) == 2 else 1)
    raise ValueError("usage: healthcheck.py [--wait SECONDS] serve [URL] | worker PID | auto [PID]")


def main(argv: list[str]) -> int:
    wait = 0.0
    if argv[:1] == ["--wait"] and len(argv) > 1:
        try:
            wait = float(argv[1])
        except ValueError:
            print(f"healthcheck: --wait {argv[1]!r} is not a number of seconds", file=sys.stderr)
            return 1
        argv = argv[2:]
    deadline = time.monotonic() + wait
    while True:
        try:
            print(check(argv))
            return 0
        except ValueError as exc:
            print(f"healthcheck: {exc}", file=sys.stderr)
            return 1
        except Unhealthy as exc:
            if time.monotonic() >= deadline:
                print(f"healthcheck: {exc}", file=sys.stderr)
                return 1
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
