"""OpenTofu's encrypted state envelope, opened and sealed as OpenTofu does it (internal/encryption:
base.go, keyprovider/pbkdf2, method/aesgcm).

The envelope is ``{"serial", "lineage", "meta", "encrypted_data", "encryption_version": "v0"}``:
``meta`` maps each key provider's storage key (``key_provider.pbkdf2.NAME``, or its
``encrypted_metadata_alias``) to base64 of its metadata's JSON (``salt`` in base64, ``iterations``,
``hash_function``, ``key_length``); ``encrypted_data`` is base64 of the 12-byte nonce followed by
the AES-GCM ciphertext and tag. The key is PBKDF2 of the passphrase with that salt. Sealing draws a
new salt and nonce, as every OpenTofu run does. ``cryptography`` is imported here only, when a
state with encryption configured is read or written.
"""
from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import os
from typing import Any

from kilolock.encryption.config import EncryptionConfig, KeyProvider, Method, Passphrases
from kilolock.errors import KlError

VERSION = "v0"
NONCE_LENGTH = 12  # Go's cipher.NewGCM: the standard nonce size


class DecryptError(KlError):
    """An envelope the configured keys do not open (no key material in the message)."""


@functools.lru_cache(maxsize=32)
def _derive(passphrase: str, salt: bytes, iterations: int, hash_function: str, key_length: int) -> bytes:
    # 600,000 iterations take a fraction of a second: an apply's several writes (kl serve) and a
    # refresh's read and commit share one salt, so each derivation is done once.
    return hashlib.pbkdf2_hmac(hash_function, passphrase.encode("utf-8"), salt, iterations, key_length)


def _meta_of(doc: dict[str, Any], provider: KeyProvider, where: str) -> tuple[bytes, int, str, int] | None:
    """The salt, iterations, hash function and key length the envelope records for PROVIDER."""
    meta = doc.get("meta")
    raw = meta.get(provider.meta_key) if isinstance(meta, dict) else None
    if raw is None:
        return None
    try:
        fields = json.loads(base64.b64decode(raw, validate=True))
        salt = base64.b64decode(fields["salt"], validate=True)
        iterations, hash_function, key_length = fields["iterations"], fields["hash_function"], fields["key_length"]
    except (binascii.Error, ValueError, TypeError, KeyError):
        raise DecryptError(f"{where}: meta.{provider.meta_key} is not pbkdf2 key metadata") from None
    if (not isinstance(iterations, int) or not isinstance(key_length, int) or hash_function not in ("sha256", "sha512")
            or not salt or iterations <= 0 or key_length not in (16, 24, 32)):
        raise DecryptError(f"{where}: meta.{provider.meta_key} is not pbkdf2 key metadata kl can use")
    return salt, iterations, hash_function, key_length


def decrypt(doc: dict[str, Any], config: EncryptionConfig, passphrases: Passphrases, where: str) -> bytes:
    """The plaintext state of envelope DOC, tried with each method of CONFIG in turn (the primary,
    then its fallbacks), as OpenTofu does."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if doc.get("encryption_version") != VERSION:
        raise DecryptError(f"{where}: encryption_version {doc.get('encryption_version')!r} is not one kl reads "
                           f"(only {VERSION!r})")
    data = doc.get("encrypted_data")
    try:
        sealed = base64.b64decode(data if isinstance(data, str) else "", validate=True)
    except (binascii.Error, ValueError):
        raise DecryptError(f"{where}: encrypted_data is not base64") from None
    if len(sealed) <= NONCE_LENGTH:
        raise DecryptError(f"{where}: encrypted_data is too short to be AES-GCM output")
    tried: list[str] = []
    for method in config.methods:
        meta = _meta_of(doc, method.keys, where)
        tried.append(f"method.aes_gcm.{method.name}")
        if meta is None:
            continue
        salt, iterations, hash_function, key_length = meta
        key = _derive(passphrases.values[method.keys.passphrase_env], salt, iterations, hash_function, key_length)
        try:
            return AESGCM(key).decrypt(sealed[:NONCE_LENGTH], sealed[NONCE_LENGTH:], method.aad or None)
        except InvalidTag:
            continue
    recorded = sorted(doc["meta"]) if isinstance(doc.get("meta"), dict) else []
    raise DecryptError(f"{where}: the configured keys ({', '.join(tried)}) do not decrypt it: a wrong passphrase, or a key "
                       f"rotated without a fallback (the envelope holds keys for {', '.join(recorded) or 'no key provider'})")


def encrypt(plaintext: bytes, serial: int, lineage: str, config: EncryptionConfig, passphrases: Passphrases) -> bytes:
    """The envelope OpenTofu would write for PLAINTEXT with CONFIG's primary method: compact JSON,
    its fields in OpenTofu's order, serial and lineage in the clear beside the ciphertext."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    method: Method = config.methods[0]
    provider = method.keys
    salt = os.urandom(provider.salt_length)
    key = _derive(passphrases.values[provider.passphrase_env], salt, provider.iterations, provider.hash_function,
                  provider.key_length)
    nonce = os.urandom(NONCE_LENGTH)
    sealed = nonce + AESGCM(key).encrypt(nonce, plaintext, method.aad or None)
    meta = json.dumps({"salt": base64.b64encode(salt).decode(), "iterations": provider.iterations,
                       "hash_function": provider.hash_function, "key_length": provider.key_length}, separators=(",", ":"))
    envelope = {"serial": serial, "lineage": lineage,
                "meta": {provider.meta_key: base64.b64encode(meta.encode()).decode()},
                "encrypted_data": base64.b64encode(sealed).decode(), "encryption_version": VERSION}
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
