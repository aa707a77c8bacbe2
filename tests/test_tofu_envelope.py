"""kilolock.encryption against real OpenTofu: what OpenTofu encrypts kl decrypts (with the primary
key or a fallback), and what kl encrypts OpenTofu reads."""
from __future__ import annotations

import json

import pytest

from kilolock import encryption
from kilolock.encryption import config as enc_config
from kilolock.encryption import envelope as enc_envelope
from kilolock.errors import KlError
from kit.tfcli import tool_binary
from kit.tofuenc import ENV, PASSPHRASE, SECRET, apply_local, kl_config, tofu

TOOLS = ("tofu-1.8.5", "tofu-1.12.6")
OLD_ENV = "KL_TEST_TOFU_OLD_PASSPHRASE"


def _keys(monkeypatch: pytest.MonkeyPatch, **kw: str) -> encryption.Keys:
    monkeypatch.setenv(ENV, PASSPHRASE)
    return encryption.keys_for(kl_config(**kw), False, "test")


@pytest.mark.parametrize("tool", TOOLS)
def test_what_opentofu_encrypts_kl_decrypts_and_what_kl_encrypts_opentofu_reads(tool, tmp_path, monkeypatch):
    tool_binary(tool)
    envelope = apply_local(tool, tmp_path, {"a": SECRET})
    keys = _keys(monkeypatch)
    opened = encryption.open_envelope(envelope, keys, "terraform.tfstate")
    plain = json.loads(opened.plaintext)
    assert plain["serial"] == envelope["serial"] and plain["lineage"] == envelope["lineage"]
    assert plain["resources"][0]["instances"][0]["attributes"]["sensitive_content"] == SECRET

    plain["serial"] += 1
    sealed = keys.seal(json.dumps(plain).encode(), plain["serial"], plain["lineage"])
    assert SECRET.encode() not in sealed and PASSPHRASE.encode() not in sealed
    (tmp_path / "terraform.tfstate").write_bytes(sealed)
    assert tofu(tool, tmp_path, "plan", "-detailed-exitcode", "-input=false", check=False).returncode == 0
    pulled = json.loads(tofu(tool, tmp_path, "state", "pull").stdout)
    assert pulled["serial"] == plain["serial"]  # OpenTofu decrypted kl's envelope, not an older copy


@pytest.mark.parametrize("tool", TOOLS)
def test_a_rotated_key_decrypts_through_its_fallback_and_a_wrong_one_says_so(tool, tmp_path, monkeypatch):
    tool_binary(tool)
    envelope = apply_local(tool, tmp_path, {"a": SECRET})
    # Rotated as OpenTofu's documentation does it: a new key provider and method are the primary,
    # the ones OpenTofu wrote with ("main") the fallback; the new primary cannot open this envelope.
    monkeypatch.setenv(OLD_ENV, PASSPHRASE)
    monkeypatch.setenv("KL_TEST_NEW", "a-new-passphrase-after-rotation")
    block = {"key_provider": {"pbkdf2": {"new": {"passphrase": {"env": "KL_TEST_NEW"}},
                                         "main": {"passphrase": {"env": OLD_ENV}}}},
             "method": {"aes_gcm": {"new": {"keys": "${key_provider.pbkdf2.new}"},
                                    "main": {"keys": "${key_provider.pbkdf2.main}"}}},
             "state": {"method": "${method.aes_gcm.new}", "fallback": {"method": "${method.aes_gcm.main}"}}}
    rotated = encryption.keys_for({"encryption": block}, False, "test")
    assert json.loads(encryption.open_envelope(envelope, rotated, "f").plaintext)["serial"] == envelope["serial"]
    sealed = json.loads(rotated.seal(b"{}", 9, "l"))
    assert list(sealed["meta"]) == ["key_provider.pbkdf2.new"]  # sealed with the new primary

    monkeypatch.setenv(ENV, "a-wrong-passphrase-of-enough-length")
    wrong = encryption.keys_for(kl_config(), False, "test")
    with pytest.raises(encryption.DecryptError) as caught:
        encryption.open_envelope(envelope, wrong, "f")
    assert str(caught.value) == (
        "f: the configured keys (method.aes_gcm.main) do not decrypt it: a wrong passphrase, or a key rotated without "
        "a fallback (the envelope holds keys for key_provider.pbkdf2.main)")


def test_the_configuration_reads_opentofu_defaults_and_refuses_what_kl_cannot_do():
    cfg = enc_config.parse_config(kl_config())
    provider = cfg.methods[0].keys
    assert (provider.key_length, provider.iterations, provider.hash_function, provider.salt_length) == (
        32, 600_000, "sha512", 32)
    assert cfg.enforced and cfg.env_names() == [ENV]
    low = kl_config()
    low["terraform"]["encryption"]["key_provider"]["pbkdf2"]["main"]["iterations"] = 1000
    with pytest.raises(enc_config.EncryptionConfigError, match="iterations: at least 200000"):
        enc_config.parse_config(low)
    with pytest.raises(enc_config.EncryptionConfigError, match="no \"state\" block"):
        enc_config.parse_config({"encryption": {}})


def test_a_passphrase_is_never_in_a_repr_or_a_message(monkeypatch):
    monkeypatch.setenv(ENV, "tiny-pw")
    with pytest.raises(KlError) as caught:
        encryption.keys_for(kl_config(), False, "state 's'")
    assert "tiny-pw" not in str(caught.value) and "shorter than 16" in str(caught.value)
    monkeypatch.setenv(ENV, PASSPHRASE)
    assert PASSPHRASE not in repr(encryption.keys_for(kl_config(), False, "s"))
    assert enc_envelope.NONCE_LENGTH == 12
