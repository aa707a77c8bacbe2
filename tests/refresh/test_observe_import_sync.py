"""A state kept in sync by `kl state import` of every file Terraform writes, with kl refreshes in
between: each import is accepted (a refresh records an observation and never takes the serial
Terraform writes next), and drift is computed against the imported version. Real Terraform with
its local backend, the real local provider (offline, from the filesystem mirror)."""
from __future__ import annotations

import json
from pathlib import Path

import psycopg

from kit.paths import LOCAL_V
from kit.tfcli import Workspace, tool_binary

TOOL = "terraform-1.8.5"


def _config(out: Path, content: str) -> str:
    files = "".join(f'resource "local_file" "{n}" {{\n  filename = "{out / n}.txt"\n  content  = "{content}"\n}}\n'
                    for n in ("a", "b", "c"))
    return f"""
terraform {{
  required_providers {{
    local = {{ source = "registry.terraform.io/hashicorp/local", version = "{LOCAL_V}" }}
  }}
}}
{files}"""


def _import(run_kl, ws: Path) -> int:
    """Import the file Terraform wrote; its serial."""
    r = run_kl("state", "import", "sync", str(ws / "terraform.tfstate"))
    assert r.returncode == 0, r.stderr.decode()
    return int(json.loads((ws / "terraform.tfstate").read_text())["serial"])


def _refresh(run_kl, ws: Path) -> dict:
    r = run_kl("refresh", "sync", "--workdir", str(ws), "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    return json.loads(r.stdout)


def test_every_file_terraform_writes_imports_between_refreshes(db_url, tmp_path, run_kl):
    out = tmp_path / "files"
    out.mkdir()
    ws = Workspace(TOOL, tool_binary(TOOL), tmp_path / "ws", "")
    ws.dir.mkdir()
    (ws.dir / "main.tf").write_text(_config(out, "one"))
    ws.run("init", "-input=false", "-no-color")
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    first = _import(run_kl, ws.dir)
    assert _refresh(run_kl, ws.dir)["observation"] == f"v{first}.1"

    (ws.dir / "main.tf").write_text(_config(out, "two"))
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")  # Terraform's next serials, after the refresh
    second = _import(run_kl, ws.dir)
    assert second > first
    (out / "b.txt").unlink()
    found = _refresh(run_kl, ws.dir)
    assert (found["from_serial"], found["observation"], found["changed_addresses"]) == (
        second, f"v{second}.1", ["local_file.b"])
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT address, drift_kind, detected_serial FROM current_resource_drift").fetchall() == [
            ("local_file.b", "deleted", second)]

    # Terraform recreates b as it was: its state ends as it began, so it writes no new serial, and
    # the import of its file is the version kl holds (nothing written). The next refresh reads b back
    # as Terraform's version has it, which resolves the drift.
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    assert _import(run_kl, ws.dir) == second
    assert _refresh(run_kl, ws.dir)["observation"] == f"v{second}.2"
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM current_resource_drift").fetchone() == (0,)
        assert c.execute("SELECT resolved_how FROM drift_records").fetchall() == [("refresh",)]

    (out / "c.txt").unlink()
    assert _refresh(run_kl, ws.dir)["changed_addresses"] == ["local_file.c"]
    (ws.dir / "main.tf").write_text(_config(out, "three"))
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")  # a new serial: new contents, c recreated
    third = _import(run_kl, ws.dir)
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM current_resource_drift").fetchone() == (0,)
        assert c.execute("SELECT resolved_how FROM drift_records ORDER BY first_detected_at").fetchall() == [
            ("refresh",), ("recreated",)]
        serials = c.execute("SELECT serial FROM state_versions WHERE kind = 'terraform' ORDER BY serial").fetchall()
    assert serials == [(first,), (second,), (third,)]
    assert _refresh(run_kl, ws.dir)["observation"] == f"v{third}.1"
