"""Who may do what to which state: the one place every ``kl serve`` route asks.

A principal's ``Grants`` are role-on-glob rules; its role on a state is the highest role among the
rules whose glob matches the name (``*`` within a ``/`` segment, ``**`` across: kilolock.globs).
Roles are cumulative: ``read`` (GET, the JSON API, drift, the UI, /metrics labels, and LOCK/UNLOCK
of a lock it took itself for a plan, since ``terraform plan`` locks), ``write`` (+ POST, LOCK for any
other operation, and releasing another principal's lock with its ID), ``admin`` (+ DELETE and
force-unlock without an ID). Which action a LOCK is follows from its LockInfo (``lock_action``).

Where the rules come from (``Access.grants_for``): a token made by ``kl token create`` and a client
certificate (``cert:CN=NAME``) have exactly their grants; an OIDC token (``oidc:TRUST:SUB``) has
the grants whose principal ``oidc:TRUST:SUB-GLOB`` matches its sub (``Access.jwt``); a ``--users-file`` user has its grants, or, while it has none, what the file says
(admin flag: admin on ``**``; otherwise write on ``**``); ``KL_SERVE_TOKEN`` is write on ``**``,
``KL_SERVE_ADMIN_TOKEN`` admin on ``**``; without any authentication configured (loopback only)
the caller is an operator: admin on ``**``.

For other parts of the server (the web UI): ``grants.allows("read", state)`` returns a
``Decision`` (truthy when allowed, with a one-line reason), ``grants.readable(names)`` filters a
list, and ``grants.sql_regexes("read")`` gives PostgreSQL regexes for ``name ~ ANY(%s)`` (None: every
state).
"""
from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import psycopg

from kilolock import globs
from kilolock.server.auth import PresentedJwt, PresentedToken, Principal
from kilolock.store import access as access_store
from kilolock.store import oidc_trusts

if TYPE_CHECKING:
    from kilolock.server.oidc import Verifier

ROLES = ("read", "write", "admin")
_RANK = {"read": 1, "write": 2, "admin": 3}

# What each action needs. "lock-plan" is a LOCK for a plan, "lock" one for anything else (see
# lock_action); "unlock" is releasing a lock the principal took itself; "unlock-other" releasing
# someone else's lock with its ID (the ID is the confirmation, as in kl state unlock).
ACTIONS: dict[str, str] = {
    "read": "read", "lock-plan": "read", "unlock": "read",
    "write": "write", "lock": "write", "unlock-other": "write",
    "delete": "admin", "force-unlock": "admin", "admin": "admin",
}

# The LockInfo Operation of `terraform plan` (and `plan -refresh-only`), which writes no state.
PLAN_OPERATION = "OperationTypePlan"

# A token's last_used_at is written at most this often (seconds): not a database write per request.
TOUCH_EVERY = 60.0
# The actor of a handshake refused for its client certificate: no principal was established.
UNVERIFIED_CERTIFICATE = "cert:unverified"


@lru_cache(maxsize=4096)
def _compiled(glob: str) -> re.Pattern[str]:
    return globs.compile_glob(glob)


@dataclass(frozen=True)
class Grant:
    role: str
    states_glob: str
    source: str  # "grant 3", "users file (admin flag)", "KL_SERVE_TOKEN", ...

    def matches(self, state: str) -> bool:
        return self.states_glob == "**" or _compiled(self.states_glob).fullmatch(state) is not None

    def describe(self) -> str:
        return f"{self.source}: {self.role} on {self.states_glob}"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    role: str | None  # the principal's role on the state (None: none)
    grant: Grant | None  # the grant that gives it
    reason: str  # one line: why allowed or refused

    def __bool__(self) -> bool:
        return self.allowed


@dataclass(frozen=True)
class Grants:
    principal: str  # "user:alice", "token:ci-net", "KL_SERVE_TOKEN", "anonymous"
    rules: tuple[Grant, ...]

    def role_on(self, state: str) -> tuple[str, Grant] | None:
        best: tuple[str, Grant] | None = None
        for g in self.rules:
            if g.matches(state) and (best is None or _RANK[g.role] > _RANK[best[0]]):
                best = (g.role, g)
        return best

    def allows(self, action: str, state: str) -> Decision:
        needed = ACTIONS.get(action)
        if needed is None:
            raise ValueError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
        found = self.role_on(state)
        if found is None:
            return Decision(False, None, None, f"{self.principal} has no grant on state {state!r} ({action} needs {needed})")
        role, grant = found
        if _RANK[role] >= _RANK[needed]:
            return Decision(True, role, grant, f"{self.principal} may {action} state {state!r} through {grant.describe()}")
        return Decision(False, role, grant, f"{self.principal} has only {role} on state {state!r} "
                                            f"({grant.describe()}); {action} needs {needed}")

    def may_read(self, state: str) -> bool:
        return self.role_on(state) is not None

    def readable(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if self.may_read(n)]

    def sql_regexes(self, action: str = "read") -> list[str] | None:
        """Anchored PostgreSQL regexes of the states ACTION is allowed on, for ``name ~ ANY(%s)``;
        None when it is allowed on every state (a ``**`` grant of enough rank)."""
        needed = _RANK[ACTIONS[action]]
        rules = [g for g in self.rules if _RANK[g.role] >= needed]
        if any(g.states_glob == "**" for g in rules):
            return None
        return [globs.sql_regex(g.states_glob) for g in rules]


def lock_action(operation: object) -> str:
    """The action a LOCK is, from its LockInfo's ``Operation``. A lock is taken before the work it
    guards, so it must be refused there: a principal that could lock for an apply would have
    Terraform create real resources and only then be refused their state. Only a plan is read-only;
    every other operation (OperationTypeApply or Refresh, ``state-rm``, ``state-mv``, ``state-push``,
    ``taint``; ``terraform import`` says OperationTypeInvalid, as ``console`` does) or none at all
    is the start of a write."""
    return "lock-plan" if operation == PLAN_OPERATION else "lock"


def allows(grants: Grants, action: str, state: str) -> Decision:
    return grants.allows(action, state)


def implicit_grants(principal: Principal) -> Grants:
    """What a principal may do without any grant in the database: exactly its rights before
    grants existed."""
    if principal.kind in ("cert", "oidc"):
        return Grants(principal.id, ())  # only what is granted to it
    role = "admin" if principal.admin else "write"
    if principal.kind == "user":
        source = "users file (admin flag)" if principal.admin else "users file (no grants: write on **)"
    elif principal.kind == "anonymous":
        role, source = "admin", "no authentication configured"
    else:
        source = "KL_SERVE_ADMIN_TOKEN" if principal.admin else "KL_SERVE_TOKEN"
    return Grants(principal.id, (Grant(role, "**", source),))


def stored_grants(principal: str, rows: Iterable[access_store.StoredGrant]) -> Grants:
    return Grants(principal, tuple(Grant(g.role, g.states_glob, f"grant {g.id}") for g in rows))


@lru_cache(maxsize=4096)
def _claim_glob(glob: str) -> re.Pattern[str]:
    return globs.compile_claim_glob(glob)


def oidc_grants(principal: str, trust: str, subject: str, rows: Iterable[access_store.StoredGrant]) -> Grants:
    """The grants of trust TRUST's subjects (``oidc:TRUST:SUB-GLOB``) whose glob matches SUBJECT."""
    prefix = f"oidc:{trust}:"
    return Grants(principal, tuple(Grant(g.role, g.states_glob, f"grant {g.id} ({g.principal})") for g in rows
                                   if g.principal.startswith(prefix)
                                   and _claim_glob(g.principal[len(prefix):]).fullmatch(subject) is not None))


def token_secret_hash(secret: bytes) -> bytes:
    """The stored form of a kl token: its secret is 256 random bits, so SHA-256 is enough (no
    salt or slow hash needed to stop guessing) and lets the server find it by an index lookup."""
    return hashlib.sha256(secret).digest()


class Access:
    """The server's resolver: principal → grants, with a database lookup for tokens (at every
    request, so a revoked or expired token is refused at once) and the audit of refusals."""

    def __init__(self) -> None:
        self._touched: dict[int, float] = {}
        self._touch_lock = threading.Lock()

    def token(self, conn: psycopg.Connection, presented: PresentedToken) -> tuple[Principal, Grants] | None:
        found = access_store.usable_token(conn, presented.secret_sha256)
        if found is None:
            return None
        now = time.monotonic()
        with self._touch_lock:
            due = now - self._touched.get(found.id, -TOUCH_EVERY) >= TOUCH_EVERY
            if due:
                self._touched[found.id] = now
        if due:
            access_store.touch_token(conn, found.id)
        principal = Principal(f"token:{found.name}", kind="token")
        return principal, stored_grants(principal.id, found.grants)

    def jwt(self, conn: psycopg.Connection, presented: PresentedJwt, verifier: Verifier) -> tuple[Principal, Grants]:
        """The principal of a JWT from a trusted issuer and its grants; kilolock.server.oidc.Refused
        (one line, never the token) otherwise. Trusts and grants are read at every request, so a
        trust removed or a grant changed applies from the next one."""
        verified = verifier.verify(presented.token, lambda issuer: oidc_trusts.trust_by_issuer(conn, issuer))
        principal = Principal(verified.principal, kind="oidc", grace=verified.expired)
        rows = oidc_trusts.grants_of_trust(conn, verified.trust.name)
        return principal, oidc_grants(principal.id, verified.trust.name, verified.subject, rows)

    def grants_for(self, conn: psycopg.Connection | None, principal: Principal) -> Grants:
        if principal.kind in ("user", "cert") and conn is not None:
            rows = access_store.grants_of(conn, principal.id)
            if rows or principal.kind == "cert":
                return stored_grants(principal.id, rows)
        return implicit_grants(principal)

    def refused(self, conn: psycopg.Connection, principal: Principal, what: str, state: str | None, reason: str) -> None:
        access_store.audit(conn, principal.id, "refused", what, state, reason)

    def refused_handshake(self, conn: psycopg.Connection, address: str, reason: str) -> None:
        access_store.audit(conn, UNVERIFIED_CERTIFICATE, "refused", f"TLS handshake from {address}", None, reason)
