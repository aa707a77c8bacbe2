"""Importing Terraform's file again after kl refreshed the state with `--commit` (issue 12): the
file's serial is now behind the version kl's refresh committed, so the import is refused, and the
one-line message says why (the two serials, who wrote the newer one) and what to do (`kl state
pull`). A refresh without --commit records an observation, which takes no serial
(test_observe_import_sync.py)."""
from __future__ import annotations

import json
from pathlib import Path

from kit.paths import PLUGIN_CACHE
from kit.tfworkspace import terraform


def test_reimporting_the_file_a_refresh_moved_past_says_why_and_what_to_do(run_kl, db_url, workspace: Path):
    tfstate = workspace / "terraform.tfstate"
    serial = json.loads(tfstate.read_text())["serial"]
    assert run_kl("state", "import", "prod", str(tfstate)).returncode == 0
    r = run_kl("refresh", "prod", "--commit", "--provider-search-path", str(PLUGIN_CACHE), "--workdir", str(workspace))
    assert r.returncode == 0, r.stderr

    r = run_kl("state", "import", "prod", str(tfstate))
    err = r.stderr.decode()
    assert r.returncode == 1 and r.stdout == b"" and err.count("\n") == 1, err
    assert err == (
        f"kl: {tfstate} has serial {serial}, which kl already holds as serial {serial}, behind state 'prod' at serial "
        f"{serial + 1}: kl has committed newer versions since (serial {serial + 1}, by kl refresh); nothing was "
        f"written. To go on from kl's copy: `kl state pull prod > {tfstate}` (--force does not help: it accepts "
        "another lineage, never an older serial)\n")
    versions = json.loads(run_kl("state", "versions", "prod", "--format", "json").stdout)["versions"]
    assert [(v["serial"], v["source"]) for v in versions] == [(serial, "import"), (serial + 1, "refresh")]

    # What the message says to do works: Terraform goes on from kl's copy, and its next file imports.
    tfstate.write_bytes(run_kl("state", "pull", "prod").stdout)
    with (workspace / "main.tf").open("a") as tf:
        tf.write('resource "null_resource" "after" {}\n')
    terraform(workspace, "apply", "-auto-approve")
    r = run_kl("state", "import", "prod", str(tfstate))
    assert r.returncode == 0, r.stderr
    new_serial = json.loads(tfstate.read_text())["serial"]
    assert new_serial > serial + 1 and r.stdout.decode().startswith(f"prod: stored serial {new_serial} (import)"), r.stdout


def test_a_file_that_went_its_own_way_from_the_same_serial_is_refused_as_diverged(run_kl, db_url, workspace: Path):
    tfstate = workspace / "terraform.tfstate"
    doc = json.loads(tfstate.read_text())
    assert run_kl("state", "import", "prod", str(tfstate)).returncode == 0
    assert run_kl("refresh", "prod", "--commit", "--provider-search-path", str(PLUGIN_CACHE), "--workdir", str(workspace)).returncode == 0
    doc["serial"] += 1  # Terraform applied from the old file meanwhile: the same serial as kl's refresh
    doc["outputs"] = {"x": {"value": "y", "type": "string"}}
    tfstate.write_text(json.dumps(doc))
    r = run_kl("state", "import", "prod", "-", input=tfstate.read_bytes())
    err = r.stderr.decode()
    assert r.returncode == 1 and err.count("\n") == 1, err
    assert err.startswith(f"kl: <stdin> has serial {doc['serial']}, behind state 'prod' at serial {doc['serial']}: "
                          f"kl's serial {doc['serial']} (by kl refresh) has other content"), err
    assert "`kl state pull prod > terraform.tfstate`" in err, err
