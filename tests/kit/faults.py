"""Shared pieces of the reliability suite: the fault-injecting fake provider installed in a
plugin-cache layout, states that use it, and what the database says about the runs."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import psycopg

from kit.paths import FAKE_PROVIDER, REPO

FAKE_SOURCE = "registry.terraform.io/hashicorp/fake"


def install_fake(root: Path, events: Path, version: str = "1.0.0", **env: str) -> Path:
    """Write the fake as hashicorp/fake VERSION under ROOT/plugins; returns the cache directory.
    ENV goes into the wrapper script, so it selects the fake's behaviour for every launch."""
    d = root / "plugins" / FAKE_SOURCE / version / "linux_amd64"
    d.mkdir(parents=True, exist_ok=True)
    exe = d / f"terraform-provider-fake_v{version}_x5"
    exports = {"PYTHONPATH": str(REPO), "FAKE_EVENT_LOG": str(events), **env}
    exe.write_text("#!/bin/sh\n" + "".join(f"export {k}='{v}'\n" for k, v in exports.items())
                   + f'exec "{sys.executable}" "{FAKE_PROVIDER}" "$@"\n')
    exe.chmod(0o755)
    return root / "plugins"


def fake_state(types: list[str], serial: int = 1, lineage: str = "fake-lineage", secret: str = "hunter2") -> bytes:
    """One fake resource per entry of TYPES (the type selects the fake's answer to ReadResource)."""
    return json.dumps({"version": 4, "terraform_version": "1.0.3", "serial": serial, "lineage": lineage, "outputs": {},
                       "resources": [{"mode": "managed", "type": t, "name": f"r{n}", "provider": f'provider["{FAKE_SOURCE}"]',
                                      "instances": [{"schema_version": 2, "sensitive_attributes": [],
                                                     "attributes": {"id": f"id{n}", "value": "v", "secret": secret, "rule": []}}]}
                                     for n, t in enumerate(types)]}).encode()


def newest_run(db_url: str) -> tuple[Any, ...] | None:
    """(status, error_summary, to_version_id, finished_at) of the newest refresh run; None before any run."""
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT status, error_summary, to_version_id, finished_at FROM refresh_runs"
                         " ORDER BY started_at DESC LIMIT 1").fetchone()


def last_run(db_url: str) -> tuple[Any, ...]:
    """newest_run, for a test that has made a run: fails when there is none."""
    run = newest_run(db_url)
    assert run is not None, "no refresh run was recorded"
    return run


def serials(db_url: str, state: str = "prod") -> list[int]:
    """The serials of Terraform's versions of STATE (an observation keeps its base's serial)."""
    with psycopg.connect(db_url) as c:
        return [r[0] for r in c.execute("SELECT v.serial FROM state_versions v JOIN states s ON s.id = v.state_id"
                                        " WHERE s.name = %s AND v.kind = 'terraform' ORDER BY v.serial", (state,))]


def observations(db_url: str, state: str = "prod") -> list[str]:
    """The labels of STATE's observations (v7.3), in the order recorded."""
    with psycopg.connect(db_url) as c:
        return [f"v{serial}.{number}" for serial, number in c.execute(
            "SELECT v.serial, v.observation_number FROM state_versions v JOIN states s ON s.id = v.state_id"
            " WHERE s.name = %s AND v.kind = 'observation' ORDER BY v.seq", (state,))]
