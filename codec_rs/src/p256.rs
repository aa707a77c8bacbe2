//! ECDSA P-256 for kl's AutoMTLS client certificate (kilolock/provider/certs.py builds the
//! certificate; this makes its key and its one signature). aws-lc already signs every TLS handshake
//! here, and does this ~100x faster than the Python big-integer fallback, which stays for builds
//! without the transport.

use aws_lc_rs::encoding::AsBigEndian;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};

/// A fresh key: (private scalar, 32 bytes big-endian; public point, 65 bytes uncompressed).
pub fn generate() -> Result<(Vec<u8>, Vec<u8>), String> {
    let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_ASN1_SIGNING).map_err(|_| "P-256 key generation failed".to_string())?;
    let private = pair.private_key().as_be_bytes().map_err(|_| "P-256 private key export failed".to_string())?;
    Ok((private.as_ref().to_vec(), pair.public_key().as_ref().to_vec()))
}

/// The ECDSA-with-SHA-256 signature of MESSAGE (DER Ecdsa-Sig-Value) by the key (PRIVATE, POINT).
pub fn sign(private: &[u8], point: &[u8], message: &[u8]) -> Result<Vec<u8>, String> {
    let pair = EcdsaKeyPair::from_private_key_and_public_key(&ECDSA_P256_SHA256_ASN1_SIGNING, private, point)
        .map_err(|e| format!("not a P-256 key pair: {e}"))?;
    let signature = pair.sign(&SystemRandom::new(), message).map_err(|_| "P-256 signing failed".to_string())?;
    Ok(signature.as_ref().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_ASN1};

    #[test]
    fn a_signature_verifies_under_the_generated_public_key_only() {
        let (private, point) = generate().unwrap();
        assert_eq!((private.len(), point.len(), point[0]), (32, 65, 4));
        let sig = sign(&private, &point, b"tbs").unwrap();
        assert!(UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &point).verify(b"tbs", &sig).is_ok());
        assert!(UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, &point).verify(b"tbS", &sig).is_err());
        let (_, other) = generate().unwrap();
        assert!(sign(&private, &other, b"tbs").unwrap_err().starts_with("not a P-256 key pair"));
    }
}
