"""Real Terraform / OpenTofu CLIs pointed at a kl serve backend (helpers for test_real_clients)."""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from kit.clis import COMPILED, compiled_cli
from kit.paths import CACHE, PLUGIN_CACHE, REPO

NULL_PROVIDER = PLUGIN_CACHE / "registry.terraform.io/hashicorp/null/2.1.2"
TOOLS = ("terraform-1.0.3", "terraform-1.8.5", "terraform-1.12.2", "tofu-1.6.3", "tofu-1.8.5")


def tool_binary(tool: str) -> Path:
    """The CLI binary; Terraform 1.0.3 is fetched on demand (seconds), the compiled ones are waited
    for while a background build makes them (kit.clis), never built here."""
    if not NULL_PROVIDER.exists():
        pytest.fail(f"{NULL_PROVIDER} is missing: run scripts/test-providers.sh", pytrace=False)
    if tool in COMPILED:
        path = compiled_cli(tool)  # waits while a background build makes it
    else:
        path = CACHE / "bin" / tool
    if not path.exists() and tool == "terraform-1.0.3":
        subprocess.run(["bash", str(REPO / "scripts" / "test-terraform.sh"), tool], capture_output=True, timeout=600)
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/test-terraform.sh {tool} (a Go build; takes minutes)", pytrace=False)
    if not (CACHE / "terraformrc").exists():
        pytest.fail(f"{CACHE / 'terraformrc'} is missing: run scripts/test-terraform.sh", pytrace=False)
    return path


def http_backend(url: str) -> str:
    """The `backend "http"` block for kl serve's state URL: state, lock and unlock at one address."""
    return f"""
  backend "http" {{
    address        = "{url}"
    lock_address   = "{url}"
    unlock_address = "{url}"
  }}"""


def terraform_block(providers: dict[str, str], backend_url: str | None = None, extra: str = "") -> str:
    """A `terraform` block requiring PROVIDERS (hashicorp name -> version) by their full source
    address (OpenTofu's default registry differs, the filesystem mirror does not), with kl serve's
    backend at BACKEND_URL and EXTRA (e.g. an encryption block) inside it."""
    required = "".join(f'\n    {name} = {{ source = "registry.terraform.io/hashicorp/{name}", version = "{version}" }}'
                       for name, version in providers.items())
    backend = http_backend(backend_url) if backend_url is not None else ""
    return f"""
terraform {{
  required_providers {{{required}
  }}{backend}{extra}
}}
"""


def main_tf(url: str, resources: str) -> str:
    """A configuration with the null provider and kl serve's backend at URL, then RESOURCES."""
    return terraform_block({"null": "2.1.2"}, url) + resources + "\n"


def local_tf(url: str, body: str) -> str:
    """A configuration with the local provider (offline mirror) and kl serve's backend at URL, then BODY."""
    from kit.paths import LOCAL_V

    return terraform_block({"local": LOCAL_V}, url) + body


@dataclass
class Workspace:
    tool: str
    binary: Path
    dir: Path
    url: str
    username: str | None = None
    password: str | None = None

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(TF_CLI_CONFIG_FILE=str(CACHE / "terraformrc"), TF_IN_AUTOMATION="1", CHECKPOINT_DISABLE="1",
                   TF_HTTP_RETRY_MAX="0")
        env.pop("TF_LOG", None)
        if self.username is not None:
            env.update(TF_HTTP_USERNAME=self.username, TF_HTTP_PASSWORD=self.password or "")
        env.update(extra)
        return env

    def write(self, resources: str) -> None:
        (self.dir / "main.tf").write_text(main_tf(self.url, resources))

    def run(self, *args: str, check: bool = True, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        r = subprocess.run([str(self.binary), *args], cwd=self.dir, env=env or self.env(), capture_output=True,
                           text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, f"{self.tool} {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        return r

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        return subprocess.Popen([str(self.binary), *args], cwd=self.dir, env=env or self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)


def wait_for_lock_holder(db_url: str, state: str, holder: subprocess.Popen, timeout: float = 60) -> dict:
    """The lock info of ``state`` once the running ``holder`` (an apply) has taken it, read straight
    from PostgreSQL; fails the test if the holder exits or the timeout passes first."""
    import time

    import psycopg

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and holder.poll() is None:
        with psycopg.connect(db_url) as c:
            row = c.execute("SELECT l.info FROM state_locks l JOIN states s ON s.id = l.state_id WHERE s.name = %s",
                            (state,)).fetchone()
        if row is not None:
            return row[0]
        time.sleep(0.1)
    pytest.fail(f"the first apply never took the lock of {state}: exit {holder.poll()}", pytrace=False)
