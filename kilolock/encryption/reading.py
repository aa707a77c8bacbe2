"""An OpenTofu-encrypted state opened for kl: the plaintext to refresh, and the document kl may
index (kilolock.encryption.masking draws that line), from a state's stored configuration."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kilolock import tfstate
from kilolock.encryption.config import EncryptionConfig, Passphrases, parse_config, resolve
from kilolock.encryption.envelope import DecryptError, decrypt, encrypt
from kilolock.encryption.masking import SchemaSource, mask_sensitive
from kilolock.redact import Redactor


@dataclass(frozen=True)
class Keys:
    """A state's encryption, resolved for one read or write."""

    config: EncryptionConfig
    passphrases: Passphrases
    store_decrypted_attributes: bool

    def seal(self, plaintext: bytes, serial: int, lineage: str) -> bytes:
        return encrypt(plaintext, serial, lineage, self.config, self.passphrases)


def keys_for(stored: dict[str, Any], store_decrypted_attributes: bool, where: str,
             secrets: Redactor | None = None) -> Keys:
    """The stored configuration with its passphrases resolved from this process's environment."""
    config = parse_config(stored, f"{where}: encryption config")
    return Keys(config, resolve(config, where, secrets), store_decrypted_attributes)


@dataclass(frozen=True)
class Opened:
    """An envelope decrypted: its whole state (never stored) and what kl indexes of it."""

    plaintext: bytes
    index_text: bytes
    index: tfstate.State


def index_text(plaintext: bytes, keys: Keys, where: str, schemas: SchemaSource | None = None) -> tuple[bytes, tfstate.State]:
    """The document kl may keep in its lifecycle index, and that document's instance index.
    SCHEMAS: the cached schemas of its resource types (store.history.cached_schemas); without them
    every value is masked."""
    doc = tfstate.load_json(plaintext, where)
    if not keys.store_decrypted_attributes:
        doc = mask_sensitive(doc, schemas)
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return text, tfstate.parse_state(doc, where, keep_objects=False)


def open_envelope(doc: dict[str, Any], keys: Keys, where: str, schemas: SchemaSource | None = None) -> Opened:
    """Decrypt envelope DOC; DecryptError or StateError (one line, no key material) when it cannot
    be read, or when its plaintext does not carry the serial and lineage written beside it. SCHEMAS
    as for index_text."""
    plaintext = decrypt(doc, keys.config, keys.passphrases, where)
    text, index = index_text(plaintext, keys, f"{where} (decrypted)", schemas)
    ids = tfstate.envelope_ids(doc, where)
    if ids is not None and (ids.serial, ids.lineage) != (index.serial, index.lineage):
        raise DecryptError(f"{where}: the envelope says serial {ids.serial}, lineage {ids.lineage}, its decrypted state "
                           f"serial {index.serial}, lineage {index.lineage}; OpenTofu refuses such a state too")
    return Opened(plaintext, text, index)
