"""Who is asking: HTTP Basic against a users file of scrypt hashes, or a token (Basic password or
Bearer) from the environment; a kl token or an OIDC JWT (Basic password or Bearer), which only the
store can check; with kl serve --client-ca, a client certificate (kilolock.server.tls) on a request
without an Authorization header. Every comparison of secrets is constant-time."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kilolock.errors import KlError
from kilolock.server.options import ADMIN_TOKEN_ENV, TOKEN_ENV

# scrypt cost: about 16 MiB and tens of milliseconds per check, the usual interactive setting.
_N, _R, _P = 2**14, 8, 1
_SCHEME = "scrypt"


class AuthConfigError(KlError):
    pass


@dataclass(frozen=True)
class Principal:
    name: str  # what versions, lock events and the request log record as the actor
    admin: bool = False
    # "user" (--users-file), "token" (kl token create), "env" (KL_SERVE_TOKEN / KL_SERVE_ADMIN_TOKEN),
    # "cert" (a client certificate: cert:CN=NAME), "oidc" (a JWT: oidc:TRUST:SUB),
    # "anonymous" (no authentication configured)
    kind: str = "env"
    # Set for an OIDC token that expired within its trust's lock grace: why it may only save and
    # unlock a state it holds locked.
    grace: str | None = None

    @property
    def id(self) -> str:
        """The name grants, locks and the audit know it by: user:NAME, token:NAME, KL_SERVE_TOKEN, ..."""
        if self.kind == "user":
            return f"user:{self.name}"
        if self.kind == "env":
            return "KL_SERVE_ADMIN_TOKEN" if self.admin else "KL_SERVE_TOKEN"
        return self.name


ANONYMOUS = Principal("anonymous", kind="anonymous")

# kl token create's secrets start with this, so the server looks only those up in the database.
TOKEN_PREFIX = "klt_"


@dataclass(frozen=True)
class PresentedToken:
    """A kl token (TOKEN_PREFIX…) the request carried: only its hash, to be looked up in the store."""
    secret_sha256: bytes


@dataclass(frozen=True)
class PresentedJwt:
    """A JWT the request carried, for kilolock.server.oidc to verify against the store's trusts."""
    token: str = field(repr=False)


_B64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def looks_like_jwt(text: str) -> bool:
    """Three base64url parts, the first a JSON object's (``eyJ`` is ``{"``): a JWS compact form.
    The signature part may be empty, so that ``alg: none`` is refused by name, not as a password."""
    parts = text.split(".")
    return (len(parts) == 3 and text.startswith("eyJ") and len(text) <= 16384
            and all(set(p) <= _B64URL for p in parts) and bool(parts[1]))


def hash_password(password: str, *, n: int = _N, r: int = _R, p: int = _P) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=2**26, dklen=32)
    return f"{_SCHEME}${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass(frozen=True)
class _Hash:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def matches(self, password: str) -> bool:
        got = hashlib.scrypt(password.encode(), salt=self.salt, n=self.n, r=self.r, p=self.p, maxmem=2**27,
                             dklen=len(self.digest))
        return hmac.compare_digest(got, self.digest)


def _parse_hash(text: str, where: str) -> _Hash:
    parts = text.split("$")
    if len(parts) != 6 or parts[0] != _SCHEME:
        raise AuthConfigError(f"{where}: password hash must be scrypt$N$r$p$SALT$HASH (make one with `kl serve --hash-password`)")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, digest = base64.b64decode(parts[4], validate=True), base64.b64decode(parts[5], validate=True)
    except (ValueError, binascii.Error):
        raise AuthConfigError(f"{where}: malformed scrypt parameters or base64") from None
    if n < 2 or n & (n - 1) or not (1 <= r <= 64) or not (1 <= p <= 16) or len(digest) < 16:
        raise AuthConfigError(f"{where}: scrypt parameters out of range")
    return _Hash(n, r, p, salt, digest)


@dataclass(frozen=True)
class _User:
    hash: _Hash
    admin: bool


def load_users(path: Path) -> dict[str, _User]:
    """``name:scrypt$…[:admin]`` per line; blank lines and ``#`` comments ignored."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise AuthConfigError(f"{path}: cannot read the users file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise AuthConfigError(f"{path}: not UTF-8 text") from None
    users: dict[str, _User] = {}
    for no, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{no}"
        fields = line.split(":")
        if len(fields) not in (2, 3) or not fields[0]:
            raise AuthConfigError(f"{where}: expected NAME:HASH or NAME:HASH:admin")
        if len(fields) == 3 and fields[2] != "admin":
            raise AuthConfigError(f"{where}: the third field may only be 'admin', got {fields[2]!r}")
        if fields[0] in users:
            raise AuthConfigError(f"{where}: user {fields[0]!r} is listed twice")
        users[fields[0]] = _User(_parse_hash(fields[1], where), admin=len(fields) == 3)
    if not users:
        raise AuthConfigError(f"{path}: no users in the users file")
    return users


class Authenticator:
    """Decides who an Authorization header belongs to. Without any credential configured every
    request is anonymous (the listener refuses non-loopback addresses in that case)."""

    def __init__(self, users: dict[str, _User] | None = None, token: str | None = None,
                 admin_token: str | None = None, kl_tokens: bool = False, client_certs: bool = False) -> None:
        self._users = users or {}
        self._client_certs = client_certs
        # Accept kl token create's tokens (looked up in the store). kl serve turns it on when the
        # store holds any token, so that a server without credentials stays open on loopback.
        self._tokens = kl_tokens
        self._token = token.encode() if token else None
        self._admin_token = admin_token.encode() if admin_token else None
        # scrypt per request would cap the server at a few dozen requests/s per core: a verified
        # (user, password) pair is remembered as a keyed hash, never as the password itself.
        self._cache_key = secrets.token_bytes(32)
        self._verified: dict[bytes, Principal] = {}
        self._cache_lock = threading.Lock()
        self._dummy = _parse_hash(hash_password(secrets.token_hex(8)), "dummy")

    @classmethod
    def from_config(cls, users_file: str | None, env: Mapping[str, str] | None = None,
                    kl_tokens: bool = False) -> Authenticator:
        source = os.environ if env is None else env
        users = load_users(Path(users_file)) if users_file else None
        return cls(users, source.get(TOKEN_ENV) or None, source.get(ADMIN_TOKEN_ENV) or None, kl_tokens)

    def accept_kl_tokens(self) -> None:
        """kl tokens and OIDC JWTs (the store's credentials), from now on, for the life of the
        process: revoking every token must not quietly reopen a server its clients were told asks
        for credentials."""
        self._tokens = True

    @property
    def accepts_kl_tokens(self) -> bool:
        return self._tokens

    def accept_client_certs(self) -> None:
        self._client_certs = True

    @property
    def accepts_client_certs(self) -> bool:
        return self._client_certs

    @property
    def enabled(self) -> bool:
        return bool(self._users or self._token or self._admin_token or self._tokens or self._client_certs)

    def by_certificate(self, name: str | None) -> Principal | None:
        """The principal of a verified client certificate (its ``cert:CN=NAME``), when accepted."""
        return Principal(name, kind="cert") if name and self._client_certs else None

    @property
    def user_count(self) -> int:
        return len(self._users)

    @property
    def env_token_count(self) -> int:
        return (self._token is not None) + (self._admin_token is not None)

    def authenticate(self, header: str | None) -> Principal | None:
        """The principal, or None when the credentials are missing or wrong (a kl token, which
        only the store can check, counts as wrong here: see identify)."""
        who = self.identify(header)
        return who if isinstance(who, Principal) else None

    def identify(self, header: str | None) -> Principal | PresentedToken | PresentedJwt | None:
        """The principal; a kl token or a JWT still to be checked against the store; or None when
        the credentials are missing or wrong."""
        if not self.enabled:
            return ANONYMOUS
        if not header:
            return None
        scheme, _, value = header.strip().partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer":
            return self._by_token(value.encode(), "token") or self._kl_token(value) or self._jwt(value)
        if scheme.lower() == "basic":
            try:
                user, sep, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            if not sep:
                return None
            return (self._by_token(password.encode(), user or "token") or self._kl_token(password)
                    or self._jwt(password) or self._by_password(user, password))
        return None

    def _kl_token(self, presented: str) -> PresentedToken | None:
        if not self._tokens or not presented.startswith(TOKEN_PREFIX):
            return None
        return PresentedToken(hashlib.sha256(presented.encode()).digest())

    def _jwt(self, presented: str) -> PresentedJwt | None:
        if not self._tokens or not looks_like_jwt(presented):
            return None
        return PresentedJwt(presented)

    def _by_token(self, presented: bytes, name: str) -> Principal | None:
        # Both comparisons always run, so timing does not tell which token (if any) matched.
        admin = self._admin_token is not None and hmac.compare_digest(presented, self._admin_token)
        plain = self._token is not None and hmac.compare_digest(presented, self._token)
        if admin:
            return Principal(name, admin=True, kind="env")
        if plain:
            return Principal(name, kind="env")
        return None

    def _by_password(self, user: str, password: str) -> Principal | None:
        if not self._users:
            return None
        key = hmac.new(self._cache_key, f"{user}\0{password}".encode(), hashlib.sha256).digest()
        with self._cache_lock:
            hit = self._verified.get(key)
        if hit is not None:
            return hit
        entry = self._users.get(user)
        # An unknown user costs the same scrypt as a known one: no user enumeration by timing.
        ok = (entry.hash if entry else self._dummy).matches(password)
        if not ok or entry is None:
            return None
        principal = Principal(user, admin=entry.admin, kind="user")
        with self._cache_lock:
            if len(self._verified) > 10_000:
                self._verified.clear()
            self._verified[key] = principal
        return principal
