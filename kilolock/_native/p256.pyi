"""The AutoMTLS client key and its certificate's signature on aws-lc (codec_rs/src/p256.rs)."""

__version__: str

def generate() -> tuple[bytes, bytes]:
    """A fresh P-256 key (aws-lc): (private scalar, 32 bytes big-endian; public point, 65 bytes
    uncompressed). Used by kilolock.provider.certs for the AutoMTLS client certificate."""

def sign(private: bytes, point: bytes, message: bytes) -> bytes:
    """ECDSA-with-SHA-256 of MESSAGE by the key (PRIVATE, POINT): a DER Ecdsa-Sig-Value. Raises
    ValueError when the two are not one P-256 key pair."""
