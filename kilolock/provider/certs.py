"""The client half of go-plugin AutoMTLS: a self-signed ECDSA P-256 certificate, built here.

go-plugin verifies the client certificate against itself as the only root, so it must be a
self-signed CA certificate (keyCertSign) with the clientAuth extended key usage; Go accepts P-256 as
well as the P-521 go-plugin generates itself. The key and the certificate's one signature come from
aws-lc through the native extension (codec_rs/src/p256.rs: ~0.1 ms) or, in a build without it, from
big-integer arithmetic in pure Python (~7 ms, on the critical path of every refresh, as the
provider cannot start before its certificate exists): kl must run from one file on air-gapped hosts
with only python3, where neither the ``cryptography`` package nor the ``openssl`` CLI can be assumed.
Nonces come from ``secrets`` (or aws-lc); the key never leaves memory.
"""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Literal

# NIST P-256 (secp256r1) domain parameters.
_P = 0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF
_A = _P - 3
_N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_G = (
    0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
    0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5,
)

_OID_EC_PUBLIC_KEY = "1.2.840.10045.2.1"
_OID_P256 = "1.2.840.10045.3.1.7"
_OID_ECDSA_SHA256 = "1.2.840.10045.4.3.2"
_OID_ORG = "2.5.4.10"
_OID_CN = "2.5.4.3"
_OID_KEY_USAGE = "2.5.29.15"
_OID_EXT_KEY_USAGE = "2.5.29.37"
_OID_BASIC_CONSTRAINTS = "2.5.29.19"
_OID_SAN = "2.5.29.17"
_OID_SERVER_AUTH = "1.3.6.1.5.5.7.3.1"
_OID_CLIENT_AUTH = "1.3.6.1.5.5.7.3.2"


# --- elliptic-curve arithmetic in Jacobian coordinates -------------------------------------------

_Jac = tuple[int, int, int]


def _double(pt: _Jac) -> _Jac:
    x, y, z = pt
    if y == 0 or z == 0:
        return (0, 1, 0)
    ysq = y * y % _P
    s = 4 * x * ysq % _P
    m = (3 * x * x + _A * pow(z, 4, _P)) % _P
    nx = (m * m - 2 * s) % _P
    ny = (m * (s - nx) - 8 * ysq * ysq) % _P
    nz = 2 * y * z % _P
    return (nx, ny, nz)


def _add(p1: _Jac, p2: _Jac) -> _Jac:
    if p1[2] == 0:
        return p2
    if p2[2] == 0:
        return p1
    x1, y1, z1 = p1
    x2, y2, z2 = p2
    z1sq, z2sq = z1 * z1 % _P, z2 * z2 % _P
    u1, u2 = x1 * z2sq % _P, x2 * z1sq % _P
    s1, s2 = y1 * z2sq * z2 % _P, y2 * z1sq * z1 % _P
    if u1 == u2:
        return _double(p1) if s1 == s2 else (0, 1, 0)
    h, r = (u2 - u1) % _P, (s2 - s1) % _P
    h2 = h * h % _P
    h3 = h * h2 % _P
    u1h2 = u1 * h2 % _P
    nx = (r * r - h3 - 2 * u1h2) % _P
    ny = (r * (u1h2 - nx) - s1 * h3) % _P
    nz = h * z1 * z2 % _P
    return (nx, ny, nz)


def _multiply(k: int, point: tuple[int, int]) -> tuple[int, int]:
    acc: _Jac = (0, 1, 0)
    addend: _Jac = (point[0], point[1], 1)
    while k:
        if k & 1:
            acc = _add(acc, addend)
        addend = _double(addend)
        k >>= 1
    x, y, z = acc
    zinv = pow(z, -1, _P)
    return (x * zinv * zinv % _P, y * zinv * zinv * zinv % _P)


def _sign(private: int, message: bytes) -> tuple[int, int]:
    z = int.from_bytes(hashlib.sha256(message).digest(), "big")
    while True:
        k = secrets.randbelow(_N - 1) + 1
        r = _multiply(k, _G)[0] % _N
        if r == 0:
            continue
        s = pow(k, -1, _N) * (z + r * private) % _N
        if s:
            return r, s


# --- DER ------------------------------------------------------------------------------------------


def _tlv(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        length = bytes([n])
    else:
        raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(raw)]) + raw
    return bytes([tag]) + length + content


def _seq(*items: bytes) -> bytes:
    return _tlv(0x30, b"".join(items))


def _int(value: int) -> bytes:
    raw = value.to_bytes(max(1, (value.bit_length() + 8) // 8), "big")  # keeps a leading 0 when needed
    return _tlv(0x02, raw)


def _oid(dotted: str) -> bytes:
    nums = [int(x) for x in dotted.split(".")]
    out = bytearray([40 * nums[0] + nums[1]])
    for n in nums[2:]:
        chunk = [n & 0x7F]
        n >>= 7
        while n:
            chunk.append(0x80 | (n & 0x7F))
            n >>= 7
        out.extend(reversed(chunk))
    return _tlv(0x06, bytes(out))


def _bits(data: bytes, unused: int = 0) -> bytes:
    return _tlv(0x03, bytes([unused]) + data)


def _time(moment: dt.datetime) -> bytes:
    if moment.year < 2050:
        return _tlv(0x17, moment.strftime("%y%m%d%H%M%SZ").encode())
    return _tlv(0x18, moment.strftime("%Y%m%d%H%M%SZ").encode())


def _name() -> bytes:
    return _seq(_rdn(_OID_ORG, "HashiCorp"), _rdn(_OID_CN, "localhost"))


def _rdn(oid: str, text: str) -> bytes:
    return _tlv(0x31, _seq(_oid(oid), _tlv(0x0C, text.encode())))


def _extension(oid: str, critical: bool, value: bytes) -> bytes:
    flag = _tlv(0x01, b"\xff") if critical else b""
    return _seq(_oid(oid), flag, _tlv(0x04, value))


def _pem(label: str, der: bytes) -> bytes:
    body = base64.encodebytes(der).decode().replace("\n", "")
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    body_lines = "\n".join(lines)
    return f"-----BEGIN {label}-----\n{body_lines}\n-----END {label}-----\n".encode()


# --- the certificate ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientCertificate:
    """kl's AutoMTLS client certificate and its key, PEM-encoded (and the certificate's DER)."""

    cert_pem: bytes
    key_pem: bytes
    cert_der: bytes


def _native() -> Any | None:
    """The extension's aws-lc P-256, or None where it is not built (a kl.pyz with the pure-Python codec)."""
    try:
        from kilolock._native import p256
    except ImportError:
        return None
    return p256


Backend = Literal["auto", "native", "python"]


def generate_client_certificate(now: dt.datetime | None = None, *, backend: Backend = "auto") -> ClientCertificate:
    """A fresh key pair and a self-signed certificate shaped like go-plugin's own. ``backend``:
    whose P-256 makes the key and the signature (auto: aws-lc when the extension has it)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    native = _native() if backend != "python" else None
    if backend == "native" and native is None:
        raise RuntimeError("kilolock._native (its p256) is not built here: pip install -e . builds it (maturin)")
    if native is not None:
        private_bytes, point = native.generate()
        private = int.from_bytes(private_bytes, "big")
    else:
        private = secrets.randbelow(_N - 1) + 1
        qx, qy = _multiply(private, _G)
        point = b"\x04" + qx.to_bytes(32, "big") + qy.to_bytes(32, "big")
    algorithm = _seq(_oid(_OID_ECDSA_SHA256))
    # digitalSignature(0) keyEncipherment(2) keyAgreement(4) keyCertSign(5): 0b10101100, 2 unused bits
    key_usage = _bits(b"\xac", unused=2)
    extensions = _seq(
        _extension(_OID_KEY_USAGE, True, key_usage),
        _extension(_OID_EXT_KEY_USAGE, False, _seq(_oid(_OID_CLIENT_AUTH), _oid(_OID_SERVER_AUTH))),
        _extension(_OID_BASIC_CONSTRAINTS, True, _seq(_tlv(0x01, b"\xff"))),
        _extension(_OID_SAN, False, _seq(_tlv(0x82, b"localhost"))),
    )
    tbs = _seq(
        _tlv(0xA0, _int(2)),  # v3
        _int(secrets.randbits(127) | 1),  # positive, at most 16 bytes
        algorithm,
        _name(),
        _seq(_time(now - dt.timedelta(seconds=30)), _time(now + dt.timedelta(days=3650))),
        _name(),
        _seq(_seq(_oid(_OID_EC_PUBLIC_KEY), _oid(_OID_P256)), _bits(point)),
        _tlv(0xA3, extensions),
    )
    if native is not None:
        signature = native.sign(private.to_bytes(32, "big"), point, tbs)
    else:
        r, s = _sign(private, tbs)
        signature = _seq(_int(r), _int(s))
    cert_der = _seq(tbs, algorithm, _bits(signature))
    key_der = _seq(
        _int(1),
        _tlv(0x04, private.to_bytes(32, "big")),
        _tlv(0xA0, _oid(_OID_P256)),
        _tlv(0xA1, _bits(point)),
    )
    return ClientCertificate(_pem("CERTIFICATE", cert_der), _pem("EC PRIVATE KEY", key_der), cert_der)


def der_to_pem(der: bytes) -> bytes:
    return _pem("CERTIFICATE", der)


_cached: ClientCertificate | None = None
_cache_lock = threading.Lock()


def process_client_certificate() -> ClientCertificate:
    """One certificate per kl process, made on first use."""
    global _cached
    with _cache_lock:
        if _cached is None:
            _cached = generate_client_certificate()
        return _cached
