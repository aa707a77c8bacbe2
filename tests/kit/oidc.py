"""An OIDC issuer of the test's own: RSA and P-256 keys made by cryptography, its JWKS (and discovery
document) served over HTTP on loopback by a thread, counting fetches, and tokens it signs with
PyJWT. ``rotate`` replaces its keys, as an issuer does."""
from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

AUDIENCE = "kilolock-test"


def _new_keys() -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    return {f"rsa-{tag}": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            f"ec-{tag}": ec.generate_private_key(ec.SECP256R1())}


def _public_jwk(kid: str, key: Any) -> dict[str, Any]:
    if isinstance(key, rsa.RSAPrivateKey):
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        jwk.update(alg="RS256")
    else:
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
        jwk.update(alg="ES256")
    jwk.update(kid=kid, use="sig")
    return jwk


class Issuer:
    def __init__(self) -> None:
        self.keys = _new_keys()
        self.fetches = 0
        self._lock = threading.Lock()
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/jwks.json":
                    with issuer._lock:
                        issuer.fetches += 1
                        body = json.dumps({"keys": [_public_jwk(k, v) for k, v in issuer.keys.items()]}).encode()
                elif self.path == "/.well-known/openid-configuration":
                    body = json.dumps({"issuer": issuer.url, "jwks_uri": issuer.url + "/jwks.json"}).encode()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.jwks_url = self.url + "/jwks.json"

    def kid(self, kind: str = "rsa") -> str:
        return next(k for k in self.keys if k.startswith(kind + "-"))

    def rotate(self) -> None:
        with self._lock:
            self.keys = _new_keys()

    def token(self, sub: str, *, kind: str = "rsa", lifetime: float = 600, exp: float | None = None,
              aud: str | list[str] = AUDIENCE, iss: str | None = None, kid: str | None = None, key: Any = None,
              **claims: Any) -> str:
        kid = kid or self.kid(kind)
        now = time.time()
        body = {"iss": iss or self.url, "aud": aud, "sub": sub, "iat": int(now), "nbf": int(now) - 5,
                "exp": int(exp if exp is not None else now + lifetime), **claims}
        signer = key if key is not None else self.keys[self.kid(kind)]
        return jwt.encode(body, signer, algorithm="RS256" if kind == "rsa" else "ES256", headers={"kid": kid})

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def unsigned(claims: dict[str, Any]) -> str:
    """A token with alg none: what an attacker sends hoping the server skips the signature."""
    import base64

    def b64(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}."
