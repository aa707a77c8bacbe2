"""Shared by the provider tests and benches: the real provider binaries, and the plugins a session launched."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from kit.paths import LOCAL_V, PLUGIN_CACHE, RANDOM_V


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


# (pid, binary) of every plugin process launched in this session: tests/provider/conftest.py records
# them, and checks at the end that none is left.
launched: list[tuple[int, str]] = []


def launched_pids() -> list[int]:
    return [pid for pid, _ in launched]


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


# Our own test provider (tests/testprovider), as scripts/test-providers.sh installs it.
TESTPROVIDER_V = "0.1.0"


def our_provider(type_: str) -> str:
    """The binary of the testfw (framework, protocol 6) or testsdk (SDKv2, protocol 5) build."""
    proto = 6 if type_ == "testfw" else 5
    path = (PLUGIN_CACHE / "registry.terraform.io/kilolock" / type_ / TESTPROVIDER_V / "linux_amd64"
            / f"terraform-provider-{type_}_v{TESTPROVIDER_V}_x{proto}")
    if not os.access(path, os.X_OK):
        pytest.fail(f"the {type_} test provider is missing: run scripts/test-providers.sh {type_}", pytrace=False)
    return str(path)
