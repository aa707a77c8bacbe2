"""OpenTofu-encrypted states that kl decrypts with the key configured per state: real OpenTofu
writes them (to a file imported with `kl state import`, and through kl serve), kl keeps the
envelope exactly as written and indexes the decrypted state, its sensitive values masked unless
the state opts in. A key kl lacks never refuses OpenTofu's write; it is refused on import."""
from __future__ import annotations

import json
import logging

import psycopg
import pytest

from kit.leaks import db_rows, leaks
from kit.paths import PLUGIN_CACHE
from kit.tfcli import tool_binary
from kit.tofuenc import ENV, PASSPHRASE, SECRET, apply_local, main_tf, tofu, write_kl_config

TOOL = "tofu-1.8.5"
WRONG = "a-wrong-passphrase-of-enough-length"


def _open_rows(db_url: str, name: str) -> dict[str, dict]:
    with psycopg.connect(db_url) as c:
        return {a: attrs for a, attrs in c.execute(
            """SELECT r.address, r.attributes FROM resources r JOIN states s ON s.id = r.state_id
               WHERE s.name = %s AND r.delete_serial IS NULL""", (name,))}


def _versions(db_url: str, name: str) -> list[tuple[int, bool, str | None, str]]:
    with psycopg.connect(db_url) as c:
        return c.execute("""SELECT v.serial, v.encrypted, v.unindexed, v.raw_state::text FROM state_versions v
                            JOIN states s ON s.id = v.state_id WHERE s.name = %s ORDER BY serial""", (name,)).fetchall()


def test_import_decrypts_and_indexes_with_sensitive_values_masked(db_url, run_kl, tmp_path):
    tool_binary(TOOL)
    envelope = apply_local(TOOL, tmp_path, {"a": SECRET, "b": "plain-but-marked"})
    cfg = write_kl_config(tmp_path / "enc.json")
    set_ = run_kl("state", "set", "enc", "--encryption-config", str(cfg), env={ENV: PASSPHRASE})
    assert set_.returncode == 0, set_.stderr
    assert b"passphrase from $" + ENV.encode() in set_.stdout and b"masked" in set_.stdout

    r = run_kl("state", "import", "enc", str(tmp_path / "terraform.tfstate"), env={ENV: PASSPHRASE})
    assert r.returncode == 0, r.stderr
    assert b"2 instances decrypted and indexed (sensitive values masked): 2 lifecycles opened" in r.stdout, r.stdout

    rows = _open_rows(db_url, "enc")
    assert set(rows) == {"local_file.a", "local_file.b"}
    # No refresh has cached local_file's schema yet: nothing says which of its values are safe.
    assert rows["local_file.a"]["sensitive_content"] == rows["local_file.a"]["filename"] == "(sensitive)"
    [(serial, encrypted, unindexed, raw)] = _versions(db_url, "enc")
    assert (serial, encrypted, unindexed) == (envelope["serial"], True, None)
    assert json.loads(raw) == envelope  # the version is the envelope as OpenTofu wrote it

    # A refresh caches the schema; OpenTofu's next version is indexed by it. local_file.a did not
    # change: it keeps its lifecycle, which now shows what is not sensitive.
    r = run_kl("refresh", "enc", "--provider-search-path", str(PLUGIN_CACHE), cwd=tmp_path, env={ENV: PASSPHRASE})
    assert r.returncode == 0, r.stderr
    apply_local(TOOL, tmp_path, {"a": SECRET, "b": "plain-but-marked", "c": SECRET})
    r = run_kl("state", "import", "enc", str(tmp_path / "terraform.tfstate"), env={ENV: PASSPHRASE})
    assert r.returncode == 0, r.stderr
    rows = _open_rows(db_url, "enc")
    assert rows["local_file.a"]["sensitive_content"] == rows["local_file.c"]["sensitive_content"] == "(sensitive)"
    assert rows["local_file.a"]["filename"].endswith("a.txt")  # what is not sensitive is indexed as is
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM resources WHERE address = 'local_file.a'").fetchone() == (1,)
    assert json.loads(run_kl("drift", "enc", "--format", "json").stdout)["drift"] == []
    # The secret is nowhere in the database, state tables included; the passphrase neither.
    everywhere = db_rows(db_url, exclude=frozenset())
    assert not leaks({"sensitive_content": SECRET, "passphrase": PASSPHRASE}, everywhere)
    assert not leaks({"passphrase": PASSPHRASE}, {"import": r.stdout + r.stderr, "set": set_.stdout + set_.stderr})

    status = json.loads(run_kl("status", "enc", "--format", "json").stdout)
    assert status["managed"] == 3 and status["encrypted"] is True and status["unindexed"] is None


def test_import_opt_in_stores_decrypted_attributes(db_url, run_kl, tmp_path):
    tool_binary(TOOL)
    apply_local(TOOL, tmp_path, {"a": SECRET})
    cfg = write_kl_config(tmp_path / "enc.json")
    r = run_kl("state", "set", "enc", "--encryption-config", str(cfg), "--store-decrypted-attributes")
    assert r.returncode == 0 and b"unmasked" in r.stdout, r.stderr
    r = run_kl("state", "import", "enc", str(tmp_path / "terraform.tfstate"), env={ENV: PASSPHRASE})
    assert r.returncode == 0 and b"(unmasked: --store-decrypted-attributes)" in r.stdout, r.stdout + r.stderr
    assert _open_rows(db_url, "enc")["local_file.a"]["sensitive_content"] == SECRET


@pytest.mark.parametrize("passphrase", [WRONG, None], ids=["wrong-passphrase", "variable-unset"])
def test_import_with_a_key_that_does_not_open_it_is_one_line_and_writes_nothing(db_url, run_kl, tmp_path, passphrase):
    tool_binary(TOOL)
    apply_local(TOOL, tmp_path, {"a": SECRET})
    assert run_kl("state", "set", "enc", "--encryption-config", str(write_kl_config(tmp_path / "enc.json"))).returncode == 0
    r = run_kl("state", "import", "enc", str(tmp_path / "terraform.tfstate"), env={ENV: passphrase} if passphrase else {})
    err = r.stderr.decode()
    assert r.returncode == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    if passphrase:
        assert "do not decrypt it: a wrong passphrase, or a key rotated without a fallback" in err, err
        assert WRONG not in err + r.stdout.decode()
    else:
        assert f"environment variable {ENV} is not set" in err, err
    assert _versions(db_url, "enc") == []


@pytest.mark.parametrize("body,message", [
    ({"state": {"method": "${method.aws_kms.k}"}, "method": {"aws_kms": {"k": {}}}}, "not supported; kl supports"),
    ({"key_provider": {"aws_kms": {"k": {"kms_key_id": "x"}}}, "state": {"method": "${method.aes_gcm.m}"}},
     "key provider 'aws_kms' is not supported; kl supports key_provider \"pbkdf2\" with method \"aes_gcm\""),
    ({"key_provider": {"pbkdf2": {"k": {"passphrase": "written-out-passphrase-xyz"}}}, "state": {"method": "x"}},
     "passphrase: must be a reference {\"env\": \"VARIABLE\"}"),
])
def test_unsupported_or_unsafe_configuration_is_refused_in_one_line(db_url, run_kl, tmp_path, body, message):
    cfg = tmp_path / "enc.json"
    cfg.write_text(json.dumps({"encryption": body}))
    r = run_kl("state", "set", "enc", "--encryption-config", str(cfg))
    err = r.stderr.decode()
    assert r.returncode != 0 and message in err and len(err.strip().splitlines()) == 1, err
    assert "written-out-passphrase-xyz" not in err
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM state_settings").fetchone() == (0,)


def test_serve_indexes_what_opentofu_sends_and_stores_an_unreadable_write_as_sent(start_server, db_url, run_kl, tmp_path,
                                                                                  monkeypatch, caplog):
    name = "served"
    assert run_kl("state", "set", name, "--encryption-config", str(write_kl_config(tmp_path / "enc.json"))).returncode == 0
    monkeypatch.setenv(ENV, PASSPHRASE)
    server = start_server()
    url = f"{server.url}/states/{name}"
    work = tmp_path / "ws"
    work.mkdir()
    (work / "main.tf").write_text(main_tf({"a": SECRET}, url))
    tofu(TOOL, work, "init", "-input=false")
    tofu(TOOL, work, "apply", "-auto-approve", "-input=false")
    assert _open_rows(db_url, name)["local_file.a"]["sensitive_content"] == "(sensitive)"
    assert all(unindexed is None for _, _, unindexed, _ in _versions(db_url, name))
    page = server.request("GET", f"/ui/state?name={name}").text
    assert "indexed from its decrypted content" in page and "cannot see its resources" not in page
    assert "local_file.a" in page and SECRET not in page

    # kl serve's key goes stale (rotated in OpenTofu's configuration, not in kl's environment): the
    # write is still taken as sent, and the version says why kl has no index of it.
    monkeypatch.setenv(ENV, WRONG)
    (work / "main.tf").write_text(main_tf({"a": SECRET, "b": SECRET}, url))
    with caplog.at_level(logging.WARNING, logger="kilolock"):
        tofu(TOOL, work, "apply", "-auto-approve", "-input=false")
    last = _versions(db_url, name)[-1]
    assert last[1] is True and "do not decrypt it" in (last[2] or ""), last[:3]
    warned = [r.getMessage() for r in caplog.records if "stored as sent, not indexed" in r.getMessage()]
    assert warned and all(WRONG not in w and PASSPHRASE not in w for w in warned), warned
    status = run_kl("status", name)
    assert b"not indexed" in status.stdout and b"do not decrypt it" in status.stdout, status.stdout
    page = server.request("GET", f"/ui/state?name={name}").text
    assert "kl cannot see its resources" in page and "do not decrypt it" in page
    # OpenTofu reads back what kl serves and plans clean.
    assert tofu(TOOL, work, "plan", "-detailed-exitcode", "-input=false", check=False).returncode == 0
