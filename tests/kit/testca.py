"""A certificate authority of the test's own (cryptography's x509 builder): a CA, a server
certificate for 127.0.0.1 and client certificates by common name, valid or expired, as PEM files."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = dt.timedelta(days=1)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path

    @property
    def cert_pem(self) -> str:
        return self.cert.read_text()

    @property
    def key_pem(self) -> str:
        return self.key.read_text()


class TestCA:
    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, name: str = "kl test CA") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        self._cert = (x509.CertificateBuilder().subject_name(self._name).issuer_name(self._name)
                      .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                      .not_valid_before(now - _DAY).not_valid_after(now + _DAY)
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                                   data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                                   crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
                      .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
                      .sign(self._key, hashes.SHA256()))
        self.cert = self.dir / f"{self._slug(name)}.pem"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    @staticmethod
    def _slug(text: str) -> str:
        return "".join(c if c.isalnum() else "-" for c in text)

    @property
    def cert_pem(self) -> str:
        return self.cert.read_text()

    def issue(self, cn: str, *, server: bool = False, expired: bool = False, label: str | None = None) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        start, end = (now - 3 * _DAY, now - 2 * _DAY) if expired else (now - _DAY, now + _DAY)
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                   .issuer_name(self._name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                         else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(IPv4Address("127.0.0.1"))]),
                                            critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        stem = self.dir / self._slug(label or cn)
        cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_key_pem(key))
        key_path.chmod(0o600)
        return Issued(cert_path, key_path)
