"""``kl access grant|revoke|list|check|log`` and ``kl token create|list|revoke``: who may do what to
which state through ``kl serve`` (kilolock.server.access has the rules).

Grants and tokens are managed from the command line only: whoever runs kl against the database
holds its credentials, and so is an operator (no kl serve request can change a grant)."""
from __future__ import annotations

import argparse
import os
import re
import sys

from kilolock import globs
from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext
from kilolock.errors import KlError, UsageError

ROLES = ("read", "write", "admin")
_ROLE_HELP = "read (GET, drift, API, UI, lock/unlock its own lock for a plan), write (+ POST, any lock), admin (+ DELETE, force-unlock)"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]*")


_PRINCIPALS = "user:NAME, token:NAME, cert:CN=NAME or oidc:TRUST:SUB-GLOB"
_TRUST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def principal(text: str) -> str:
    """``user:NAME`` (a kl serve --users-file user), ``token:NAME`` (kl token create) or
    ``cert:CN=NAME`` (a client certificate, kl serve --client-ca) or ``oidc:TRUST:SUB-GLOB`` (the
    JWTs of a trusted issuer whose sub the glob matches); a bare NAME is a user."""
    cli_args.utf8_text(text)
    kind, sep, name = text.partition(":")
    if not sep:
        kind, name = "user", text
    if kind not in ("user", "token", "cert", "oidc"):
        raise argparse.ArgumentTypeError(f"{text!r}: a principal is {_PRINCIPALS}")
    if kind == "cert":
        if not name.startswith("CN=") or name == "CN=":
            raise argparse.ArgumentTypeError(f"{text!r}: a client certificate principal is cert:CN=NAME, "
                                             "NAME its subject's common name")
        if any(not c.isprintable() for c in name):
            raise argparse.ArgumentTypeError(f"{text!r}: the common name holds a character that cannot be printed")
        return f"cert:{name}"
    if kind == "oidc":
        trust, sep, sub_glob = name.partition(":")
        if not sep or not _TRUST_NAME.fullmatch(trust) or not sub_glob:
            raise argparse.ArgumentTypeError(f"{text!r}: an OIDC principal is oidc:TRUST:SUB-GLOB, TRUST a name from "
                                             "`kl access trust list`, e.g. 'oidc:github:repo:acme/infra:ref:refs/heads/main'")
        if any(c.isspace() or not c.isprintable() for c in sub_glob):
            raise argparse.ArgumentTypeError(f"{text!r}: the sub glob must not hold spaces or unprintable characters")
        return f"oidc:{trust}:{sub_glob}"
    if not name or any(c.isspace() or not c.isprintable() or c == ":" for c in name):
        raise argparse.ArgumentTypeError(f"{text!r}: the name after {kind}: must be non-empty, without spaces or ':'")
    return f"{kind}:{name}"


def token_name(text: str) -> str:
    cli_args.utf8_text(text)
    if not _NAME.fullmatch(text) or len(text) > 100:
        raise argparse.ArgumentTypeError(f"{text!r}: a token name is letters, digits and _.@- (starting with a letter "
                                         "or digit), at most 100 characters")
    return text


def _add_role_states(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--role", required=True, choices=ROLES, help=_ROLE_HELP)
    parser.add_argument("--states", metavar="GLOB", required=True, type=cli_args.state_glob,
                        help="states whose name matches: * within one /-separated segment, ** across")


def _add_actor(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who makes the change, for the audit (default: $USER@cli)")


# --- kl access ------------------------------------------------------------------------------------

def add_grant_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("principal", type=principal, metavar="PRINCIPAL",
                        help="user:NAME (a --users-file user; a bare NAME is a user), token:NAME, cert:CN=NAME "
                             "(a client certificate's common name, kl serve --client-ca) or oidc:TRUST:SUB-GLOB "
                             "(JWTs of a trusted issuer: * within a ':'-separated part of sub, ** across)")
    _add_role_states(parser)
    _add_actor(parser)


def run_grant(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import access

    with context.open_store() as conn:
        grant_id, before = access.add_grant(conn, args.principal, args.role, args.states, args.actor or cli_args.default_actor())
    change = f" (was {before})" if before and before != args.role else ""
    print(f"grant {grant_id}: {args.principal} has {args.role} on {args.states}{change}")
    if args.principal.startswith("user:") and before is None:
        with context.open_store() as conn:
            if len(access.grants_of(conn, args.principal)) == 1:
                print(f"note: {args.principal} now has only its grants; the users file's rights no longer apply to it")
    return 0


def add_revoke_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("principal", type=principal, metavar="PRINCIPAL", help=_PRINCIPALS)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--states", metavar="GLOB", type=cli_args.state_glob, help="the grant on exactly this glob")
    which.add_argument("--all", action="store_true", help="every grant of the principal")
    _add_actor(parser)


def run_revoke(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import access

    with context.open_store() as conn:
        gone = access.revoke_grant(conn, args.principal, None if args.all else args.states, args.actor or cli_args.default_actor())
    if not gone:
        on = "" if args.all else f" on {args.states}"
        raise KlError(f"{args.principal} has no grant{on} (see `kl access list {args.principal}`)")
    for g in gone:
        print(f"revoked grant {g.id}: {g.principal} {g.role} on {g.states_glob}")
    return 0


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("principal", type=principal, nargs="?", metavar="PRINCIPAL", help="only this principal's grants")
    cli_args.add_format(parser)


def run_list(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import access

    with context.open_store() as conn:
        rows = access.list_grants(conn, args.principal)
    if args.format == "json":
        render.emit_json({"version": 1, "grants": [
            {"id": r["id"], "principal": r["principal"], "role": r["role"], "states": r["states_glob"],
             "created_at": r["created_at"], "created_by": r["created_by"],
             "token_revoked": r["token_revoked_at"] is not None} for r in rows]})
        return 0
    if not rows:
        print("no grants: users-file users and $KL_SERVE_TOKEN keep the users file's rights (kl access grant to narrow them)")
        return 0
    render.table(["id", "principal", "role", "states", "created", "by"],
                 [(r["id"], r["principal"] + (" (revoked)" if r["token_revoked_at"] else ""), r["role"], r["states_glob"],
                   r["created_at"], r["created_by"]) for r in rows])
    return 0


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("principal", type=principal, metavar="PRINCIPAL",
                        help=_PRINCIPALS + " (for oidc, a token's sub: the grants whose glob matches it)")
    parser.add_argument("state", type=cli_args.state_name, metavar="STATE", help="a state name")
    parser.add_argument("--users-file", metavar="FILE",
                        help="kl serve's users file, for a user without grants (its admin flag decides)")
    cli_args.add_format(parser)


def run_check(args: argparse.Namespace, context: CommandContext) -> int:
    from pathlib import Path

    from kilolock.server import access as rules
    from kilolock.server.auth import Principal, load_users
    from kilolock.store import access, oidc_trusts

    kind, name = args.principal.split(":", 1)
    note = None
    with context.open_store() as conn:
        stored = access.grants_of(conn, args.principal)
        if kind == "token":
            usable = {t["name"]: t for t in access.list_tokens(conn)}.get(name)
            if usable is None:
                raise KlError(f"no token named {name!r} (see `kl token list`)")
            if usable["revoked_at"] is not None or usable["expired"]:
                note = "this token is " + ("revoked" if usable["revoked_at"] is not None else "expired") + ": kl serve refuses it"
        if kind == "oidc":
            trust, sub = name.split(":", 1)
            if not oidc_trusts.trust_exists(conn, trust):
                raise KlError(f"no OIDC trust named {trust!r} (see `kl access trust list`)")
            trust_grants = oidc_trusts.grants_of_trust(conn, trust)
    if kind == "oidc":
        # A token's sub, taken literally: the grants whose sub glob matches it.
        grants = rules.oidc_grants(args.principal, trust, sub, trust_grants)
    elif stored or kind in ("token", "cert"):
        grants = rules.stored_grants(args.principal, stored)
    elif args.users_file:
        users = load_users(Path(args.users_file))
        if name not in users:
            raise KlError(f"{args.users_file}: no user {name!r}, and {args.principal} has no grants")
        grants = rules.implicit_grants(Principal(name, admin=users[name].admin, kind="user"))
    else:
        grants = rules.Grants(args.principal, ())
        note = "no grants: the users file decides (admin flag: admin on **; otherwise write on **); give --users-file"
    found = grants.role_on(args.state)
    allowed = {a: bool(grants.allows(a, args.state)) for a in ("read", "lock-plan", "lock", "write", "delete", "force-unlock")}
    if args.format == "json":
        render.emit_json({"version": 1, "principal": args.principal, "state": args.state,
                          "role": found[0] if found else None, "through": found[1].describe() if found else None,
                          "allowed": allowed, "note": note})
        return 0
    if found:
        role, grant = found
        may = {"read": "GET, drift, API, UI, LOCK/UNLOCK of its own lock for a plan", "write": "read + POST and any LOCK",
               "admin": "write + DELETE and force-unlock"}[role]
        print(f"{args.principal} on {args.state}: {role} ({may}) through {grant.describe()}")
    else:
        print(f"{args.principal} on {args.state}: nothing (every request refused with 403)")
    if note:
        print(f"note: {note}")
    return 0


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=cli_args.positive, default=50, metavar="N", help="newest N entries (default 50)")
    cli_args.add_format(parser)


def run_log(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import access

    with context.open_store() as conn:
        rows = access.audit_log(conn, args.limit)
    if args.format == "json":
        render.emit_json({"version": 1, "entries": rows})
        return 0
    if not rows:
        print("no access audit entries")
        return 0
    render.table(["at", "who", "action", "target", "state", "detail"],
                 [(r["at"], r["actor"], r["action"], r["target"], r["state"], r["detail"]) for r in rows])
    return 0


# --- kl access trust ------------------------------------------------------------------------------

def _http_url(text: str) -> str:
    from urllib.parse import urlsplit

    cli_args.utf8_text(text)
    u = urlsplit(text)
    if u.scheme not in ("https", "http") or not u.hostname:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an https:// URL")
    return text


def _jwks_source(text: str) -> str:
    cli_args.utf8_text(text)
    if text.startswith(("https://", "http://")):
        return _http_url(text)
    path = os.path.abspath(text)  # kl serve may run elsewhere: the file as this directory names it
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"{text}: no such file (a JWKS file, or an https:// URL)")
    return path


def _claim_rule(text: str) -> tuple[str, str]:
    cli_args.utf8_text(text)
    name, sep, glob = text.partition("=")
    if not sep or not name or not glob or any(c.isspace() for c in name):
        raise argparse.ArgumentTypeError(f"{text!r}: expected CLAIM=GLOB, e.g. repository_owner=acme")
    return name, glob


def add_trust_oidc_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--issuer", required=True, type=_http_url, metavar="URL",
                        help="the issuer, exactly as its tokens' iss claim says it")
    parser.add_argument("--audience", required=True, type=cli_args.utf8_text, metavar="AUD",
                        help="the audience tokens must be for (their aud claim)")
    parser.add_argument("--jwks", type=_jwks_source, metavar="FILE|URL",
                        help="where the issuer's keys are (default: the jwks_uri of ISSUER/.well-known/openid-configuration)")
    parser.add_argument("--name", metavar="NAME",
                        help="how principals name it, oidc:NAME:SUB (default: the issuer's host name)")
    parser.add_argument("--claim", action="append", type=_claim_rule, default=[], metavar="CLAIM=GLOB",
                        help="a claim every token must match as well (repeatable): * within a ':'-separated part, ** across")
    parser.add_argument("--clock-skew", type=cli_args.duration, default=60.0, metavar="DURATION",
                        help="how far exp and nbf may be off (default 1m)")
    parser.add_argument("--lock-grace", type=cli_args.duration, default=3600.0, metavar="DURATION",
                        help="how long past its exp a token may still read, save and unlock a state its subject holds "
                             "locked (default 1h)")
    _add_actor(parser)


def run_trust_oidc(args: argparse.Namespace, context: CommandContext) -> int:
    from urllib.parse import urlsplit

    from kilolock.store import oidc_trusts

    name = args.name or (urlsplit(args.issuer).hostname or "")
    if not _TRUST_NAME.fullmatch(name) or len(name) > 100:
        raise UsageError(f"--name {name!r}: a trust name is letters, digits and _.- (starting with a letter or digit)")
    claims = dict(args.claim)
    for claim, glob in claims.items():
        globs.compile_claim_glob(glob)  # an empty or odd glob fails here, not at the first token
        if claim in ("iss", "aud", "exp", "nbf", "iat"):
            raise UsageError(f"--claim {claim}: kl checks {claim} itself (--issuer, --audience, --clock-skew)")
    trust = oidc_trusts.Trust(name, args.issuer, args.audience, args.jwks, claims, args.clock_skew, args.lock_grace)
    with context.open_store() as conn:
        new = oidc_trusts.add_trust(conn, trust, args.actor or cli_args.default_actor())
    keys = args.jwks or f"{args.issuer.rstrip('/')}/.well-known/openid-configuration (jwks_uri)"
    print(f"trust {name}: {'added' if new else 'changed'}: tokens from {args.issuer} for {args.audience}, keys from {keys}")
    print(f"grant with: kl access grant 'oidc:{name}:SUB-GLOB' --role ROLE --states GLOB")
    return 0


def add_trust_list_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_format(parser)


def run_trust_list(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import oidc_trusts

    with context.open_store() as conn:
        trusts = oidc_trusts.list_trusts(conn)
    if args.format == "json":
        render.emit_json({"version": 1, "trusts": [
            {"name": t.name, "issuer": t.issuer, "audience": t.audience, "jwks": t.jwks, "claims": t.claims,
             "clock_skew_s": t.clock_skew_s, "lock_grace_s": t.lock_grace_s, "created_at": t.created_at,
             "created_by": t.created_by} for t in trusts]})
        return 0
    if not trusts:
        print("no OIDC trusts (kl access trust oidc --issuer URL --audience AUD)")
        return 0
    render.table(["name", "issuer", "audience", "keys", "claims", "skew", "lock grace"],
                 [(t.name, t.issuer, t.audience, t.jwks or "(discovery)",
                   ", ".join(f"{k}={v}" for k, v in sorted(t.claims.items())) or "-",
                   f"{t.clock_skew_s:g}s", f"{t.lock_grace_s:g}s") for t in trusts])
    return 0


def add_trust_remove_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the trust's name (kl access trust list)")
    _add_actor(parser)


def run_trust_remove(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import oidc_trusts

    with context.open_store() as conn:
        left = oidc_trusts.remove_trust(conn, args.name, args.actor or cli_args.default_actor())
    print(f"trust {args.name}: removed; kl serve refuses its tokens from now on")
    if left:
        print(f"note: {left} grant{'s' if left != 1 else ''} still name oidc:{args.name}:… "
              f"(kl access list; a trust added again under this name gets them back)")
    return 0


# --- kl token -------------------------------------------------------------------------------------

def add_create_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=token_name, metavar="NAME", help="the token's name (grants know it as token:NAME)")
    _add_role_states(parser)
    parser.add_argument("--expires", metavar="DURATION", type=cli_args.duration,
                        help="refused after this long: s, m, h or d (30m, 12h, 90d); default never")
    cli_args.add_format(parser)
    _add_actor(parser)


def run_create(args: argparse.Namespace, context: CommandContext) -> int:
    import secrets

    from kilolock.server.access import token_secret_hash
    from kilolock.server.auth import TOKEN_PREFIX
    from kilolock.store import access

    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)  # 256 random bits
    with context.open_store() as conn:
        first = not access.any_usable_token(conn)
        expires = access.create_token(conn, args.name, token_secret_hash(secret.encode()), args.role, args.states,
                                      args.expires, args.actor or cli_args.default_actor())
    if first:
        # The moment an open server closes: whoever used it without credentials should hear it here.
        print("kl: note: the first kl token: a kl serve running without credentials now requires them "
              "(within a few seconds), and keeps doing so until it restarts", file=sys.stderr)
    if args.format == "json":
        render.emit_json({"version": 1, "name": args.name, "token": secret, "role": args.role, "states": args.states,
                          "expires_at": expires})
        return 0
    until = render.when(expires) if expires else "never"
    print(f"token {args.name}: {args.role} on {args.states}, expires {until}")
    print(secret)
    print("shown once: kl keeps only its hash. Use it as TF_HTTP_PASSWORD (any user name) or Authorization: Bearer.")
    return 0


def add_tokens_list_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_format(parser)


def run_tokens_list(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import access

    with context.open_store() as conn:
        rows = access.list_tokens(conn)
    if args.format == "json":
        render.emit_json({"version": 1, "tokens": [
            {"name": r["name"], "grants": list(r["grants"]), "created_at": r["created_at"], "created_by": r["created_by"],
             "expires_at": r["expires_at"], "expired": r["expired"], "revoked_at": r["revoked_at"],
             "last_used_at": r["last_used_at"]} for r in rows]})
        return 0
    if not rows:
        print("no tokens (kl token create NAME --role ROLE --states GLOB)")
        return 0
    render.table(["name", "grants", "status", "expires", "last used", "created"],
                 [(r["name"], ", ".join(r["grants"]) or "-",
                   "revoked" if r["revoked_at"] else "expired" if r["expired"] else "active",
                   r["expires_at"] or "never", r["last_used_at"], r["created_at"]) for r in rows])
    return 0


def add_tokens_revoke_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=token_name, metavar="NAME", help="the token's name (kl token list)")
    _add_actor(parser)


def run_tokens_revoke(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import access

    with context.open_store() as conn:
        changed = access.revoke_token(conn, args.name, args.actor or cli_args.default_actor())
    print(f"token {args.name}: revoked; kl serve refuses it from now on" if changed else f"token {args.name}: was revoked already")
    return 0
