"""``kl serve``: checks the listening setup is safe, then runs the HTTP backend until interrupted."""
from __future__ import annotations

import argparse
import getpass
import signal
import ssl
import sys

from kilolock.errors import KlError, UsageError
from kilolock.server import auth as auth_mod
from kilolock.server.backend import BackendPolicy
from kilolock.server.http import KilolockHTTPServer, ServerConfig
from kilolock.server.options import check_exposure, parse_listen, parse_size


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    if not cert and not key:
        return None
    if not (cert and key):
        raise UsageError("--tls-cert and --tls-key go together")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise KlError(f"{exc.filename}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        raise KlError(f"cannot load the TLS certificate {cert} / key {key}: {exc}") from None
    return ctx


def _hash_password() -> int:
    if sys.stdin.isatty():
        pw = getpass.getpass("password: ")
        if pw != getpass.getpass("again: "):
            raise KlError("the passwords differ")
    else:
        pw = sys.stdin.readline().rstrip("\n")
    if not pw:
        raise KlError("empty password")
    print(auth_mod.hash_password(pw))
    return 0


def build_server(args: argparse.Namespace) -> KilolockHTTPServer:
    from kilolock.store import db

    listen = parse_listen(args.listen)
    authenticator = auth_mod.Authenticator.from_config(args.users_file)
    tls = tls_context(args.tls_cert, args.tls_key)
    check_exposure(listen, authenticator.enabled, tls is not None, args.insecure)
    if args.pool_size < 1 or args.max_connections < 1 or args.timeout <= 0:
        raise UsageError("--pool-size and --max-connections must be at least 1, --timeout positive")
    db.open_store().close()  # fail now, with kl's message, if the database is unreachable or not migrated
    url = db.resolve_target().url
    config = ServerConfig(max_body=parse_size(args.max_body), timeout=args.timeout, pool_size=args.pool_size,
                          max_connections=args.max_connections,
                          policy=BackendPolicy(allow_empty_force_unlock=args.allow_force_unlock))
    try:
        return KilolockHTTPServer((listen.host, listen.port), config, authenticator, lambda: db.connect(url), tls)
    except OSError as exc:
        raise KlError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    if args.hash_password:
        return _hash_password()
    server = build_server(args)
    # SIGTERM (systemd, docker stop) ends the loop like Ctrl-C: connections closed, pool released.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"kl serve: Terraform http backend at {server.url}/states/<name>", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
