"""A real OpenTofu 1.8.5 client writing encrypted state through kl serve (issue 16).

OpenTofu's state encryption (a pbkdf2 key provider, aes_gcm) encrypts the state before the http
backend sees it; the envelope keeps the state's serial and lineage in the clear. kl stores each
write at that serial and lineage, GET gives back exactly the bytes that were POSTed (so OpenTofu
decrypts what it wrote), and nothing of the resources is readable in what kl holds.
"""
from __future__ import annotations

import hashlib
import json

import psycopg

from kit.tfcli import Workspace, terraform_block, tool_binary
from kit.tofuenc import PASSPHRASE, encryption_hcl

TOOL = "tofu-1.8.5"


def _main_tf(url: str, resources: str) -> str:
    return terraform_block({"null": "2.1.2"}, url, encryption_hcl(PASSPHRASE)) + resources + "\n"


def _versions(db_url: str, name: str) -> list[tuple[int, str, bool, str, str]]:
    with psycopg.connect(db_url) as c:
        return c.execute(
            """SELECT v.serial, v.lineage, v.encrypted, v.content_hash, v.raw_state::text
               FROM state_versions v JOIN states s ON s.id = v.state_id WHERE s.name = %s ORDER BY v.serial""",
            (name,)).fetchall()


def test_encrypted_applies_are_stored_at_their_serials_and_served_back_byte_for_byte(start_server, db_url, tmp_path):
    server = start_server()
    name = "enc"
    ws = Workspace(TOOL, tool_binary(TOOL), tmp_path, f"{server.url}/states/{name}")
    (tmp_path / "main.tf").write_text(_main_tf(ws.url, 'resource "null_resource" "a" { triggers = { v = "secret-a1" } }'))
    ws.run("init", "-input=false", "-no-color")
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    first = json.loads(ws.run("state", "pull").stdout)  # decrypted by OpenTofu
    assert first["resources"] and first["serial"] >= 1

    (tmp_path / "main.tf").write_text(_main_tf(ws.url, 'resource "null_resource" "a" { triggers = { v = "secret-a2" } }'))
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    second = json.loads(ws.run("state", "pull").stdout)
    assert second["lineage"] == first["lineage"] and second["serial"] > first["serial"]

    held = _versions(db_url, name)
    # Every write is an encrypted version at the serial OpenTofu gave it, with its lineage.
    assert all(enc and lineage == first["lineage"] for _, lineage, enc, _, _ in held), held
    serials = [serial for serial, *_ in held]
    assert first["serial"] in serials and serials[-1] == second["serial"], (serials, first["serial"], second["serial"])
    for serial, _, _, _, raw in held:
        envelope = json.loads(raw)
        assert envelope["serial"] == serial and envelope["encryption_version"] == "v0"
        assert "secret-a" not in raw and "null_resource" not in raw  # nothing of the state in the clear

    got = server.request("GET", f"/states/{name}")
    assert got.status == 200
    assert hashlib.sha256(got.body).hexdigest() == held[-1][3]  # exactly the bytes of the last POST
    assert json.loads(got.body)["serial"] == second["serial"]
    # OpenTofu reads back and decrypts what kl serves: nothing to do.
    assert ws.run("plan", "-detailed-exitcode", "-input=false", "-no-color", check=False).returncode == 0
