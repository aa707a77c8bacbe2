"""Shared by the provider tests and benches: where the real provider binaries are, and process checks."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("KL_TEST_CACHE", Path.home() / ".cache" / "kilolock-test"))
PLUGIN_CACHE = CACHE / "plugin-cache"
FAKE = Path(__file__).with_name("fake_provider.py")


@dataclass(frozen=True)
class RealProvider:
    type: str
    version: str
    protocol: int
    binary_name: str

    @property
    def source(self) -> str:
        return f"registry.terraform.io/hashicorp/{self.type}"

    @property
    def path(self) -> Path:
        return PLUGIN_CACHE / "registry.terraform.io/hashicorp" / self.type / self.version / "linux_amd64" / self.binary_name


RANDOM_V = "1.3.2-0.20260824155315-e1092b0cfc07"
LOCAL_V = "1.4.1-0.20260513075820-3561e410f9fe"
REAL_PROVIDERS = [
    RealProvider("null", "2.1.2", 5, "terraform-provider-null_v2.1.2_x4"),
    RealProvider("time", "0.14.2", 5, "terraform-provider-time_v0.14.2_x5"),
    RealProvider("simple", "1.5.7", 6, "terraform-provider-simple_v1.5.7_x6"),
    RealProvider("random", RANDOM_V, 5, f"terraform-provider-random_v{RANDOM_V}_x5"),
    RealProvider("local", LOCAL_V, 5, f"terraform-provider-local_v{LOCAL_V}_x5"),
]
BY_TYPE = {p.type: p for p in REAL_PROVIDERS}


def require(provider: RealProvider) -> str:
    if not os.access(provider.path, os.X_OK):
        pytest.fail(f"provider binary {provider.path} is missing: run scripts/test-providers.sh")
    return str(provider.path)




def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def survivors(pids: list[int]) -> list[int]:
    return [pid for pid in pids if running(pid)]


_launched: list[tuple[int, str]] = []


def launched_pids() -> list[int]:
    return [pid for pid, _ in _launched]


def stderr_shows(client: object, text: str, timeout: float = 5.0) -> bool:
    """Waits until ``text`` appears in the plugin's drained stderr (drained by a background thread)."""
    import time

    proc = client.connection.process  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in line for line in proc.stderr_tail()):
            return True
        time.sleep(0.02)
    return False
