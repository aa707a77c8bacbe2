"""OIDC bearer tokens: a JWT whose issuer is trusted (``kl access trust oidc``, kept in the store)
is checked here: its algorithm (RS256 or ES256 only: never ``none``, never a shared secret), its
signature against the issuer's published keys (JWKS), ``iss``, ``aud``, ``nbf`` and ``exp`` (with
the trust's clock skew), and the trust's claim rules. The result is the principal
``oidc:TRUST:SUB``.

Keys are fetched once per trust and cached; a token naming a key id the cache lacks (the issuer
rotated its keys) fetches them again, at most once per ``refetch_every`` seconds per trust, so a
flood of made-up key ids costs the issuer nothing; the cache is fetched again after ``max_age``
anyway, and a failed fetch keeps the keys it had.

A token that expired within the trust's lock grace is still verified, and comes back with
``expired`` set: the server then lets it do only what finishes the work under a lock its subject
holds (read and save the state, unlock it), so a long apply does not end with its state unsaved.

A refusal is a ``Refused`` with one line that never holds the token or its signature. PyJWT (and
cryptography beneath it) is imported at the first token, not before.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kilolock import globs
from kilolock.store.oidc_trusts import Trust

log = logging.getLogger("kilolock.server")

ALGORITHMS = ("RS256", "ES256")
_KEY_TYPES = {"RS256": ("RSA", None), "ES256": ("EC", "P-256")}
FETCH_TIMEOUT_S = 5.0
MAX_DOCUMENT_BYTES = 1 << 20
REFETCH_EVERY_S = 10.0
MAX_AGE_S = 3600.0


class Refused(Exception):
    """Why a token is not accepted, in one line; ACTOR is who it claims to be, as far as known."""

    def __init__(self, reason: str, actor: str = "oidc:?") -> None:
        super().__init__(reason)
        self.reason = reason
        self.actor = actor


class FetchError(Exception):
    pass


@dataclass(frozen=True)
class Verified:
    trust: Trust
    subject: str
    # Set when the token expired but is within the trust's lock grace: the one line saying so.
    expired: str | None = None

    @property
    def principal(self) -> str:
        return f"oidc:{self.trust.name}:{self.subject}"


def _shown(value: object, limit: int = 100) -> str:
    """A claim as one safe log field: repr escapes control characters, and the length is capped."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(text[:limit] + ("…" if len(text) > limit else ""))


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fetch_json(where: str) -> Any:
    """A JSON document from an http(s) URL (with a timeout and a size cap) or a file."""
    if where.startswith(("https://", "http://")):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(where, timeout=FETCH_TIMEOUT_S) as resp:
                body = resp.read(MAX_DOCUMENT_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise FetchError(f"{where}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise FetchError(f"{where}: {reason}") from None
    else:
        try:
            with open(where, "rb") as f:
                body = f.read(MAX_DOCUMENT_BYTES + 1)
        except OSError as exc:
            raise FetchError(f"{where}: {exc.strerror or exc}") from None
    if len(body) > MAX_DOCUMENT_BYTES:
        raise FetchError(f"{where}: larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return json.loads(body)
    except ValueError:
        raise FetchError(f"{where}: not JSON") from None


def jwks_location(trust: Trust) -> str:
    """Where the trust's keys are: its --jwks, or the jwks_uri of its issuer's discovery document."""
    if trust.jwks:
        return trust.jwks
    doc = _fetch_json(trust.issuer.rstrip("/") + "/.well-known/openid-configuration")
    uri = doc.get("jwks_uri") if isinstance(doc, dict) else None
    if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
        raise FetchError(f"{trust.issuer}/.well-known/openid-configuration has no jwks_uri")
    return uri


def parse_jwks(doc: Any, where: str) -> dict[str | None, Any]:
    """The signing keys of a JWKS by key id (None: a key without one), as PyJWK objects; keys of
    other types or uses are left out."""
    import jwt

    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise FetchError(f"{where}: not a JWKS (an object with a \"keys\" list)")
    keys: dict[str | None, Any] = {}
    for entry in doc["keys"]:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        kty, crv = entry.get("kty"), entry.get("crv")
        alg = next((a for a, (t, c) in _KEY_TYPES.items() if t == kty and (c is None or c == crv)), None)
        if alg is None or entry.get("alg", alg) != alg:
            continue
        try:
            keys[entry.get("kid") if isinstance(entry.get("kid"), str) else None] = jwt.PyJWK(entry, algorithm=alg)
        except jwt.PyJWTError:
            continue
    if not keys:
        raise FetchError(f"{where}: no RS256 or ES256 signing key in the JWKS")
    return keys


@dataclass
class _KeySet:
    keys: dict[str | None, Any] = field(default_factory=dict)
    fetched_at: float | None = None  # monotonic
    lock: threading.Lock = field(default_factory=threading.Lock)


class Verifier:
    """Checks JWTs against the trusts it is given, with a key cache per trust (one per server)."""

    def __init__(self, refetch_every: float = REFETCH_EVERY_S, max_age: float = MAX_AGE_S) -> None:
        self.refetch_every = refetch_every
        self.max_age = max_age
        self._sets: dict[tuple[str, str, str | None], _KeySet] = {}
        self._lock = threading.Lock()

    def verify(self, token: str, trust_of: Callable[[str], Trust | None], now: float | None = None) -> Verified:
        import jwt

        if not jwt.algorithms.has_crypto:
            raise Refused("this kl cannot check RS256 or ES256 signatures: the cryptography package did not load")
        try:
            header = jwt.get_unverified_header(token)
            claimed = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise Refused("not a well-formed JWT") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise Refused(f"alg {_shown(alg)} is not accepted (RS256 or ES256 only)")
        issuer = claimed.get("iss")
        if not isinstance(issuer, str):
            raise Refused("the token has no iss claim")
        trust = trust_of(issuer)
        if trust is None:
            raise Refused(f"issuer {_shown(issuer)} is not trusted (kl access trust list)")
        unverified = f"oidc:{trust.name}:?"
        kid = header.get("kid")
        key = self._key(trust, kid if isinstance(kid, str) else None, alg, unverified)
        try:
            claims = jwt.decode(token, key, algorithms=[alg], options={
                "verify_exp": False, "verify_nbf": False, "verify_iat": False, "verify_aud": False, "verify_iss": False})
        except jwt.InvalidSignatureError:
            raise Refused(f"bad signature (key {_shown(kid)} of trust {trust.name})", unverified) from None
        except jwt.PyJWTError as exc:
            raise Refused(f"not verified: {exc}", unverified) from None
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise Refused("the token has no sub claim", unverified)
        return self._check_claims(trust, claims, f"oidc:{trust.name}:{sub}", time.time() if now is None else now)

    def _check_claims(self, trust: Trust, claims: dict[str, Any], actor: str, now: float) -> Verified:
        aud = claims.get("aud")
        audiences = aud if isinstance(aud, list) else [aud]
        if trust.audience not in audiences:
            raise Refused(f"audience {_shown(aud)} is not {trust.audience!r} (trust {trust.name})", actor)
        skew = trust.clock_skew_s
        nbf = claims.get("nbf")
        if nbf is not None and (not isinstance(nbf, (int, float)) or now + skew < nbf):
            raise Refused(f"not valid before {_utc(nbf) if isinstance(nbf, (int, float)) else _shown(nbf)} "
                          f"(trust {trust.name} allows {skew:g}s of clock skew)", actor)
        exp = claims.get("exp")
        if not isinstance(exp, (int, float)):
            raise Refused("the token has no exp claim", actor)
        expired = None
        if now > exp + skew:
            expired = f"its token expired at {_utc(exp)}"
            if now > exp + skew + trust.lock_grace_s:
                raise Refused(f"expired at {_utc(exp)} (trust {trust.name} allows {skew:g}s of clock skew)", actor)
        for name, glob in sorted(trust.claims.items()):
            value = claims.get(name)
            if name not in claims:
                raise Refused(f"the token has no {name!r} claim; trust {trust.name} requires {glob!r}", actor)
            if not isinstance(value, str) or globs.compile_claim_glob(glob).fullmatch(value) is None:
                raise Refused(f"claim {name!r} is {_shown(value)}; trust {trust.name} requires {glob!r}", actor)
        return Verified(trust, actor.split(":", 2)[2], expired)

    def _keyset(self, trust: Trust) -> _KeySet:
        with self._lock:
            return self._sets.setdefault((trust.name, trust.issuer, trust.jwks), _KeySet())

    def _key(self, trust: Trust, kid: str | None, alg: str, actor: str) -> Any:
        keyset = self._keyset(trust)
        with keyset.lock:  # one fetch at a time per trust; the others wait for its keys
            now = time.monotonic()
            age = None if keyset.fetched_at is None else now - keyset.fetched_at
            if age is None or age >= self.max_age or (kid not in keyset.keys and age >= self.refetch_every):
                try:
                    where = jwks_location(trust)
                    keyset.keys = parse_jwks(_fetch_json(where), where)
                except FetchError as exc:
                    if keyset.fetched_at is None:
                        raise Refused(f"cannot fetch the keys of trust {trust.name}: {exc}", actor) from None
                    log.warning("OIDC trust %s: cannot fetch its keys again, keeping the cached ones: %s", trust.name, exc)
                keyset.fetched_at = now
            keys = keyset.keys
        if kid is None and len(keys) == 1:
            key = next(iter(keys.values()))
        else:
            key = keys.get(kid)
        if key is None:
            raise Refused(f"key id {_shown(kid)} is not among the keys of trust {trust.name}", actor)
        if key.algorithm_name != alg:
            raise Refused(f"key {_shown(kid)} of trust {trust.name} is for {key.algorithm_name}, the token says {alg}", actor)
        return key
