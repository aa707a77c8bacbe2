"""`kl state …` and `kl status` end to end, as separate processes against a real database."""
from __future__ import annotations

import json

import psycopg
import pytest

from kit.pg import one_row


def rows(db_url):
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT (SELECT count(*) FROM states), (SELECT count(*) FROM state_versions), (SELECT count(*) FROM resources)").fetchone()


def test_import_list_versions_pull_status(db_url, run_kl, make_state, tmp_path):
    f1 = tmp_path / "v1.tfstate"
    f1.write_bytes(make_state(1, {"a": {"id": "1"}, "b": {"id": "2"}}))
    r = run_kl("state", "import", "prod", str(f1), "--actor", "alice")
    assert r.returncode == 0, r.stderr
    assert b"prod: stored serial 1 (import), 2 instances: 2 lifecycles opened, 0 closed, 0 unchanged" in r.stdout
    r = run_kl("state", "import", "prod", "-", "--source", "apply", input=make_state(2, {"a": {"id": "1"}, "c": {"id": "3"}}))
    assert r.returncode == 0, r.stderr
    assert b"1 lifecycles opened, 1 closed, 1 unchanged" in r.stdout

    listing = json.loads(run_kl("state", "list", "--format", "json").stdout)
    assert [(s["name"], s["serial"], s["versions"], s["resources"]) for s in listing["states"]] == [("prod", 2, 2, 2)]

    vers = json.loads(run_kl("state", "versions", "prod", "--format", "json").stdout)["versions"]
    assert [(v["serial"], v["source"], v["kind"], v["label"], v["observation"]) for v in vers] == [
        (1, "import", "terraform", "v1", None), (2, "apply", "terraform", "v2", None)]
    assert vers[0]["actor"] == "alice" and vers[1]["actor"].endswith("@cli")
    table = run_kl("state", "versions", "prod").stdout.decode()
    # Both kinds in one list (observations beside Terraform's versions): the version's label and its kind.
    assert table.splitlines()[0].split() == ["VERSION", "KIND", "SOURCE", "ACTOR", "TERRAFORM", "CREATED"]
    assert [line.split()[:3] for line in table.splitlines()[1:]] == [["v1", "terraform", "import"], ["v2", "terraform", "apply"]]

    pulled = json.loads(run_kl("state", "pull", "prod").stdout)
    assert pulled == json.loads(make_state(2, {"a": {"id": "1"}, "c": {"id": "3"}}))
    old = json.loads(run_kl("state", "pull", "prod", "--serial", "1").stdout)
    assert old["serial"] == 1 and [r["name"] for r in old["resources"]] == ["a", "b"]

    status = json.loads(run_kl("status", "prod", "--format", "json").stdout)
    assert (status["serial"], status["versions"], status["managed"], status["open_drift"], status["last_refresh"]) == (2, 2, 2, 0, None)
    text = run_kl("status", "prod").stdout.decode()
    assert "serial:       v2" in text and "last refresh: never" in text


def _encrypted():
    return json.dumps({"meta": {"key_provider.pbkdf2.k": "e30="}, "encrypted_data": "AAAA", "encryption_version": "v0"}).encode()


BAD = [
    ("not json", b"{nope", "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    ("truncated", b'{"version": 4, "serial": 1, "lineage": "x", "resources": [', "not valid JSON"),
    ("v2", json.dumps({"version": 2, "serial": 1, "lineage": "x", "modules": []}).encode(),
     "state format version 2 (from Terraform 0.11 or older) is not supported, only 3 and 4"),
    ("v3 bad key", json.dumps({"version": 3, "serial": 1, "lineage": "x", "modules": [
        {"path": ["root"], "resources": {"aws_instance": {"primary": {"id": "i"}}}}]}).encode(),
     ".modules[0].resources.aws_instance: 'aws_instance' is not a resource address"),
    ("flatmap", json.dumps({"version": 4, "serial": 1, "lineage": "x", "resources": [
        {"mode": "managed", "type": "t", "name": "n", "provider": 'provider["a/b/c"]',
         "instances": [{"attributes_flat": {"id": ["1"]}}]}]}).encode(),
     "resources[0].instances[0].attributes_flat.id: expected a string, got array"),
    ("backend settings", json.dumps({"version": 3, "serial": 2, "lineage": "x", "backend": {"type": "http", "config": {}, "hash": 7},
                                     "modules": [{"path": ["root"], "outputs": {}, "resources": {}, "depends_on": []}]}).encode(),
     "this is Terraform's backend settings file (.terraform/terraform.tfstate, for the \"http\" backend), not a state"),
    ("no lineage", json.dumps({"version": 4, "serial": 1}).encode(), ".lineage: missing"),
    ("no serial", json.dumps({"version": 4, "lineage": "x"}).encode(), ".serial: missing"),
    ("wrong type", json.dumps({"version": 4, "serial": "1", "lineage": "x"}).encode(), ".serial: expected a number, got string"),
]


@pytest.mark.parametrize(("label", "data", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_exit_1_and_nothing_written(db_url, run_kl, tmp_path, label, data, message):
    f = tmp_path / "bad.tfstate"
    f.write_bytes(data)
    r = run_kl("state", "import", "prod", str(f))
    err = r.stderr.decode()
    assert r.returncode == 1
    assert message in err and err.startswith("kl: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and r.stdout == b""
    assert rows(db_url) == (0, 0, 0)


def test_unknown_state_and_missing_file(db_url, run_kl, tmp_path):
    for args, message in [
        (("state", "pull", "nope"), "no state named 'nope'"),
        (("state", "versions", "nope"), "no state named 'nope'"),
        (("status", "nope"), "no state named 'nope'"),
        (("state", "import", "x", str(tmp_path / "missing.tfstate")), "missing.tfstate: no such file"),
    ]:
        r = run_kl(*args)
        assert r.returncode == 1 and message in r.stderr.decode() and r.stderr.decode().count("\n") == 1, (args, r.stderr)


def test_a_mistyped_state_name_is_told_the_closest_stored_one(db_url, run_kl, make_state):
    for name in ("team/prod", "team/staging"):
        assert run_kl("state", "import", name, "-", input=make_state(1, {"a": {"id": "1"}})).returncode == 0
    for args in (("status", "team/prd"), ("refresh", "team/prdo"), ("state", "pull", "tema/prod")):
        r = run_kl(*args)
        assert r.returncode == 1 and r.stderr.decode() == (
            f"kl: no state named {args[-1]!r}; did you mean 'team/prod'? (see `kl state list`)\n"), r.stderr
    r = run_kl("status", "elsewhere")  # nothing close: no guess
    assert r.returncode == 1 and r.stderr.decode() == "kl: no state named 'elsewhere' (see `kl state list`)\n", r.stderr


def test_serial_conflicts_from_the_cli(db_url, run_kl, make_state):
    assert run_kl("state", "import", "prod", "-", input=make_state(3, {"a": {"id": "1"}})).returncode == 0
    r = run_kl("state", "import", "prod", "-", input=make_state(3, {"a": {"id": "2"}}))
    assert r.returncode == 1 and r.stderr.startswith(
        b"kl: <stdin> has serial 3, behind state 'prod' at serial 3: kl's serial 3 (by kl state import) has other content"), r.stderr
    r = run_kl("state", "import", "prod", "-", input=make_state(4, {"a": {"id": "2"}}, lineage="other"))
    assert r.returncode == 1 and b"use --force" in r.stderr
    assert run_kl("state", "import", "prod", "-", "--force", input=make_state(4, {"a": {"id": "2"}}, lineage="other")).returncode == 0
    assert rows(db_url)[1] == 2


@pytest.mark.parametrize("args", [(), ("state",), ("state", "import"), ("state", "import", "x", "f", "--source", "bogus"), ("frobnicate",), ("state", "pull", "x", "--serial", "abc")])
def test_usage_errors_exit_2(run_kl, args):
    r = run_kl(*args)
    assert r.returncode == 2 and b"Traceback" not in r.stderr and r.stderr


def test_unmigrated_external_database_says_what_to_do(empty_db_url, run_kl, make_state):
    r = run_kl("state", "import", "prod", "-", input=make_state(1, {}))
    assert r.returncode == 1 and b"run `kl db migrate`" in r.stderr
    r = run_kl("db", "migrate")
    assert r.returncode == 0 and b"applied  0001_init.sql" in r.stdout
    assert b"database is current" in run_kl("db", "migrate").stdout
    assert run_kl("state", "import", "prod", "-", input=make_state(1, {})).returncode == 0


def test_unreachable_database_is_one_line(run_kl):
    r = run_kl("state", "list", env={"KL_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/x?connect_timeout=2"})
    assert r.returncode == 1 and r.stderr.decode().startswith("kl: cannot connect to the database") and r.stderr.count(b"\n") == 1


@pytest.mark.parametrize("name", ["a b", "../prod", "prod/", "ünicode", ".hidden"])
def test_import_refuses_a_name_kl_serve_could_not_serve(db_url, run_kl, make_state, name):
    r = run_kl("state", "import", name, "-", input=make_state(1, {"a": {"id": "1"}}))
    err = r.stderr.decode().strip()
    # The error on one line, then the command's usage line.
    assert r.returncode == 2 and len(err.splitlines()) == 2 and "is not allowed" in err.splitlines()[0], err
    assert err.splitlines()[1].startswith("usage: kl state import "), err
    with psycopg.connect(db_url) as c:
        assert one_row(c, "SELECT count(*) FROM states")[0] == 0


def test_a_nested_name_imports_and_reads_back(db_url, run_kl, make_state):
    assert run_kl("state", "import", "team/prod-1.eu", "-", input=make_state(1, {"a": {"id": "1"}})).returncode == 0
    assert json.loads(run_kl("state", "pull", "team/prod-1.eu").stdout)["serial"] == 1


def test_an_opentofu_encrypted_file_is_imported_as_kl_serve_stores_one(db_url, run_kl, make_state, tmp_path):
    f = tmp_path / "enc.tfstate"
    f.write_bytes(_encrypted())
    r = run_kl("state", "import", "prod", str(f))
    assert r.returncode == 0, r.stderr
    assert b"prod: stored serial 1 (import), OpenTofu-encrypted: kept as is, not indexed or refreshed" in r.stdout
    assert run_kl("state", "import", "prod", str(f)).stdout.endswith(b"identical content); nothing written\n")
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT serial, encrypted FROM state_versions").fetchall() == [(1, True)]
        assert one_row(c, "SELECT count(*) FROM resources")[0] == 0
    assert json.loads(run_kl("state", "pull", "prod").stdout) == json.loads(_encrypted())
    r = run_kl("refresh", "prod")
    assert r.returncode == 1 and b"OpenTofu-encrypted" in r.stderr
    # A plain state after it continues the serials, as after an encrypted write through kl serve.
    r = run_kl("state", "import", "prod", "-", "--force", input=make_state(5, {"a": {"id": "1"}}))
    assert r.returncode == 0, r.stderr
