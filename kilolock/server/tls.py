"""``kl serve``'s TLS: the server context (TLS 1.2+) from a certificate, its key and optionally a
CA whose client certificates are credentials, and a client certificate as a principal.

With ``--client-ca`` a client may present a certificate (it need not: one without falls back to
the other credentials); one that is presented must chain to that CA and be within its validity, or
the handshake fails. Its subject's common name is the principal ``cert:CN=NAME``.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from kilolock.errors import KlError, UsageError

CERT_PREFIX = "cert:CN="


@dataclass(frozen=True)
class TlsFiles:
    cert: str
    key: str
    client_ca: str | None = None


def files_from_args(cert: str | None, key: str | None, client_ca: str | None) -> TlsFiles | None:
    if not cert and not key:
        if client_ca:
            raise UsageError("--client-ca needs --tls-cert and --tls-key: client certificates come with HTTPS")
        return None
    if not (cert and key):
        raise UsageError("--tls-cert and --tls-key go together")
    return TlsFiles(cert, key, client_ca)


def load(files: TlsFiles) -> ssl.SSLContext:
    """A fresh server context from the files as they are now; a KlError naming the file otherwise."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(files.cert, files.key)
    except FileNotFoundError as exc:
        raise KlError(f"{exc.filename}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        raise KlError(f"cannot load the TLS certificate {files.cert} / key {files.key}: {_words(exc)}") from None
    if files.client_ca:
        try:
            ctx.load_verify_locations(cafile=files.client_ca)
        except FileNotFoundError:
            raise KlError(f"{files.client_ca}: no such file (--client-ca)") from None
        except (ssl.SSLError, OSError) as exc:
            raise KlError(f"cannot load the client CA {files.client_ca}: {_words(exc)}") from None
        # Optional, not required: a client without a certificate can still use a password or a
        # token, while one that presents a certificate is held to the CA (OpenSSL refuses the
        # handshake for a bad one under CERT_OPTIONAL too).
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def _words(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return getattr(exc, "strerror", None) or str(exc)


def refusal(exc: ssl.SSLError) -> str | None:
    """One line for a handshake that failed because of the client's certificate; None for any other
    failure (a plain-HTTP client, a scanner, a client that hung up)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or "not verified"
        hint = " (not issued by the --client-ca)" if exc.verify_code in (2, 18, 19, 20, 21) else ""
        return f"client certificate refused: {why}{hint}"
    if exc.reason in ("PEER_DID_NOT_RETURN_A_CERTIFICATE", "NO_CERTIFICATE_RETURNED"):
        return "client certificate refused: none presented"
    return None


def principal_name(peercert: dict[str, Any] | None) -> str | None:
    """``cert:CN=NAME`` for a verified peer certificate (ssl's getpeercert()), None without one or
    without a common name."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return CERT_PREFIX + str(value)
    return None
