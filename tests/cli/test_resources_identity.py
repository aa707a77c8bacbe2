"""`kl resources` over our SDKv2 and framework test providers (tests/testprovider), whose reads
return each object's identity: the inventory shows what the latest refresh read (the identity, once
a refresh gave it), `--where` never matches a sensitive value, and the same remote objects held by
two states are `likely` duplicates while only an id is known on one side, `certain` once both have
the identity. The states are Terraform 1.8.5's (it writes no identity: kl's refresh brings it)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from refresh.test_testprovider import testprovider_applied  # noqa: F401  (the session's applied workspace)

from kit.paths import PLUGIN_CACHE

IDENTITIES = {"testfw_thing.a": {"id": "fw-a", "region": "local"}, "testsdk_thing.b": {"id": "sdk-b", "region": "local"}}


@pytest.fixture
def ws(testprovider_applied: Path, tmp_path: Path) -> Path:  # noqa: F811
    ws = tmp_path / "ws"
    shutil.copytree(testprovider_applied, ws, symlinks=True)
    return ws


def kl(run_kl: Any, ws: Path, *args: str) -> Any:
    return run_kl(*args, env={"KL_TESTPROVIDER_DIR": str(ws / "remote")}, cwd=ws)


def ok(r: Any) -> Any:
    assert r.returncode == 0, r.stderr.decode()
    return r


def resources(run_kl: Any, ws: Path, *args: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(ok(kl(run_kl, ws, "resources", "--format", "json", *args)).stdout)
    return rows


def test_identities_from_refreshes_make_likely_then_certain_duplicates(run_kl, db_url, ws: Path) -> None:
    for name in ("tp/a", "tp/copy"):
        ok(kl(run_kl, ws, "state", "import", name, str(ws / "terraform.tfstate"), "--source", "apply"))
        ok(kl(run_kl, ws, "state", "set", name, "--workdir", str(ws)))

    rows = resources(run_kl, ws)
    assert [(r["state"], r["address"], r["evidence"], r["id"], r["identity"]) for r in rows] == [
        ("tp/a", "testfw_thing.a", "id", "fw-a", None), ("tp/a", "testsdk_thing.b", "id", "sdk-b", None),
        ("tp/copy", "testfw_thing.a", "id", "fw-a", None), ("tp/copy", "testsdk_thing.b", "id", "sdk-b", None)]
    assert {r["provider"] for r in rows} == {"registry.terraform.io/kilolock/testfw", "registry.terraform.io/kilolock/testsdk"}
    assert all(list(r) == ["state", "address", "deposed", "mode", "type", "provider", "provider_alias", "id", "identity",
                           "identity_schema_version", "evidence", "status", "drift"] for r in rows)
    assert all((r["status"], r["drift"], r["mode"]) == ("ready", None, "managed") for r in rows)

    out = json.loads(ok(kl(run_kl, ws, "refresh", "tp/a", "--provider-search-path", str(PLUGIN_CACHE),
                           "--format", "json")).stdout)
    assert out["status"] == "succeeded" and out["resources_changed"] == 0, out
    seen = {r["address"]: r for r in resources(run_kl, ws, "--states", "tp/a")}
    assert {a: (r["evidence"], r["identity"], r["identity_schema_version"]) for a, r in seen.items()} == {
        a: ("identity", ident, 1) for a, ident in IDENTITIES.items()}

    # one side has an identity, the other only the id: likely (neither state has a stored provider config)
    groups = json.loads(ok(kl(run_kl, ws, "resources", "--duplicates", "--format", "json")).stdout)
    assert [(g["confidence"], g["type"], g["key"], [c["state"] for c in g["claims"]]) for g in groups] == [
        ("likely", "testfw_thing", "fw-a", ["tp/a", "tp/copy"]), ("likely", "testsdk_thing", "sdk-b", ["tp/a", "tp/copy"])]

    ok(kl(run_kl, ws, "refresh", "tp/copy", "--provider-search-path", str(PLUGIN_CACHE)))
    groups = json.loads(ok(kl(run_kl, ws, "resources", "--duplicates", "--format", "json")).stdout)
    assert [(g["confidence"], g["evidence"], g["type"], g["claims"][0]["identity"]) for g in groups] == [
        ("certain", "identity", "testfw_thing", IDENTITIES["testfw_thing.a"]),
        ("certain", "identity", "testsdk_thing", IDENTITIES["testsdk_thing.b"])]
    table = ok(kl(run_kl, ws, "resources", "--duplicates")).stdout.decode()
    assert "certain: testfw_thing" in table and "2 object(s) claimed more than once" in table


def test_where_matches_values_as_refreshes_read_them_and_never_a_secret(run_kl, db_url, ws: Path) -> None:
    ok(kl(run_kl, ws, "state", "import", "tp", str(ws / "terraform.tfstate"), "--source", "apply"))
    ok(kl(run_kl, ws, "state", "set", "tp", "--workdir", str(ws)))

    def addresses(*args: str) -> list[str]:
        return [r["address"] for r in resources(run_kl, ws, *args)]

    assert addresses("--where", "tags.env=dev") == ["testfw_thing.a", "testsdk_thing.b"]
    assert addresses("--where", 'tags["team"]=core', "--type", "testfw_*") == ["testfw_thing.a"]
    assert addresses("--where", "size=1.5") == ["testsdk_thing.b"]  # typed: a number
    assert addresses("--where", "single.n=3", "--provider", "kilolock/testfw") == ["testfw_thing.a"]
    assert addresses("--where", "name=beta", "--address", "testsdk_thing.*") == ["testsdk_thing.b"]
    assert addresses("--where", "secret=hunter2") == []  # the schema calls it sensitive: no yes or no
    assert addresses("--where", "tags.env=prod") == []

    # out of band, fw-a's tags change: the refresh's observation is what the inventory shows
    remote = ws / "remote" / "fw-a.json"
    obj = json.loads(remote.read_text())
    remote.write_text(json.dumps({**obj, "tags": {"env": "prod", "team": "core"}}))
    ok(kl(run_kl, ws, "refresh", "tp", "--provider-search-path", str(PLUGIN_CACHE)))
    assert addresses("--where", "tags.env=prod") == ["testfw_thing.a"]
    assert addresses("--drifted") == ["testfw_thing.a"]
    [row] = resources(run_kl, ws, "--drifted")
    assert row["drift"] == "changed"

    csv = ok(kl(run_kl, ws, "resources", "--format", "csv", "--drifted")).stdout.decode().splitlines()
    assert csv[0] == "state,address,deposed,mode,type,provider,provider_alias,id,identity,identity_schema_version,evidence,status,drift"
    assert csv[1].startswith("tp,testfw_thing.a,,managed,testfw_thing,registry.terraform.io/kilolock/testfw,,fw-a,")
    assert csv[1].endswith(",identity,ready,changed")


@pytest.mark.parametrize(("args", "fragment"), [
    (("--where", "tags.env"), "write PATH=VALUE"),
    (("--where", "tags[=x"), "tags[=x"),
    (("--type", "aws s3"), "not a resource type glob"),
    (("--provider", "a/b/c/d"), "not a provider source"),
    (("--address", "x[b]"), "x[b]"),
    (("--states", ""), "must not be empty"),
    (("--duplicates", "--type", "x"), "--duplicates takes --states only"),
])
def test_bad_arguments_are_one_line_usage_errors(run_kl, db_url, args: tuple[str, ...], fragment: str) -> None:
    r = run_kl("resources", *args)
    err = r.stderr.decode()
    assert r.returncode == 2 and fragment in err and "Traceback" not in err, err


def test_a_glob_matching_no_state_is_an_error(run_kl, db_url, make_state, tmp_path: Path) -> None:
    (tmp_path / "s.tfstate").write_bytes(make_state(1, {"a": {"id": "1"}}))
    ok(run_kl("state", "import", "prod", str(tmp_path / "s.tfstate")))
    r = run_kl("resources", "--states", "prdo")
    assert r.returncode == 1 and "prdo" in r.stderr.decode() and len(r.stderr.decode().strip().splitlines()) == 1
