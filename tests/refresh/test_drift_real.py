"""Drift you can trust, end to end (issue 12): a Terraform 1.0.3 state, real providers, real refreshes.

The first refresh after an import observes schema-sensitive marks only: no drift, and the lifecycle
index (Terraform's) is left as it is. One out-of-band deletion seen by two refreshes (two
observations of Terraform's version) is one `deleted` record whose first detection stays fixed; `kl status` counts exactly what `kl drift` lists; the next apply
resolves it and `kl drift --all` shows when and how.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import psycopg

from kit.paths import PLUGIN_CACHE
from kit.pg import one_row
from kit.tfworkspace import terraform

TWO = 'local_file.f["two"]'


def import_state(run_kl, ws: Path) -> int:
    r = run_kl("state", "import", "prod", str(ws / "terraform.tfstate"), "--source", "apply")
    assert r.returncode == 0, r.stderr
    # The local_file paths are relative to the workspace: refreshes read them from there, from anywhere.
    r = run_kl("state", "set", "prod", "--workdir", str(ws))
    assert r.returncode == 0, r.stderr
    return json.loads((ws / "terraform.tfstate").read_text())["serial"]


def kl_refresh(run_kl, ws: Path) -> tuple:
    r = run_kl("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "--format", "json", cwd=ws)
    assert r.stdout, r.stderr
    return r, json.loads(r.stdout)


def lifecycles(db_url: str) -> dict[tuple[str, str], tuple]:
    with psycopg.connect(db_url) as c:
        return {(a, d): (rid, create, marks) for a, d, rid, create, marks in c.execute(
            "SELECT address, deposed, id, create_serial, sensitive_attributes FROM resources WHERE delete_serial IS NULL")}


def drift_doc(run_kl, *extra: str) -> dict:
    r = run_kl("drift", "prod", "--format", "json", *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def open_drift(run_kl) -> int:
    r = run_kl("status", "prod", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["open_drift"]


def observation_time(db_url: str, serial: int, number: int) -> datetime:
    """When observation v{serial}.{number} was recorded."""
    with psycopg.connect(db_url) as c:
        created: datetime = one_row(c, "SELECT created_at FROM state_versions WHERE kind = 'observation' AND serial = %s "
                                       "AND observation_number = %s", (serial, number))[0]
        return created


def marks(doc: dict, type_: str) -> list:
    [inst] = next(r for r in doc["resources"] if r["type"] == type_)["instances"]
    return inst.get("sensitive_attributes") or []


def test_marks_only_refresh_then_one_deletion_is_one_record_until_the_apply_resolves_it(run_kl, db_url, workspace: Path):
    serial = import_state(run_kl, workspace)
    imported = lifecycles(db_url)

    # 1. The first refresh observes schema-sensitive marks, nothing else.
    r, out = kl_refresh(run_kl, workspace)
    assert r.returncode == 0 and (out["status"], out["resources_changed"], out["observation"]) == ("succeeded", 0, f"v{serial}.1"), out
    assert lifecycles(db_url) == imported  # Terraform's index: same rows, opened-at and marks unchanged
    observed = json.loads(run_kl("state", "pull", "prod", "--observed").stdout)
    terraforms = json.loads(run_kl("state", "pull", "prod").stdout)
    assert marks(observed, "random_password") != marks(terraforms, "random_password")  # the marks were observed
    assert ["result"] in [[s["value"] for s in p] for p in marks(observed, "random_password")]
    with psycopg.connect(db_url) as c:
        assert one_row(c, "SELECT count(*) FROM observed_objects")[0] == 0  # marks alone are not a difference
    assert drift_doc(run_kl)["drift"] == [] and open_drift(run_kl) == 0

    # 2. An out-of-band deletion, seen by two refreshes.
    (workspace / "out" / "two.txt").unlink()
    r, out = kl_refresh(run_kl, workspace)
    assert out["status"] == "succeeded" and out["changed_addresses"] == [TWO], out
    assert (out["to_serial"], out["observation"]) == (None, f"v{serial}.2"), out
    detected = out["from_serial"]  # an observation carries the serial of the Terraform version it read
    assert detected == serial
    first = drift_doc(run_kl)
    r, out = kl_refresh(run_kl, workspace)
    # Still gone: against Terraform's version that is a change, and the same finding as the record's.
    assert out["status"] == "succeeded" and out["changed_addresses"] == [TWO] and out["observation"] == f"v{serial}.3", out
    second = drift_doc(run_kl)
    at = observation_time(db_url, serial, 2)
    found = f"v{serial}.2"  # the observation that found it; serials are Terraform's (an observation's, its base's)
    assert first["drift"][0]["first_detected"] == second["drift"][0]["first_detected"] == {
        "serial": detected, "version": found, "at": at.isoformat()}
    [entry] = second["drift"]
    assert datetime.fromisoformat(entry["first_detected"]["at"]).utcoffset() is not None  # a time with its zone
    assert entry["open_for_s"] >= 0 and entry["refresh_run_id"]
    assert {k: v for k, v in entry.items() if k not in ("open_for_s", "refresh_run_id")} == {
        "address": TWO, "deposed": None, "kind": "deleted", "type": "local_file", "status": "open",
        "detected_serial": detected, "detected_version": found, "detected_at": at.isoformat(),
        "first_detected": {"serial": detected, "version": found, "at": at.isoformat()}, "last_confirmed_serial": detected,
        "last_confirmed_version": f"v{serial}.3",
        "resolved": None, "ignored_by": None, "changed_attributes": None, "changes": []}
    assert (second["total"], second["open"], second["all"]) == (1, 1, False)
    assert open_drift(run_kl) == second["total"] == 1
    text = run_kl("drift", "prod").stdout.decode()
    assert text.startswith(f"{TWO}: deleted at {found} (first detected {found}, ") and text.count(TWO) == 1, text
    # kl status names the version kl drift names (the observation), not only its serial.
    status = run_kl("status", "prod").stdout.decode()
    assert f"open drift:   1 (oldest first detected {found}, open " in status, status
    assert json.loads(run_kl("status", "prod", "--format", "json").stdout)["open_drift_first_version"] == found

    # 3. Terraform applies from what kl holds and recreates the file: the drift is resolved.
    pulled = run_kl("state", "pull", "prod")
    (workspace / "terraform.tfstate").write_bytes(pulled.stdout)
    terraform(workspace, "apply", "-auto-approve")
    assert (workspace / "out" / "two.txt").exists()
    applied = import_state(run_kl, workspace)
    assert drift_doc(run_kl)["drift"] == [] and open_drift(run_kl) == 0
    everything = drift_doc(run_kl, "--all")
    assert (everything["total"], everything["open"], everything["all"]) == (1, 0, True)
    [done] = everything["drift"]
    assert (done["address"], done["kind"], done["status"], done["first_detected"]["serial"]) == (TWO, "deleted", "resolved", detected)
    assert (done["resolved"]["serial"], done["resolved"]["how"]) == (applied, "recreated")
    text = run_kl("drift", "prod", "--all").stdout.decode()
    assert f"resolved at v{applied} by recreated" in text, text
    assert serial == detected < applied
