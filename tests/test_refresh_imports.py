"""What importing the modules of a `kl refresh` costs, beyond what they need: a small refresh spends
most of its time before the first read (benches/test_refresh_fixed_costs.py), so avoidable import
work is guarded here. Checked in a fresh interpreter that loads what refreshcmd and its run load.

- ``uuid`` is not imported: on Linux it imports ``platform`` (nine regex compiles, ~3 ms).
- Of ``kilolock.tfstate``, only what a refresh uses: its streamed index and version-3 upgrade (for
  `kl state import`) and its writer (for a pull) load on first use, ~1.3 ms together.
- Every dataclass has a docstring: without one, ``@dataclass`` writes one from
  ``inspect.signature`` of the class, ~60-90 us each at import (~3-4 ms over the 45 of a refresh).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kit.paths import REPO

_PROBE = """
import dataclasses, inspect, json, sys
import kilolock.cli, kilolock.cli.refreshcmd, kilolock.refresh.prelaunch, kilolock.refresh.factory, kilolock.refresh.service
import kilolock.refresh.orchestrator, kilolock.refresh.slots, kilolock.store.db, kilolock.store.locks
import kilolock.store.settings, kilolock.store.versions, kilolock.store.migrate, kilolock.store.notify
import kilolock.provider.client, kilolock.provider.connection
kilolock.store.locks.lock_info("OperationTypeRefresh", "me", "kl")
undocumented = []
for name, module in sorted(sys.modules.items()):
    if name == "kilolock" or name.startswith("kilolock."):
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name and dataclasses.is_dataclass(value):
                written = value.__name__ + str(inspect.signature(value)).replace(" -> None", "")
                if value.__doc__ == written:
                    undocumented.append(f"{name}.{value.__qualname__}")
print(json.dumps({"modules": sorted(sys.modules), "undocumented": undocumented}))
"""


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=60, check=True)
    found: dict[str, list[str]] = json.loads(r.stdout)
    assert "kilolock.refresh.orchestrator" in found["modules"]
    return found


def test_a_refresh_does_not_import_uuid_nor_platform(loaded):
    assert not set(loaded["modules"]) & {"uuid", "platform"}


def test_every_dataclass_a_refresh_imports_has_a_docstring(loaded):
    assert loaded["undocumented"] == []


def test_a_refresh_does_not_import_what_only_import_and_pull_use(loaded):
    assert "kilolock.tfstate.parse" in loaded["modules"]  # the measurement itself works
    later = {"kilolock.tfstate.streamed_index", "kilolock.tfstate.version3", "kilolock.tfstate.writer"}
    assert not set(loaded["modules"]) & later
