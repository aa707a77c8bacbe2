"""OpenTofu's client-side state encryption, as far as kl does it itself: the configuration
(config), the envelope (envelope), the line between what kl may index and what stays encrypted
(masking), and a state opened with its stored configuration (reading).

Imported only where a state has encryption configured; ``cryptography`` only when an envelope is
opened or sealed.
"""
from kilolock.encryption.config import SUPPORTED, EncryptionConfigError, load_config_file, parse_config
from kilolock.encryption.envelope import DecryptError
from kilolock.encryption.masking import SchemaSource
from kilolock.encryption.reading import Keys, Opened, index_text, keys_for, open_envelope

__all__ = ["SUPPORTED", "DecryptError", "EncryptionConfigError", "Keys", "Opened", "SchemaSource", "index_text", "keys_for",
           "load_config_file", "open_envelope", "parse_config"]
