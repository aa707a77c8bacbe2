"""``kl serve``: checks the listening setup is safe, then runs the HTTP backend until interrupted."""
from __future__ import annotations

import argparse
import getpass
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

from kilolock.cli.commands import CommandContext
from kilolock.errors import KlError, UsageError
from kilolock.server.options import ADMIN_TOKEN_ENV, TOKEN_ENV, check_exposure, parse_listen, parse_size

# The read replica for UI and API pages, when --read-url is not given.
READ_URL_ENV = "KL_READ_DATABASE_URL"

if TYPE_CHECKING:
    import ssl

    from kilolock.server.auth import Authenticator
    from kilolock.server.http import KilolockHTTPServer
    from kilolock.server.options import Listen
    from kilolock.server.tls import TlsFiles


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="address to listen on (default 127.0.0.1:8080)")
    parser.add_argument("--tls-cert", metavar="FILE", help="PEM certificate (chain); serve HTTPS")
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key for --tls-cert")
    parser.add_argument("--client-ca", metavar="FILE",
                        help="PEM CA certificate(s): a client certificate it issued is a credential, the principal "
                             "cert:CN=NAME (kl access grant); SIGHUP reloads it with --tls-cert and --tls-key")
    parser.add_argument("--users-file", metavar="FILE",
                        help=f"HTTP Basic users, NAME:HASH[:admin] per line (hash from --hash-password); "
                             f"tokens come from ${TOKEN_ENV} / ${ADMIN_TOKEN_ENV}")
    parser.add_argument("--allow-force-unlock", action="store_true",
                        help="accept UNLOCK without a lock ID (terraform force-unlock) from any authenticated user")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a non-loopback address without authentication or without TLS")
    parser.add_argument("--max-body", default="512M", metavar="SIZE",
                        help="largest request body, e.g. 512M (default 512M)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="socket timeout per read/write (default 60)")
    parser.add_argument("--max-connections", type=int, default=4096, metavar="N",
                        help="open client connections at once (default 4096; idle ones cost no thread); more get 503")
    parser.add_argument("--workers", type=int, default=32, metavar="N",
                        help="requests answered at once, a thread each (default 32)")
    parser.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="a request's headers must arrive within this (default 10); else 408 and closed")
    parser.add_argument("--pool-size", type=int, default=16, metavar="N", help="database connections (default 16)")
    parser.add_argument("--read-url", metavar="URL", default=None,
                        help=f"a read replica (libpq URL) for the web UI and API pages; writes and Terraform's "
                             f"state reads stay on the primary (default ${READ_URL_ENV})")
    parser.add_argument("--metrics-open-on-loopback", action="store_true",
                        help="serve /metrics without credentials to clients on this host (a local Prometheus); "
                             "other clients and every other path still authenticate")
    parser.add_argument("-q", "--quiet", action="store_true", help="no request log (default: one line per request on stderr)")
    parser.add_argument("--hash-password", action="store_true",
                        help="read a password (prompt, or standard input) and print its hash for --users-file")


def tls_context(files: TlsFiles | None) -> ssl.SSLContext | None:
    from kilolock.server import tls

    return tls.load(files) if files is not None else None


def reload_tls(server: KilolockHTTPServer, files: TlsFiles) -> None:
    """SIGHUP: new handshakes use the files as they are now; connections already open keep theirs.
    Files that do not load leave the current ones in place."""
    from kilolock.server import tls

    try:
        server.tls = tls.load(files)
    except KlError as exc:
        print(f"kl serve: TLS files not reloaded, the current ones stay: {exc}", file=sys.stderr, flush=True)
        return
    print("kl serve: TLS certificate, key" + (" and client CA" if files.client_ca else "") +
          " reloaded: new connections use them", file=sys.stderr, flush=True)


def _hash_password() -> int:
    from kilolock.server import auth as auth_mod

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


def _log_requests() -> None:
    """One line per request on stderr, whatever KL_LOG says (it can still ask for more)."""
    access = logging.getLogger("kilolock.server.access")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kl serve: %(asctime)s %(message)s", "%Y-%m-%dT%H:%M:%S%z"))
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False  # once, not again through the root handler when KL_LOG=info


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def auth_banner(auth: Authenticator, kl_tokens: int, listen: Listen, trusts: int = 0) -> str:
    """The banner's word on authentication: on and with whom, or off and why that is safe."""
    if not auth.enabled:
        where = "loopback only" if listen.loopback else "--insecure: whoever reaches the port is an admin"
        return f"authentication: off ({where}; kl token create turns it on)"
    who = [_n(auth.user_count, "user")] if auth.user_count else []
    if auth.accepts_client_certs:
        who.append("client certificates")
    if auth.env_token_count:
        who.append(_n(auth.env_token_count, "environment token"))
    who.append(_n(kl_tokens, "kl token"))
    if trusts:
        who.append(_n(trusts, "OIDC trust"))
    return f"authentication: on ({', '.join(who)})"


def _cannot_listen(listen: str, exc: OSError) -> KlError:
    words = exc.strerror or str(exc)
    return KlError(f"cannot listen on {listen}: {words[:1].lower()}{words[1:]}")


def build_server(args: argparse.Namespace, context: CommandContext) -> tuple[KilolockHTTPServer, int, int]:
    """The server, bound, and how many usable kl tokens and OIDC trusts the store held at its start."""
    from kilolock.server import auth as auth_mod
    from kilolock.server.backend import BackendPolicy
    from kilolock.server.http import KilolockHTTPServer, ServerConfig
    from kilolock.server.tls import files_from_args
    from kilolock.store import access as access_store
    from kilolock.store import db, oidc_trusts

    listen = parse_listen(args.listen)
    authenticator = auth_mod.Authenticator.from_config(args.users_file)
    tls_files = files_from_args(args.tls_cert, args.tls_key, args.client_ca)
    tls = tls_context(tls_files)
    if tls_files is not None and tls_files.client_ca:
        authenticator.accept_client_certs()
    if args.pool_size < 1 or args.max_connections < 1 or args.workers < 1 or args.timeout <= 0 or args.header_timeout <= 0:
        raise UsageError("--pool-size, --max-connections and --workers must be at least 1, --timeout and --header-timeout positive")
    context.open_store().close()  # fail now, with kl's message, if the database is unreachable or not migrated
    url = db.resolve_target().url
    with db.connect(url) as conn:
        # kl token create's tokens are credentials once one exists: until then a server without
        # --users-file or $KL_SERVE_TOKEN stays the open loopback default (and TokenWatch looks
        # for the first one while it runs).
        kl_tokens = access_store.count_usable_tokens(conn)
        trusts = oidc_trusts.count_trusts(conn)
    if kl_tokens or trusts:
        authenticator.accept_kl_tokens()
    check_exposure(listen, authenticator.enabled, tls is not None, args.insecure)
    config = ServerConfig(max_body=parse_size(args.max_body), timeout=args.timeout, pool_size=args.pool_size,
                          max_connections=args.max_connections, workers=args.workers,
                          header_timeout=args.header_timeout, metrics_open_on_loopback=args.metrics_open_on_loopback,
                          policy=BackendPolicy(allow_empty_force_unlock=args.allow_force_unlock))
    read_url = replica_url(args)
    try:
        server = KilolockHTTPServer((listen.host, listen.port), config, authenticator, lambda: db.connect(url), tls,
                                    read_connect=(lambda: db.connect(read_url)) if read_url else None)
        server.tls_files = tls_files
        if read_url:
            server.replica_said = db.Target(url=read_url, embedded=False).describe()
    except OSError as exc:  # the port is taken, a low port without the right, an address not on this host
        raise _cannot_listen(args.listen, exc) from None
    return server, kl_tokens, trusts


def replica_url(args: argparse.Namespace) -> str | None:
    """--read-url (or $KL_READ_DATABASE_URL), checked now: it must reach a database with kl's schema."""
    from kilolock.store import db
    from kilolock.store.migrate import pending_migrations

    url = args.read_url or os.environ.get(READ_URL_ENV) or None
    if url is None:
        return None
    where = "--read-url" if args.read_url else f"${READ_URL_ENV}"
    try:
        with db.connect(url) as conn:
            pending = pending_migrations(conn)
    except KlError as exc:
        raise KlError(f"{where}: {exc}") from None
    if pending:
        raise KlError(f"{where}: the replica's schema is not current ({len(pending)} pending migration(s)): "
                      "is it a replica of this database?")
    return url


def run(args: argparse.Namespace, context: CommandContext) -> int:
    if args.hash_password:
        return _hash_password()

    server, kl_tokens, trusts = build_server(args, context)
    if not args.quiet:
        _log_requests()
    # SIGTERM (systemd, docker stop) ends the loop like Ctrl-C: connections closed, pool released.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    tls_files = server.tls_files
    if tls_files is not None:
        # Runs on the thread that accepts (and wraps) connections, so no handshake sees half a swap.
        signal.signal(signal.SIGHUP, lambda _sig, _frame: reload_tls(server, tls_files))
    print(f"kl serve: Terraform http backend at {server.url}/states/<name>, web UI at {server.url}/ui/, "
          f"Prometheus metrics at {server.url}/metrics", file=sys.stderr, flush=True)
    print(f"kl serve: {auth_banner(server.auth, kl_tokens, parse_listen(args.listen), trusts)}", file=sys.stderr, flush=True)
    if server.replica:
        print(f"kl serve: web UI and API pages read from the replica {server.replica_said}, each saying "
              "how far behind the primary it was; writes and Terraform's state reads go to the primary",
              file=sys.stderr, flush=True)
    from kilolock.notify.deliver import Background
    from kilolock.server.tokenwatch import TokenWatch
    from kilolock.store import db, notify

    url = db.resolve_target().url
    sender = Background(lambda: db.connect(url))  # what this server's writes (and others') leave to send
    sender.start()
    was_enabled = server.auth.enabled

    def accepted(what: str) -> None:
        made = "a kl token exists (kl token create)" if what == "token" else "an OIDC trust exists (kl access trust oidc)"
        print(f"kl serve: authentication: on from now: {made}; every request needs credentials" if not was_enabled
              else f"kl serve: kl tokens are accepted from now ({'kl token create made one' if what == 'token' else made})",
              file=sys.stderr, flush=True)

    watch = TokenWatch(server.auth, server.pool.connection, accepted)
    watch.start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        watch.stop()
        sender.stop()
        notify.hand_over()
        server.server_close()
    return 0
