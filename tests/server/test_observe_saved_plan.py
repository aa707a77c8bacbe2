"""A refresh never disturbs Terraform's own workflow: real Terraform and OpenTofu through kl serve
save a plan, kl refreshes the state (finding nothing, then a local_file deleted behind Terraform's
back), and the saved plan still applies: the refresh recorded observations, and the serial that
Terraform compares did not move. The apply's version resolves the drift; the next refresh finds
what is still different. Offline: the providers come from the filesystem mirror of
scripts/test-providers.sh."""
from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from kit.tfcli import Workspace, local_tf, tool_binary

TOOLS = ("terraform-1.8.5", "terraform-1.12.2", "tofu-1.8.5")


def _config(url: str, out: Path) -> str:
    return local_tf(url, f"""variable "v" {{
  default = "1"
}}
resource "local_file" "a" {{
  filename = "{out / 'a.txt'}"
  content  = "a-${{var.v}}"
}}
resource "local_file" "b" {{
  filename = "{out / 'b.txt'}"
  content  = "b"
}}
""")


def _served_serial(client, state: str) -> int:
    reply = client.request("GET", f"/states/{state}")
    assert reply.status == 200, reply.text
    return int(reply.json()["serial"])


def _open_drift(db_url: str, state: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT address, drift_kind, detected_serial FROM current_resource_drift WHERE state_name = %s "
                         "ORDER BY address", (state,)).fetchall()


def _refresh(run_kl, state: str, workdir: Path) -> dict:
    r = run_kl("refresh", state, "--workdir", str(workdir), "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


@pytest.mark.parametrize("tool", TOOLS)
def test_a_saved_plan_applies_after_refreshes_that_found_nothing_and_found_drift(tool, start_server, db_url, tmp_path,
                                                                                 run_kl):
    client = start_server()
    state = f"plan/{tool}"
    out = tmp_path / "files"
    out.mkdir()
    ws = Workspace(tool, tool_binary(tool), tmp_path / "ws", f"{client.url}/states/{state}")
    ws.dir.mkdir()
    (ws.dir / "main.tf").write_text(_config(ws.url, out))
    ws.run("init", "-input=false", "-no-color")
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    applied = _served_serial(client, state)
    ws.run("plan", "-var", "v=2", "-out=p.plan", "-input=false", "-no-color")  # waiting for approval

    found = _refresh(run_kl, state, ws.dir)
    assert (found["status"], found["resources_changed"], found["to_serial"]) == ("succeeded", 0, None)
    assert found["observation"] == f"v{applied}.1"
    assert _served_serial(client, state) == applied

    (out / "b.txt").unlink()  # behind Terraform's back
    found = _refresh(run_kl, state, ws.dir)
    assert (found["resources_changed"], found["to_serial"], found["observation"]) == (1, None, f"v{applied}.2")
    assert _open_drift(db_url, state) == [("local_file.b", "deleted", applied)]
    drift = run_kl("drift", state)
    assert drift.returncode == 0 and "local_file.b" in drift.stdout.decode() and "deleted" in drift.stdout.decode()
    assert _served_serial(client, state) == applied

    done = ws.run("apply", "-input=false", "-no-color", "p.plan", check=False)
    assert done.returncode == 0, f"the saved plan was refused:\n{done.stdout}\n{done.stderr}"
    assert (out / "a.txt").read_text() == "a-2"
    assert _served_serial(client, state) == applied + 1
    assert _open_drift(db_url, state) == []  # Terraform's new version resolves what was open against the old one

    # The saved plan did not recreate b: the next refresh finds it still gone, against the new version.
    found = _refresh(run_kl, state, ws.dir)
    assert found["observation"] == f"v{applied + 1}.1"
    assert _open_drift(db_url, state) == [("local_file.b", "deleted", applied + 1)]


def _four_files(url: str, out: Path) -> str:
    files = "".join(f'resource "local_file" "{n}" {{\n  filename = "{out / n}.txt"\n  content  = "{n}"\n}}\n'
                    for n in ("a", "b", "c", "d"))
    return _config(url, out).split('variable "v"')[0] + files


@pytest.mark.parametrize("tool", ("terraform-1.12.2", "tofu-1.8.5"))
def test_an_accepted_observation_is_what_terraform_reads_next(tool, start_server, db_url, tmp_path, run_kl):
    client = start_server()
    state = f"accept/{tool}"
    out = tmp_path / "files"
    out.mkdir()
    ws = Workspace(tool, tool_binary(tool), tmp_path / "ws", f"{client.url}/states/{state}")
    ws.dir.mkdir()
    (ws.dir / "main.tf").write_text(_four_files(ws.url, out))
    ws.run("init", "-input=false", "-no-color")
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    applied = _served_serial(client, state)
    (out / "b.txt").unlink()
    (out / "c.txt").unlink()
    assert _refresh(run_kl, state, ws.dir)["resources_changed"] == 2
    # Terraform, not refreshing, still believes in both: the observation is kl's, not Terraform's.
    assert ws.run("plan", "-refresh=false", "-detailed-exitcode", "-input=false", "-no-color", check=False).returncode == 0

    dry = run_kl("drift", "accept", state, "--address", "local_file.b", "--dry-run")
    assert dry.returncode == 0, dry.stderr.decode()
    assert f"would accept v{applied}.1 as v{applied + 1}" in dry.stdout.decode()
    assert _served_serial(client, state) == applied

    done = run_kl("drift", "accept", state, "--address", "local_file.b", "--format", "json")
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["to_serial"] == applied + 1
    assert _served_serial(client, state) == applied + 1
    plan = ws.run("plan", "-refresh=false", "-detailed-exitcode", "-input=false", "-no-color", check=False)
    assert plan.returncode == 2 and "local_file.b will be created" in plan.stdout and "local_file.c" not in plan.stdout, \
        plan.stdout
    # c's drift stays open: its baseline is still what Terraform's version holds.
    assert _open_drift(db_url, state) == [("local_file.c", "deleted", applied)]
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT address, resolved_how FROM resource_drift WHERE state_name = %s AND resolved_how IS NOT NULL",
                         (state,)).fetchall() == [("local_file.b", "accepted")]

    # The observation was based on v{applied}: accepting it again would undo the accept.
    again = run_kl("drift", "accept", state)
    assert again.returncode == 1 and f"is based on v{applied}, but Terraform's current version is v{applied + 1}" in \
        again.stderr.decode() and again.stderr.decode().count("\n") == 1
    assert _refresh(run_kl, state, ws.dir)["resources_changed"] == 1  # c, against the accepted version
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")  # Terraform recreates both
    assert (out / "b.txt").read_text() == "b" and (out / "c.txt").read_text() == "c"
    assert _open_drift(db_url, state) == []
