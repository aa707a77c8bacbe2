"""Real states made by Terraform 1.0.3 (tests/fixtures/states, see its README): addresses, byte-exact
round trips and the lifecycle index over a 2000-instance state and its next version."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kilolock import tfstate
from kilolock.store import versions, writes

STATES = Path(__file__).resolve().parents[1] / "fixtures" / "states"
TERRAFORM = Path(os.environ.get("KL_TEST_CACHE", Path.home() / ".cache" / "kilolock-test")) / "bin" / "terraform-1.0.3"


def write(conn, path: Path, name="prod", source="apply"):
    raw = path.read_bytes()
    return writes.store_document(conn, name, tfstate.parse_state(raw, str(path)), raw, source=source, actor="t")


@pytest.mark.parametrize("fixture", ["varied.tfstate", "varied-v2.tfstate"])
def test_addresses_are_exactly_what_terraform_state_list_prints(fixture, tmp_path):
    if not TERRAFORM.exists():
        pytest.fail(f"{TERRAFORM} is missing: run scripts/test-terraform.sh", pytrace=False)
    listed = subprocess.run([str(TERRAFORM), "state", "list", f"-state={STATES / fixture}"], cwd=tmp_path,
                            capture_output=True, text=True, check=True,
                            env={**os.environ, "TF_CLI_CONFIG_FILE": "/dev/null"}).stdout.splitlines()
    state = tfstate.parse_state((STATES / fixture).read_bytes())
    ours = [i.address for i in state.instances if not i.deposed]
    assert sorted(ours) == sorted(listed)
    assert len(ours) == len(set(ours)) > 20


@pytest.mark.parametrize("fixture", ["varied.tfstate", "varied-v2.tfstate", "big2000-v1.tfstate", "big2000-v2.tfstate"])
def test_pull_gives_back_terraforms_bytes(conn, fixture):
    write(conn, STATES / fixture, source="import")
    assert tfstate.pretty_state(versions.raw_state_text(conn, "prod")) == (STATES / fixture).read_text(encoding="utf-8")


def test_2000_instances_then_10_changed_and_5_removed(conn):
    changes = json.loads((STATES / "big2000-changes.json").read_text())
    v1 = write(conn, STATES / "big2000-v1.tfstate")
    assert (v1.opened, v1.closed) == (2000, 0)
    assert conn.execute("SELECT count(*) FROM resources WHERE delete_serial IS NULL").fetchone()[0] == 2000

    v2 = write(conn, STATES / "big2000-v2.tfstate")
    assert (v2.opened, v2.closed, v2.unchanged) == (10, 15, 1985)
    closed = conn.execute("SELECT address FROM resources WHERE closed_by_version_id = %s ORDER BY address", (v2.version.id,)).fetchall()
    opened = conn.execute("SELECT address FROM resources WHERE opened_by_version_id = %s ORDER BY address", (v2.version.id,)).fetchall()
    assert [a for (a,) in closed] == sorted(changes["changed"] + changes["removed"])
    assert [a for (a,) in opened] == sorted(changes["changed"])
    assert conn.execute("SELECT count(*) FROM resources WHERE delete_serial IS NULL").fetchone()[0] == 1995
    # Terraform's own serials: the second apply advanced the same lineage.
    assert v2.version.serial > v1.version.serial and v2.version.lineage == v1.version.lineage
