"""Real OpenTofu writing encrypted state (pbkdf2 + aes_gcm) to a local file or through kl serve, and
the kl encryption configuration that reads it (tests of kilolock.encryption)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kit.paths import CACHE, LOCAL_V
from kit.tfcli import terraform_block, tool_binary

PASSPHRASE = "correct-horse-battery-staple-kl"  # pbkdf2 wants 16 characters or more
ENV = "KL_TEST_TOFU_PASSPHRASE"
SECRET = "kl-tofu-sensitive-7f3a9c"  # a local_file's sensitive_content: masked wherever kl keeps it


def encryption_hcl(passphrase: str = PASSPHRASE, fallback_passphrase: str | None = None,
                   migrating: bool = False) -> str:
    """The encryption block; MIGRATING adds OpenTofu's unencrypted fallback, which reads a state
    written before encryption was turned on (and writes it encrypted)."""
    if migrating:
        return f"""
  encryption {{
    key_provider "pbkdf2" "main" {{
      passphrase = "{passphrase}"
    }}
    method "aes_gcm" "main" {{
      keys = key_provider.pbkdf2.main
    }}
    method "unencrypted" "migrate" {{}}
    state {{
      method = method.aes_gcm.main
      fallback {{ method = method.unencrypted.migrate }}
    }}
  }}"""
    fallback = ""
    if fallback_passphrase is not None:
        fallback = f"""
    key_provider "pbkdf2" "old" {{
      passphrase = "{fallback_passphrase}"
    }}
    method "aes_gcm" "old" {{
      keys = key_provider.pbkdf2.old
    }}"""
    state_fallback = "\n      fallback { method = method.aes_gcm.old }" if fallback_passphrase is not None else ""
    return f"""
  encryption {{
    key_provider "pbkdf2" "main" {{
      passphrase = "{passphrase}"
    }}
    method "aes_gcm" "main" {{
      keys = key_provider.pbkdf2.main
    }}{fallback}
    state {{
      method   = method.aes_gcm.main
      enforced = true{state_fallback}
    }}
  }}"""


def main_tf(files: dict[str, str], backend_url: str | None = None, passphrase: str = PASSPHRASE,
            encryption: str | None = None) -> str:
    """local_file resources (name -> sensitive content) in a configuration with encrypted state
    (ENCRYPTION: the block, default encryption_hcl(PASSPHRASE); "" for a plain state)."""
    resources = "".join(f"""
resource "local_file" "{name}" {{
  filename          = "${{path.module}}/{name}.txt"
  sensitive_content = "{content}"
}}
""" for name, content in files.items())
    return terraform_block({"local": LOCAL_V}, backend_url,
                           encryption_hcl(passphrase) if encryption is None else encryption) + resources


def kl_config(env: str = ENV, fallback_env: str | None = None) -> dict:
    """The same encryption block as kl reads it: its JSON form, the passphrase a reference."""
    providers = {"main": {"passphrase": {"env": env}}}
    methods = {"main": {"keys": "${key_provider.pbkdf2.main}"}}
    state: dict = {"method": "${method.aes_gcm.main}", "enforced": True}
    if fallback_env is not None:
        providers["old"] = {"passphrase": {"env": fallback_env}}
        methods["old"] = {"keys": "${key_provider.pbkdf2.old}"}
        state["fallback"] = {"method": "${method.aes_gcm.old}"}
    return {"terraform": {"encryption": {"key_provider": {"pbkdf2": providers}, "method": {"aes_gcm": methods},
                                         "state": state}}}


def write_kl_config(path: Path, **kw: str) -> Path:
    path.write_text(json.dumps(kl_config(**kw), indent=2))
    return path


def tofu(tool: str, workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {"TF_CLI_CONFIG_FILE": str(CACHE / "terraformrc"), "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1",
           "TF_HTTP_RETRY_MAX": "0", "PATH": "/usr/bin:/bin", "HOME": str(workdir)}
    r = subprocess.run([str(tool_binary(tool)), *args, "-no-color"] if args[0] != "state" else
                       [str(tool_binary(tool)), *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"{tool} {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def apply_local(tool: str, workdir: Path, files: dict[str, str]) -> dict:
    """OpenTofu applies FILES with its state encrypted in workdir/terraform.tfstate; the envelope."""
    (workdir / "main.tf").write_text(main_tf(files))
    tofu(tool, workdir, "init", "-input=false")
    tofu(tool, workdir, "apply", "-auto-approve", "-input=false")
    envelope = json.loads((workdir / "terraform.tfstate").read_text())
    assert envelope["encryption_version"] == "v0" and SECRET not in json.dumps(envelope)
    return envelope
