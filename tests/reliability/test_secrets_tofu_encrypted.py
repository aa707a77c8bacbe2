"""An OpenTofu-encrypted state kl decrypts: neither its passphrase nor its sensitive values reach any
channel kl has, the state tables included (the index holds them masked, the versions encrypted).

Real OpenTofu 1.8.5 applies through a real `kl serve` (debug logs on) with the passphrase in its
environment, then once more with kl serve holding a wrong one (the warning path); kl refreshes
with TF_LOG=trace and finds a deleted file, which `kl drift accept` makes OpenTofu's. Everything a user or tool reads is grepped: every read
command, the JSON API, kl serve's log, kl refresh's output, and every row of every table.
"""
from __future__ import annotations

import json

import psycopg
import pytest

from kit.leaks import LOUD, Serve, api_channels, db_rows, leaks, read_channels
from kit.paths import PLUGIN_CACHE
from kit.tfcli import tool_binary
from kit.tofuenc import ENV, PASSPHRASE, SECRET, encryption_hcl, main_tf, tofu, write_kl_config

TOOL = "tofu-1.8.5"
WRONG = "kl-wrong-passphrase-9d2e41c0"


def test_passphrase_and_sensitive_values_of_an_encrypted_state_leak_nowhere(db_url, run_kl, tmp_path):
    tool_binary(TOOL)
    name = "enc"
    ws = tmp_path / "ws"
    ws.mkdir()
    cfg = write_kl_config(tmp_path / "enc.json")
    channels: dict[str, bytes] = {}
    r = run_kl("state", "set", name, "--encryption-config", str(cfg), "--workdir", str(ws), env=LOUD)
    assert r.returncode == 0, r.stderr
    channels["kl state set"] = r.stdout + r.stderr

    serve = Serve(db_url, env={ENV: PASSPHRASE})
    try:
        url = f"http://127.0.0.1:{serve.port}/states/{name}"
        (ws / "main.tf").write_text(main_tf({"a": SECRET, "b": SECRET}, url))
        tofu(TOOL, ws, "init", "-input=false")
        tofu(TOOL, ws, "apply", "-auto-approve", "-input=false")
    finally:
        channels["kl serve log (right key)"] = serve.stop()

    (ws / "a.txt").unlink()
    r = run_kl("refresh", name, "--provider-search-path", str(PLUGIN_CACHE), cwd=ws, env={**LOUD, ENV: PASSPHRASE})
    assert r.returncode == 0, r.stderr
    channels["kl refresh"] = r.stdout + r.stderr
    drift = json.loads(run_kl("drift", name, "--format", "json").stdout)["drift"]
    assert [(d["address"], d["kind"]) for d in drift] == [("local_file.a", "deleted")], drift
    # What the refresh observed becomes OpenTofu's next version (without a.txt), as the refresh
    # itself wrote it before observations, so the apply below has something to write: a.txt again.
    r = run_kl("drift", "accept", name, env={**LOUD, ENV: PASSPHRASE})
    assert r.returncode == 0, r.stderr
    channels["kl drift accept"] = r.stdout + r.stderr

    # kl serve with a stale key: OpenTofu's write is stored, with a warning that names no secret.
    serve = Serve(db_url, env={ENV: WRONG})
    try:
        (ws / "main.tf").write_text(main_tf({"a": SECRET, "b": SECRET}, f"http://127.0.0.1:{serve.port}/states/{name}"))
        tofu(TOOL, ws, "init", "-reconfigure", "-input=false")  # the same state on another port
        tofu(TOOL, ws, "apply", "-auto-approve", "-input=false")
    finally:
        channels["kl serve log (wrong key)"] = serve.stop()
    assert b"stored as sent, not indexed" in channels["kl serve log (wrong key)"]

    channels.update(read_channels(lambda *a, env=None: run_kl(*a, env={**(env or {}), ENV: PASSPHRASE}), name))
    api, pulled = api_channels(db_url, name, env={ENV: PASSPHRASE})
    channels.update(api)
    channels.update(db_rows(db_url, exclude=frozenset()))  # the state tables too: they hold no secret here
    assert SECRET.encode() not in pulled  # the backend's GET is the envelope, as OpenTofu wrote it

    found = leaks({"passphrase": PASSPHRASE, "wrong passphrase": WRONG, "sensitive_content": SECRET}, channels)
    assert not found, found


LEGACY = "tofu-1.6.3"  # lists no schema-sensitive attribute in sensitive_attributes


def _open_rows(db_url: str, name: str) -> dict[str, dict]:
    with psycopg.connect(db_url) as c:
        return {a: attrs for a, attrs in c.execute(
            """SELECT r.address, r.attributes FROM resources r JOIN states s ON s.id = r.state_id
               WHERE s.name = %s AND r.delete_serial IS NULL""", (name,))}


@pytest.mark.parametrize("tool", ["tofu-1.8.5", "tofu-1.12.6"])
def test_schema_sensitive_values_the_state_does_not_mark_leak_nowhere(db_url, run_kl, tmp_path, tool):
    """A state OpenTofu 1.6 wrote (no schema marks) moved into kl serve with encryption turned on:
    OpenTofu 1.8 and 1.12 copy and move its objects as they are, so sensitive_content is a schema
    `sensitive` attribute that sensitive_attributes does not list. kl masks it by the schema; before
    any refresh cached local_file's schema, every value of the type is masked."""
    tool_binary(LEGACY)
    tool_binary(tool)
    name = "enc"
    ws = tmp_path / "ws"
    ws.mkdir()
    files = {"a": SECRET, "b": SECRET}
    (ws / "main.tf").write_text(main_tf(files, encryption=""))
    tofu(LEGACY, ws, "init", "-input=false")
    tofu(LEGACY, ws, "apply", "-auto-approve", "-input=false")
    cfg = write_kl_config(tmp_path / "enc.json")
    channels: dict[str, bytes] = {}
    r = run_kl("state", "set", name, "--encryption-config", str(cfg), "--workdir", str(ws), env=LOUD)
    assert r.returncode == 0, r.stderr

    serve = Serve(db_url, env={ENV: PASSPHRASE})
    try:
        url = f"http://127.0.0.1:{serve.port}/states/{name}"
        (ws / "main.tf").write_text(main_tf(files, url, encryption=encryption_hcl(migrating=True)))
        tofu(tool, ws, "init", "-input=false", "-migrate-state", "-force-copy")
        pulled = json.loads(tofu(tool, ws, "state", "pull").stdout)  # decrypted by OpenTofu
        marks = {r["name"]: [i["sensitive_attributes"] for i in r["instances"]] for r in pulled["resources"]}
        assert marks == {"a": [[]], "b": [[]]}, marks  # what this test is about: the state marks nothing

        # No schema of local_file is cached yet: nothing says which values are safe.
        rows = _open_rows(db_url, name)
        assert set(rows) == {"local_file.a", "local_file.b"}
        assert {k: v for k, v in rows["local_file.a"].items() if v is not None} == {
            k: "(sensitive)" for k, v in rows["local_file.a"].items() if v is not None}, rows
        # Every masked id is the same string; it names no object, so no duplicate is claimed.
        dups = run_kl("resources", "--duplicates", "--format", "json")
        assert dups.returncode == 0 and json.loads(dups.stdout) == [], dups.stdout

        (ws / "b.txt").unlink()
        r = run_kl("refresh", name, "--provider-search-path", str(PLUGIN_CACHE), cwd=ws, env={**LOUD, ENV: PASSPHRASE})
        assert r.returncode == 0, r.stderr
        channels["kl refresh"] = r.stdout + r.stderr
        drift = json.loads(run_kl("drift", name, "--format", "json").stdout)["drift"]
        assert [(d["address"], d["kind"]) for d in drift] == [("local_file.b", "deleted")], json.dumps(drift, indent=1)
        # A state-only command of the current OpenTofu: its objects still carry no marks.
        tofu(tool, ws, "state", "mv", "local_file.a", "local_file.c")
    finally:
        channels["kl serve log"] = serve.stop()

    rows = _open_rows(db_url, name)
    assert rows["local_file.c"]["filename"].endswith("a.txt"), rows  # the schema cached: the rest is indexed
    assert rows["local_file.c"]["sensitive_content"] == "(sensitive)", rows
    assert rows["local_file.b"]["filename"].endswith("b.txt"), rows  # unchanged: its lifecycle now unmasked

    channels.update(read_channels(lambda *a, env=None: run_kl(*a, env={**(env or {}), ENV: PASSPHRASE}), name))
    api, pulled_raw = api_channels(db_url, name, env={ENV: PASSPHRASE})
    channels.update(api)
    channels.update(db_rows(db_url, exclude=frozenset()))
    assert SECRET.encode() not in pulled_raw
    found = leaks({"passphrase": PASSPHRASE, "sensitive_content": SECRET}, channels)
    assert not found, found
