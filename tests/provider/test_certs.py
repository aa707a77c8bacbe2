"""The pure-Python client certificate: parsed by the stdlib, accepted by a TLS server as its own root."""
from __future__ import annotations

import ssl
from pathlib import Path

from kilolock.provider.certs import der_to_pem, generate_client_certificate


def test_certificate_fields_as_go_plugin_expects(tmp_path: Path) -> None:
    cert = generate_client_certificate()
    path = tmp_path / "c.pem"
    path.write_bytes(cert.cert_pem)
    decoded = ssl._ssl._test_decode_cert(str(path))  # type: ignore[attr-defined]
    assert decoded["subject"] == decoded["issuer"]  # self-signed
    assert (("commonName", "localhost"),) in decoded["subject"]
    assert decoded["subjectAltName"] == (("DNS", "localhost"),)
    assert der_to_pem(cert.cert_der) == cert.cert_pem


def test_python_ssl_loads_the_key_pair(tmp_path: Path) -> None:
    # load_cert_chain checks that the private key matches the certificate's public key.
    cert = generate_client_certificate()
    (tmp_path / "c.pem").write_bytes(cert.cert_pem)
    (tmp_path / "k.pem").write_bytes(cert.key_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    # ... and that the certificate verifies as a CA against itself, as go-plugin's server does.
    ctx.load_verify_locations(cadata=cert.cert_der)
    assert ctx.cert_store_stats()["x509_ca"] == 1


def test_every_certificate_is_fresh() -> None:
    a, b = generate_client_certificate(), generate_client_certificate()
    assert a.cert_der != b.cert_der and a.key_pem != b.key_pem
