"""A state's OpenTofu encryption configuration: the ``encryption`` block OpenTofu reads, in its JSON
form, checked once when it is stored (``kl state set NAME --encryption-config FILE``) and resolved
at each use.

Accepted: the block itself (``{"key_provider": …, "method": …, "state": …}``), or the block under
``"encryption"`` or ``"terraform": {"encryption": …}`` (a ``.tf.json`` file). kl implements what it
can do itself: the ``pbkdf2`` key provider and the ``aes_gcm`` method, with ``state.fallback``
chains for keys being rotated. A passphrase is a reference, ``{"env": "NAME"}``, resolved when a
state is read or written and never stored resolved: the block is kept exactly as given.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kilolock.errors import KlError, one_line
from kilolock.redact import Redactor, env_ref

SUPPORTED = 'key_provider "pbkdf2" with method "aes_gcm"'
HASH_FUNCTIONS = ("sha256", "sha512")
# OpenTofu's pbkdf2 defaults and floors (keyprovider/pbkdf2: descriptor.go, config_constants.go).
DEFAULT_KEY_LENGTH = 32
DEFAULT_ITERATIONS = 600_000
DEFAULT_HASH = "sha512"
DEFAULT_SALT_LENGTH = 32
MIN_ITERATIONS = 200_000
MIN_PASSPHRASE = 16
AES_KEY_LENGTHS = (16, 24, 32)
MAX_FALLBACKS = 8

_REFERENCE = re.compile(r"^(?:\$\{)?\s*(key_provider|method)\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)\s*(?:\})?$")


class EncryptionConfigError(KlError):
    """An encryption configuration kl cannot use: one line naming where and what."""


@dataclass(frozen=True)
class KeyProvider:
    """A pbkdf2 key provider: its passphrase still a reference (the variable's name)."""

    name: str
    passphrase_env: str
    key_length: int
    iterations: int
    hash_function: str
    salt_length: int
    meta_key: str  # where its metadata sits in the envelope's "meta"


@dataclass(frozen=True)
class Method:
    """An aes_gcm method and the key provider it takes its keys from."""

    name: str
    keys: KeyProvider
    aad: bytes


@dataclass(frozen=True)
class EncryptionConfig:
    """The state target: ``methods[0]`` encrypts, every one of them is tried to decrypt."""

    methods: tuple[Method, ...]
    enforced: bool

    def env_names(self) -> list[str]:
        return list(dict.fromkeys(m.keys.passphrase_env for m in self.methods))


def _block(doc: Any, origin: str) -> dict[str, Any]:
    """The encryption block out of what a user may write around it."""
    if not isinstance(doc, dict):
        raise EncryptionConfigError(f"{origin}: expected a JSON object (the encryption block)")
    terraform = doc.get("terraform")
    if isinstance(terraform, list) and len(terraform) == 1:
        terraform = terraform[0]
    if isinstance(terraform, dict):
        doc = terraform
    if "encryption" in doc:
        doc = doc["encryption"]
        if isinstance(doc, list) and len(doc) == 1:
            doc = doc[0]
        if not isinstance(doc, dict):
            raise EncryptionConfigError(f"{origin}: encryption: expected an object")
    block: dict[str, Any] = doc
    if "state" not in block:
        raise EncryptionConfigError(f"{origin}: no \"state\" block: kl reads the encryption of the state target "
                                    "(\"state\": {\"method\": \"method.aes_gcm.NAME\"})")
    return block


def _labelled(doc: dict[str, Any], kind: str, origin: str) -> dict[tuple[str, str], Any]:
    """``kind "TYPE" "NAME" {…}`` blocks as .tf.json nests them: {TYPE: {NAME: {…}}}."""
    found: dict[tuple[str, str], Any] = {}
    blocks = doc.get(kind, {})
    if not isinstance(blocks, dict):
        raise EncryptionConfigError(f"{origin}.{kind}: expected an object {{\"TYPE\": {{\"NAME\": {{…}}}}}}")
    for type_, named in blocks.items():
        if isinstance(named, list) and len(named) == 1:
            named = named[0]
        if not isinstance(named, dict):
            raise EncryptionConfigError(f"{origin}.{kind}.{type_}: expected an object {{\"NAME\": {{…}}}}")
        for name, body in named.items():
            if isinstance(body, list) and len(body) == 1:
                body = body[0]
            if not isinstance(body, dict):
                raise EncryptionConfigError(f"{origin}.{kind}.{type_}.{name}: expected an object")
            found[(type_, name)] = body
    return found


def _reference(value: Any, kind: str, where: str) -> tuple[str, str]:
    match = _REFERENCE.match(value) if isinstance(value, str) else None
    if match is None or match.group(1) != kind:
        raise EncryptionConfigError(f"{where}: expected a reference to a {kind}, such as \"{kind}.TYPE.NAME\"")
    return match.group(2), match.group(3)


def _int(body: dict[str, Any], key: str, default: int, where: str) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise EncryptionConfigError(f"{where}.{key}: expected a whole number above zero")
    return value


def _key_provider(type_: str, name: str, body: dict[str, Any], origin: str) -> KeyProvider:
    where = f"{origin}.key_provider.{type_}.{name}"
    if type_ != "pbkdf2":
        raise EncryptionConfigError(f"{where}: key provider {type_!r} is not supported; kl supports {SUPPORTED}")
    if "chain" in body:
        raise EncryptionConfigError(f"{where}.chain: a chained key provider is not supported; kl supports {SUPPORTED} "
                                    "with a passphrase")
    unknown = sorted(set(body) - {"passphrase", "key_length", "iterations", "hash_function", "salt_length",
                                  "encrypted_metadata_alias"})
    if unknown:
        raise EncryptionConfigError(f"{where}: unknown setting {unknown[0]!r}")
    env = env_ref(body.get("passphrase"))
    if env is None:
        raise EncryptionConfigError(f"{where}.passphrase: must be a reference {{\"env\": \"VARIABLE\"}}: kl resolves it "
                                    "when it reads or writes the state and never stores a passphrase")
    hash_function = body.get("hash_function", DEFAULT_HASH)
    if hash_function not in HASH_FUNCTIONS:
        raise EncryptionConfigError(f"{where}.hash_function: must be one of {', '.join(HASH_FUNCTIONS)}")
    iterations = _int(body, "iterations", DEFAULT_ITERATIONS, where)
    if iterations < MIN_ITERATIONS:
        raise EncryptionConfigError(f"{where}.iterations: at least {MIN_ITERATIONS}, as OpenTofu requires")
    alias = body.get("encrypted_metadata_alias", "")
    if not isinstance(alias, str):
        raise EncryptionConfigError(f"{where}.encrypted_metadata_alias: expected a string")
    return KeyProvider(name, env, _int(body, "key_length", DEFAULT_KEY_LENGTH, where), iterations, hash_function,
                       _int(body, "salt_length", DEFAULT_SALT_LENGTH, where), alias or f"key_provider.pbkdf2.{name}")


def _aad(value: Any, where: str) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, list) or not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 255
                                              for b in value):
        raise EncryptionConfigError(f"{where}.aad: expected a list of byte values (0-255)")
    return bytes(value)


def parse_config(doc: Any, origin: str = "encryption config") -> EncryptionConfig:
    """The state target's methods, primary first then its fallbacks, from the block's JSON form."""
    block = _block(doc, origin)
    providers = {key: _key_provider(*key, body, origin) for key, body in _labelled(block, "key_provider", origin).items()}
    methods: dict[tuple[str, str], Method] = {}
    for (type_, name), body in _labelled(block, "method", origin).items():
        where = f"{origin}.method.{type_}.{name}"
        if type_ != "aes_gcm":
            raise EncryptionConfigError(f"{where}: method {type_!r} is not supported; kl supports {SUPPORTED}")
        provider_key = _reference(body.get("keys"), "key_provider", f"{where}.keys")
        if provider_key not in providers:
            raise EncryptionConfigError(f"{where}.keys: no key_provider.{'.'.join(provider_key)} in the configuration")
        provider = providers[provider_key]
        if provider.key_length not in AES_KEY_LENGTHS:
            raise EncryptionConfigError(f"{origin}.key_provider.pbkdf2.{provider.name}.key_length: aes_gcm takes a key of "
                                        f"{', '.join(map(str, AES_KEY_LENGTHS))} bytes, not {provider.key_length}")
        methods[(type_, name)] = Method(name, provider, _aad(body.get("aad"), where))
    target = block["state"]
    if isinstance(target, list) and len(target) == 1:
        target = target[0]
    where = f"{origin}.state"
    chain: list[Method] = []
    enforced = isinstance(target, dict) and target.get("enforced") is True
    while True:
        if not isinstance(target, dict):
            raise EncryptionConfigError(f"{where}: expected an object")
        method_key = _reference(target.get("method"), "method", f"{where}.method")
        if method_key[0] != "aes_gcm":
            raise EncryptionConfigError(f"{where}.method: method {method_key[0]!r} is not supported; kl supports {SUPPORTED}")
        if method_key not in methods:
            raise EncryptionConfigError(f"{where}.method: no method.{'.'.join(method_key)} in the configuration")
        chain.append(methods[method_key])
        target = target.get("fallback")
        if target is None:
            break
        if isinstance(target, list) and len(target) == 1:
            target = target[0]
        where += ".fallback"
        if len(chain) > MAX_FALLBACKS:
            raise EncryptionConfigError(f"{where}: more than {MAX_FALLBACKS} fallbacks")
    return EncryptionConfig(tuple(chain), enforced)


def load_config_file(path: str) -> dict[str, Any]:
    """The JSON document of an encryption configuration file, checked; what is stored is the
    document as given (its passphrases stay references)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise EncryptionConfigError(f"{path}: cannot read it: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise EncryptionConfigError(f"{path}: not JSON (the encryption block's JSON form): {one_line(str(exc))}") from None
    parse_config(doc, path)
    if not isinstance(doc, dict):  # parse_config refused it already; for the type checker
        raise EncryptionConfigError(f"{path}: expected a JSON object")
    return doc


@dataclass(frozen=True)
class Passphrases:
    """The passphrases of a configuration, resolved for one use: variable name -> value."""

    values: dict[str, str]

    def __repr__(self) -> str:  # never the values themselves, whatever prints this
        return f"Passphrases({sorted(self.values)})"


def resolve(config: EncryptionConfig, where: str, secrets: Redactor | None = None) -> Passphrases:
    """Each passphrase from its environment variable; each value becomes one of SECRETS, so a
    message that happens to echo one is masked."""
    import os

    values: dict[str, str] = {}
    for name in config.env_names():
        value = os.environ.get(name)
        if value is None:
            raise KlError(f"{where}: the encryption passphrase's environment variable {name} is not set")
        if len(value) < MIN_PASSPHRASE:
            raise KlError(f"{where}: the encryption passphrase in {name} is shorter than {MIN_PASSPHRASE} characters, "
                          "which OpenTofu refuses")
        if secrets is not None:
            secrets.add(value)
        values[name] = value
    return Passphrases(values)
