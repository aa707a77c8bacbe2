"""An OpenTofu-encrypted state refreshed and drift-tracked like any other: real OpenTofu writes it
through kl serve or to a file kl imports, the real local provider reads it, an out-of-band deletion
is drift, the observation is kept encrypted, and what kl writes back when it is accepted is
encrypted as OpenTofu writes it: OpenTofu, with the same encryption configuration, reads kl's
version and plans from it."""
from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from kit.leaks import db_rows, leaks
from kit.paths import PLUGIN_CACHE
from kit.tfcli import tool_binary
from kit.tofuenc import ENV, PASSPHRASE, SECRET, apply_local, main_tf, tofu, write_kl_config

TOOLS = ("tofu-1.8.5", "tofu-1.12.6")
PASS = {ENV: PASSPHRASE}


def _refresh(run_kl, name: str, ws: Path, env: dict[str, str] | None = None) -> tuple:
    r = run_kl("refresh", name, "--provider-search-path", str(PLUGIN_CACHE), "--format", "json", cwd=ws,
               env=PASS if env is None else env)
    assert r.stdout, r.stderr
    return r, json.loads(r.stdout)


def _current(db_url: str, name: str) -> tuple[int, str, bool, str | None, str]:
    with psycopg.connect(db_url) as c:
        row = c.execute("""SELECT v.serial, v.source, v.encrypted, v.unindexed, v.raw_state::text FROM state_versions v
                           JOIN states s ON s.id = v.state_id WHERE s.name = %s AND v.kind = 'terraform'
                           ORDER BY serial DESC LIMIT 1""", (name,)).fetchone()
    assert row is not None
    return row


def _latest_observation(db_url: str, name: str) -> tuple[str, bool, str]:
    with psycopg.connect(db_url) as c:
        row = c.execute("""SELECT 'v' || v.serial || '.' || v.observation_number, v.encrypted, v.raw_state::text
                           FROM state_versions v JOIN states s ON s.id = v.state_id
                           WHERE s.name = %s AND v.kind = 'observation' ORDER BY seq DESC LIMIT 1""", (name,)).fetchone()
    assert row is not None
    return row


def _deleted_is_drift_and_accepted_encrypted(run_kl, db_url: str, name: str, ws: Path) -> int:
    """Delete a.txt behind OpenTofu's back; kl refresh finds it and keeps its observation
    encrypted; kl drift accept writes it as an encrypted version."""
    (ws / "a.txt").unlink()
    before = _current(db_url, name)
    r, out = _refresh(run_kl, name, ws)
    assert r.returncode == 0 and out["status"] == "succeeded", (out, r.stderr)
    assert out["changed_addresses"] == ["local_file.a"] and out["to_serial"] is None, out
    assert _current(db_url, name) == before
    label, encrypted, raw = _latest_observation(db_url, name)
    assert (label, encrypted) == (out["observation"], True)
    envelope = json.loads(raw)
    assert envelope["encryption_version"] == "v0" and envelope["serial"] == before[0]
    assert SECRET not in raw and "local_file" not in raw
    drift = json.loads(run_kl("drift", name, "--format", "json").stdout)["drift"]
    assert [(d["address"], d["kind"]) for d in drift] == [("local_file.a", "deleted")], drift

    accepted = run_kl("drift", "accept", name, env=PASS)
    assert accepted.returncode == 0, accepted.stderr
    serial, source, encrypted, unindexed, raw = _current(db_url, name)
    assert (serial, source, encrypted, unindexed) == (before[0] + 1, "refresh", True, None)
    envelope = json.loads(raw)
    assert envelope["encryption_version"] == "v0" and envelope["serial"] == serial
    assert SECRET not in raw and "local_file" not in raw
    assert json.loads(run_kl("drift", name, "--format", "json").stdout)["drift"] == []
    return serial


@pytest.mark.parametrize("tool", TOOLS)
def test_served_encrypted_state_refreshes_drifts_and_opentofu_reads_what_kl_wrote(tool, start_server, db_url, run_kl,
                                                                                tmp_path, monkeypatch):
    tool_binary(tool)
    name = "served"
    ws = tmp_path / "ws"
    ws.mkdir()
    cfg = write_kl_config(tmp_path / "enc.json")
    assert run_kl("state", "set", name, "--encryption-config", str(cfg), "--workdir", str(ws)).returncode == 0
    monkeypatch.setenv(ENV, PASSPHRASE)  # kl serve runs in this process
    server = start_server()
    url = f"{server.url}/states/{name}"
    (ws / "main.tf").write_text(main_tf({"a": SECRET, "b": SECRET}, url))
    tofu(tool, ws, "init", "-input=false")
    tofu(tool, ws, "apply", "-auto-approve", "-input=false")

    serial = _deleted_is_drift_and_accepted_encrypted(run_kl, db_url, name, ws)
    # OpenTofu decrypts kl's version (its serial, without local_file.a) with its own configuration.
    pulled = json.loads(tofu(tool, ws, "state", "pull").stdout)
    assert pulled["serial"] == serial and [r["name"] for r in pulled["resources"]] == ["b"], pulled

    # OpenTofu applies from kl's version (recreating a.txt), kl's refresh then finds nothing, and
    # OpenTofu plans clean from the version kl wrote.
    tofu(tool, ws, "apply", "-auto-approve", "-input=false")
    assert json.loads(run_kl("status", name, "--format", "json").stdout)["open_drift"] == 0
    r, out = _refresh(run_kl, name, ws)
    assert r.returncode == 0 and out["status"] == "succeeded" and out["changed_addresses"] == [], out
    assert tofu(tool, ws, "plan", "-detailed-exitcode", "-input=false", check=False).returncode == 0

    secrets = {"sensitive_content": SECRET, "passphrase": PASSPHRASE}
    assert not leaks(secrets, db_rows(db_url, exclude=frozenset()))
    assert not leaks(secrets, {"kl refresh": r.stdout + r.stderr})


@pytest.mark.parametrize("tool", TOOLS)
def test_imported_encrypted_file_refreshes_and_the_pulled_file_is_read_by_opentofu(tool, db_url, run_kl, tmp_path):
    tool_binary(tool)
    name = "imported"
    apply_local(tool, tmp_path, {"a": SECRET, "b": SECRET})
    cfg = write_kl_config(tmp_path / "enc.json")
    assert run_kl("state", "set", name, "--encryption-config", str(cfg), "--workdir", str(tmp_path)).returncode == 0
    r = run_kl("state", "import", name, str(tmp_path / "terraform.tfstate"), env=PASS)
    assert r.returncode == 0, r.stderr

    serial = _deleted_is_drift_and_accepted_encrypted(run_kl, db_url, name, tmp_path)
    # Both versions are indexed from their decrypted content: kl diffs them, sensitive values masked.
    diff = run_kl("state", "diff", name, "--format", "json")
    assert diff.returncode == 0, diff.stderr
    found = json.loads(diff.stdout)
    assert (found["to"], found["removed"], [i["address"] for i in found["instances"]]) == (serial, 1, ["local_file.a"]), found
    assert SECRET.encode() not in diff.stdout
    # refresh --all (and a worker's schedules) take a configured encrypted state like any other.
    many = run_kl("refresh", "--all", "--states", name, "--format", "json", env=PASS)
    assert many.returncode == 0, many.stderr
    assert [(r["state"], r["status"], r["observation"]) for r in json.loads(many.stdout)["results"]] == [
        (name, "succeeded", f"v{serial}.1")]
    pulled = run_kl("state", "pull", name)
    assert pulled.returncode == 0 and SECRET.encode() not in pulled.stdout
    (tmp_path / "terraform.tfstate").write_bytes(pulled.stdout)
    shown = json.loads(tofu(tool, tmp_path, "state", "pull").stdout)
    assert shown["serial"] == serial and [r["name"] for r in shown["resources"]] == ["b"], shown
    plan = tofu(tool, tmp_path, "plan", "-detailed-exitcode", "-input=false", check=False)
    assert plan.returncode == 2 and "local_file.a will be created" in plan.stdout, plan.stdout + plan.stderr


@pytest.mark.parametrize("tool", TOOLS)
def test_refresh_with_a_wrong_passphrase_is_one_line_and_commits_nothing(tool, db_url, run_kl, tmp_path):
    tool_binary(tool)
    apply_local(tool, tmp_path, {"a": SECRET})
    assert run_kl("state", "set", "s", "--encryption-config", str(write_kl_config(tmp_path / "enc.json")),
                  "--workdir", str(tmp_path)).returncode == 0
    assert run_kl("state", "import", "s", str(tmp_path / "terraform.tfstate"), env=PASS).returncode == 0
    before = _current(db_url, "s")
    wrong = "a-wrong-passphrase-of-enough-length"
    r, out = _refresh(run_kl, "s", tmp_path, env={ENV: wrong})
    assert r.returncode != 0 and out["status"] == "failed" and "do not decrypt it" in out["error"], out
    assert wrong not in r.stdout.decode() + r.stderr.decode() and "Traceback" not in r.stderr.decode()
    assert _current(db_url, "s") == before
