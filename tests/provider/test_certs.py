"""The AutoMTLS client certificate, made with either backend's P-256 (aws-lc through the native
extension, or pure Python): parsed by the stdlib, its key pair loaded by a TLS server, its signature
checked here by ECDSA verification, and accepted by a real Go plugin's AutoMTLS."""
from __future__ import annotations

import hashlib
import ssl
from pathlib import Path

import pytest

from kilolock.provider import certs, launch_provider
from kilolock.provider.certs import der_to_pem, generate_client_certificate
from kit.providers import BY_TYPE, require

BACKENDS = ["native", "python"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> certs.Backend:
    if request.param == "native" and certs._native() is None:
        pytest.fail("the native extension (kilolock._native.p256) is not built: run `pip install -e .` (maturin builds codec_rs)", pytrace=False)
    return request.param


def test_certificate_fields_as_go_plugin_expects(tmp_path: Path, backend: certs.Backend) -> None:
    cert = generate_client_certificate(backend=backend)
    path = tmp_path / "c.pem"
    path.write_bytes(cert.cert_pem)
    decoded = ssl._ssl._test_decode_cert(str(path))  # type: ignore[attr-defined]
    assert decoded["subject"] == decoded["issuer"]  # self-signed
    assert (("commonName", "localhost"),) in decoded["subject"]
    assert decoded["subjectAltName"] == (("DNS", "localhost"),)
    assert der_to_pem(cert.cert_der) == cert.cert_pem


def test_python_ssl_loads_the_key_pair(tmp_path: Path, backend: certs.Backend) -> None:
    # load_cert_chain checks that the private key matches the certificate's public key.
    cert = generate_client_certificate(backend=backend)
    (tmp_path / "c.pem").write_bytes(cert.cert_pem)
    (tmp_path / "k.pem").write_bytes(cert.key_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    # ... and that the certificate verifies as a CA against itself, as go-plugin's server does.
    ctx.load_verify_locations(cadata=cert.cert_der)
    assert ctx.cert_store_stats()["x509_ca"] == 1


def test_every_certificate_is_fresh(backend: certs.Backend) -> None:
    a, b = generate_client_certificate(backend=backend), generate_client_certificate(backend=backend)
    assert a.cert_der != b.cert_der and a.key_pem != b.key_pem


# --- the self-signature, verified: a TLS library trusts a root without checking it ---------------


def _tlvs(der: bytes) -> list[tuple[int, bytes, bytes]]:
    """The (tag, content, whole encoding) of each element in DER."""
    out, i = [], 0
    while i < len(der):
        tag, n = der[i], der[i + 1]
        start = i + 2
        if n & 0x80:
            size = n & 0x7F
            n = int.from_bytes(der[start : start + size], "big")
            start += size
        out.append((tag, der[start : start + n], der[i : start + n]))
        i = start + n
    return out


def _verifies(cert_der: bytes) -> bool:
    """ECDSA-with-SHA-256 verification of the certificate's signature by its own public key."""
    [(_, cert, _)] = _tlvs(cert_der)
    (_, tbs_content, tbs), _algorithm, (_, bits, _) = _tlvs(cert)
    spki = _tlvs(tbs_content)[6][1]
    point = _tlvs(spki)[1][1][1:]  # BIT STRING: unused-bits byte, then 04 || X || Y
    assert point[0] == 4 and len(point) == 65
    q = (int.from_bytes(point[1:33], "big"), int.from_bytes(point[33:], "big"))
    [(_, sig, _)] = _tlvs(bits[1:])
    (_, r, _), (_, s, _) = _tlvs(sig)
    r_int, s_int = int.from_bytes(r, "big"), int.from_bytes(s, "big")
    if not (0 < r_int < certs._N and 0 < s_int < certs._N):
        return False
    z = int.from_bytes(hashlib.sha256(tbs).digest(), "big")
    w = pow(s_int, -1, certs._N)
    a, b = certs._multiply(z * w % certs._N, certs._G), certs._multiply(r_int * w % certs._N, q)
    x, _, zz = certs._add((a[0], a[1], 1), (b[0], b[1], 1))
    return zz != 0 and x * pow(zz * zz, -1, certs._P) % certs._P % certs._N == r_int


def test_the_self_signature_verifies_under_the_certificates_key(backend: certs.Backend) -> None:
    cert = generate_client_certificate(backend=backend)
    assert _verifies(cert.cert_der)
    tampered = bytearray(cert.cert_der)
    tampered[cert.cert_der.index(b"localhost")] ^= 0x20  # a byte of the signed part
    assert not _verifies(bytes(tampered))


def test_a_native_key_that_is_not_one_pair_is_refused() -> None:
    native = certs._native()
    assert native is not None, "the native extension (kilolock._native.p256) is not built: run `pip install -e .`"
    private, _ = native.generate()
    _, other = native.generate()
    with pytest.raises(ValueError, match="not a P-256 key pair"):
        native.sign(private, other, b"tbs")


def test_a_real_go_plugin_completes_automtls_with_either_backends_certificate(monkeypatch: pytest.MonkeyPatch,
                                                                               backend: certs.Backend) -> None:
    # go-plugin's server takes the client certificate as its only root and checks the handshake's
    # signature by its key: a wrong key pair or a bad certificate fails the handshake.
    monkeypatch.setattr(certs, "_cached", generate_client_certificate(backend=backend))
    with launch_provider(require(BY_TYPE["null"]), tls=True) as client:
        assert client.connection.tls  # type: ignore[attr-defined]
        assert "null_resource" in client.get_schema().resource_schemas
