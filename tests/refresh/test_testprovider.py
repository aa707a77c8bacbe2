"""kl refresh against our own modern-SDK test provider (tests/testprovider), both builds:
testfw (terraform-plugin-framework, protocol 6) and testsdk (terraform-plugin-sdk/v2, protocol 5).

Each resource's remote object is a JSON file (<dir>/<id>.json), so editing it is a real
out-of-band change of a complex value and deleting it a real removal. The state is made by
Terraform 1.8.5, which knows nothing of resource identity (Terraform >= 1.12 does). The identity
cases therefore write the identity fields into that state by hand, exactly as Terraform 1.12
lays them out (`identity_schema_version` and `identity` beside `schema_version` and `attributes`
of the instance), and the schema-upgrade case rewrites one object back to schema version 0
(`title` where version 1 has `name`), as a state written by an older provider would hold it.
"""
from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kilolock.redact import Redactor
from kit.clis import compiled_cli
from kit.paths import PLUGIN_CACHE
from kit.tfworkspace import terraform_env

FW, SDK = "testfw_thing.a", "testsdk_thing.b"
BUILDS = {  # address -> (provider type, protocol, remote object id)
    FW: ("testfw", 6, "fw-a"),
    SDK: ("testsdk", 5, "sdk-b"),
}

MAIN_TF = """
terraform {
  required_providers {
    testfw  = { source = "registry.terraform.io/kilolock/testfw", version = "0.1.0" }
    testsdk = { source = "registry.terraform.io/kilolock/testsdk", version = "0.1.0" }
  }
}
resource "testfw_thing" "a" {
  id          = "fw-a"
  name        = "alpha"
  tags        = { env = "dev", team = "core" }
  secret      = "hunter2"
  dyn         = { x = 1, y = ["a", "b"] }
  objects     = [{ k = "one", v = 1 }, { k = "two", v = 2.5 }]
  single      = { a = "s", n = 3, token = "tok-1" }
  list_nested = [{ a = "l0", n = 0 }, { a = "l1", n = 1 }]
  set_nested  = [{ a = "s0", n = null }]
  map_nested  = { m = { a = "m0", n = 7 } }
  rule {
    key   = "r1"
    value = "v1"
  }
  member {
    name = "bob"
    role = "admin"
  }
  settings {
    mode  = "fast"
    level = 1
  }
}
resource "testsdk_thing" "b" {
  key    = "sdk-b"
  name   = "beta"
  size   = 1.5
  tags   = { env = "dev" }
  labels = ["x", "y"]
  secret = "hunter3"
  rule {
    key   = "r1"
    value = "v1"
  }
  member {
    name = "bob"
    role = "admin"
  }
}
"""


def _tf(ws: Path, *args: str) -> None:
    env = terraform_env()
    env["KL_TESTPROVIDER_DIR"] = str(ws / "remote")
    r = subprocess.run([str(compiled_cli("terraform-1.8.5")), *args, "-input=false", "-no-color"], cwd=ws, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"terraform {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"


@pytest.fixture(scope="session")
def testprovider_applied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for type_ in ("testfw", "testsdk"):
        if not (PLUGIN_CACHE / "registry.terraform.io/kilolock" / type_).exists():
            pytest.fail(f"the {type_} test provider is missing: run scripts/test-providers.sh {type_}", pytrace=False)
    compiled_cli("terraform-1.8.5")
    ws = tmp_path_factory.mktemp("tp-applied")
    (ws / "main.tf").write_text(MAIN_TF)
    _tf(ws, "init")
    _tf(ws, "apply", "-auto-approve")
    return ws


@pytest.fixture
def ws(testprovider_applied: Path, tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(testprovider_applied, ws, symlinks=True)
    return ws


class Kl:
    """kl against one state, "tp", with the providers' remote objects in the workspace's copy."""

    def __init__(self, run_kl: Any, ws: Path) -> None:
        self.run_kl, self.ws = run_kl, ws
        self.env = {"KL_TESTPROVIDER_DIR": str(ws / "remote")}

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
        return self.run_kl(*args, env={**self.env, **(env or {})}, cwd=self.ws)

    def import_state(self, doc: dict[str, Any] | None = None) -> None:
        path = self.ws / "terraform.tfstate"
        if doc is not None:
            path.write_text(json.dumps(doc))
        r = self("state", "import", "tp", str(path), "--source", "apply")
        assert r.returncode == 0, r.stderr
        # With no workdir kl commits no deletion (a relative path read from elsewhere looks gone).
        r = self("state", "set", "tp", "--workdir", str(self.ws))
        assert r.returncode == 0, r.stderr

    def refresh(self, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        r = self("refresh", "tp", "--provider-search-path", str(PLUGIN_CACHE), "--format", "json", *extra, env=env)
        assert r.stdout, r.stderr
        out: dict[str, Any] = json.loads(r.stdout)
        return out

    def pulled(self, observed: bool = True) -> dict[str, Any]:
        """The instances of the latest observation (what the last refresh read), or of Terraform's
        current version."""
        r = self("state", "pull", "tp", *(["--observed"] if observed else []))
        assert r.returncode == 0, r.stderr
        return instances(json.loads(r.stdout))

    def drift(self) -> dict[str, dict[str, Any]]:
        r = self("drift", "tp", "--format", "json")
        assert r.returncode == 0, r.stderr
        return {d["address"]: d for d in json.loads(r.stdout)["drift"]}


def instances(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{r['type']}.{r['name']}": r["instances"][0] for r in doc["resources"]}


def state_doc(ws: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((ws / "terraform.tfstate").read_text())
    return doc


def remote(ws: Path, ident: str) -> Path:
    return ws / "remote" / f"{ident}.json"


def edit_remote(ws: Path, ident: str, **changes: Any) -> dict[str, Any]:
    path = remote(ws, ident)
    obj: dict[str, Any] = json.loads(path.read_text())
    obj.update(changes)
    path.write_text(json.dumps(obj))
    return obj


@pytest.fixture
def kl(run_kl: Any, db_url: str, ws: Path) -> Kl:
    return Kl(run_kl, ws)


def _changes(entry: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {c["path"]: (c["before"], c["after"]) for c in entry["changes"]}


def _change_list(changes: list[dict[str, Any]]) -> list[tuple[str, Any, Any]]:
    return sorted((c["path"], c["before"], c["after"]) for c in changes)


S = "(sensitive)"
# Every shape testfw has, changed out of band, and the exact path (and before, after) kl reports for
# it: attributes of objects, single nested attributes and blocks as `.name`, map keys as `["k"]`,
# a dynamic value through its stored wrapper (shown whole when its type changed), sets as sets
# (an element changed is one removed and one added, and nothing else moves).
FW_EDITS: dict[str, Any] = {
    "tags": {"env": "prod", "team": "core"},
    "secret": "hunter2-rotated",
    "dyn": {"value": ["now", "a", "list"], "type": ["list", "string"]},
    "objects": [{"k": "one", "v": 1}, {"k": "three", "v": 3}],
    "single": {"a": "s", "n": 4, "token": "tok-2"},
    "list_nested": [{"a": "l0", "n": 0}],
    "set_nested": [{"a": "s0", "n": None}, {"a": "s1", "n": 1}],
    "map_nested": {"m": {"a": "m0", "n": 8}, "k": {"a": "k0", "n": None}},
    "rule": [{"key": "r1", "value": "v2"}],
    "member": [{"name": "bob", "role": "viewer"}, {"name": "eve", "role": None}],
    "settings": {"mode": "fast", "level": 2},
    "password_wo": "written-out-of-band",  # write-only: the provider never reports it
}
FW_CHANGES = sorted([
    ('tags["env"]', "dev", "prod"),
    ("secret", S, S),
    ("dyn", {"x": 1, "y": ["a", "b"]}, ["now", "a", "list"]),
    ('objects[={"k":"two","v":2.5}]', {"k": "two", "v": 2.5}, None),
    ('objects[={"k":"three","v":3}]', None, {"k": "three", "v": 3}),
    ("single.n", 3, 4),
    ("single.token", S, S),
    ("list_nested", [{"a": "l0", "n": 0}, {"a": "l1", "n": 1}], [{"a": "l0", "n": 0}]),
    ('set_nested[={"a":"s1","n":1}]', None, {"a": "s1", "n": 1}),
    ('map_nested["m"].n', 7, 8),
    ('map_nested["k"]', None, {"a": "k0", "n": None}),
    ("rule[0].value", "v1", "v2"),
    ('member[={"name":"bob","role":"admin"}]', {"name": "bob", "role": "admin"}, None),
    ('member[={"name":"bob","role":"viewer"}]', None, {"name": "bob", "role": "viewer"}),
    ('member[={"name":"eve","role":null}]', None, {"name": "eve", "role": None}),
    ("settings.level", 1, 2),
])


def test_framework_complex_changes_reach_the_state_and_drift_with_secrets_masked(kl: Kl, ws: Path) -> None:
    kl.import_state()
    out = kl.refresh()
    assert (out["status"], out["resources_changed"]) == ("succeeded", 0), out
    assert kl.drift() == {}

    obj = edit_remote(ws, "fw-a", **FW_EDITS)
    dry = kl.refresh("--dry-run")
    out = kl.refresh()
    assert out["status"] == "succeeded" and out["changed_addresses"] == [FW], out

    got = kl.pulled()[FW]
    attrs = got["attributes"]
    for name in ("tags", "secret", "objects", "single", "list_nested", "map_nested", "rule", "settings"):
        assert attrs[name] == obj[name], name
    assert attrs["dyn"] == {"value": ["now", "a", "list"], "type": ["list", "string"]}
    assert sorted(attrs["set_nested"], key=lambda e: e["a"]) == obj["set_nested"]
    assert sorted(attrs["member"], key=lambda e: e["name"]) == obj["member"]
    assert attrs["password_wo"] is None
    assert {"type": "get_attr", "value": "secret"} in [p[0] for p in got["sensitive_attributes"]]
    assert got["identity"] == {"id": "fw-a", "region": "local"} and got["identity_schema_version"] == 1

    entry = kl.drift()[FW]
    assert entry["kind"] == "changed"
    text = json.dumps(entry)
    for secret in ("hunter2", "tok-1", "tok-2"):
        assert secret not in text, f"{secret!r} shows in drift: {text}"
    assert _change_list(entry["changes"]) == FW_CHANGES
    # Every reader of the drift path says the same: the refresh (and its dry run), the diff of
    # Terraform's version and the observation, the markdown.
    for report in (dry, out):
        [found] = [d for d in report["drift"] if d["address"] == FW]
        assert _change_list(found["changes"]) == FW_CHANGES, report
    diff = json.loads(kl("state", "diff", "tp", "--observed", "--format", "json").stdout)
    [changed] = [i for i in diff["instances"] if i["address"] == FW]
    assert _change_list(changed["changes"]) == FW_CHANGES
    md = kl("drift", "tp", "--format", "markdown").stdout.decode()
    for path, _, _ in FW_CHANGES:
        assert f"`{path}`" in md, (path, md)


def test_ignore_rules_match_the_paths_kl_drift_shows(kl: Kl, ws: Path) -> None:
    # One rule per path shown hides the record only once every path has one: the set elements,
    # the dynamic value, the single nested attribute's attribute included.
    kl.import_state()
    assert kl.refresh()["status"] == "succeeded"
    edit_remote(ws, "fw-a", **FW_EDITS)
    assert kl.refresh()["status"] == "succeeded"
    paths = [p for p, _, _ in FW_CHANGES]
    for path in paths[:-1]:
        r = kl("drift", "ignore", "add", "--states", "tp", "--address", FW, "--path", path)
        assert r.returncode == 0, r.stderr
    assert FW in kl.drift(), "hidden with one path uncovered"
    r = kl("drift", "ignore", "add", "--states", "tp", "--address", FW, "--path", paths[-1])
    assert r.returncode == 0, r.stderr
    assert kl.drift() == {}
    listed = json.loads(kl("drift", "ignore", "list", "--format", "json").stdout)["rules"]
    assert sorted(r["path"] for r in listed) == sorted(paths)
    assert all(r["hides"] == 1 for r in listed), listed


def test_sdk_complex_changes_reach_the_state_and_drift_with_secrets_masked(kl: Kl, ws: Path) -> None:
    kl.import_state()
    assert kl.refresh()["resources_changed"] == 0
    obj = edit_remote(ws, "sdk-b", size=2.25, tags={"env": "prod", "owner": "ops"}, labels=["y"],
                      secret="hunter3-rotated", rule=[{"key": "r1", "value": "v1"}, {"key": "r2", "value": ""}],
                      member=[{"name": "carol", "role": "admin"}])
    out = kl.refresh()
    assert out["status"] == "succeeded" and out["changed_addresses"] == [SDK], out
    got = kl.pulled()[SDK]
    for name in ("size", "tags", "labels", "secret", "rule", "member"):
        assert got["attributes"][name] == obj[name], name
    assert got["identity"] == {"id": "sdk-b", "region": "local"} and got["identity_schema_version"] == 1
    entry = kl.drift()[SDK]
    assert "hunter3" not in json.dumps(entry), entry
    assert _change_list(entry["changes"]) == sorted([
        ("secret", S, S),
        ("size", 1.5, 2.25),
        ('tags["env"]', "dev", "prod"),
        ('tags["owner"]', None, "ops"),
        ("labels", ["x", "y"], ["y"]),
        ("rule", [{"key": "r1", "value": "v1"}], [{"key": "r1", "value": "v1"}, {"key": "r2", "value": ""}]),
        ('member[={"name":"bob","role":"admin"}]', {"name": "bob", "role": "admin"}, None),
        ('member[={"name":"carol","role":"admin"}]', None, {"name": "carol", "role": "admin"}),
    ])


@pytest.mark.parametrize("address", [FW, SDK])
def test_a_deleted_remote_object_is_a_removal(kl: Kl, ws: Path, address: str) -> None:
    kl.import_state()
    remote(ws, BUILDS[address][2]).unlink()
    out = kl.refresh()
    assert out["status"] == "succeeded" and out["changed_addresses"] == [address], json.dumps(out)
    assert address not in kl.pulled()
    assert kl.drift()[address]["kind"] == "deleted"


@pytest.mark.parametrize("address", [FW, SDK])
def test_private_state_goes_to_the_provider_and_what_it_returns_is_kept(kl: Kl, address: str) -> None:
    def private(doc: dict[str, Any]) -> dict[str, Any]:
        decoded: dict[str, Any] = json.loads(base64.b64decode(doc[address]["private"]))
        return decoded

    kl.import_state()
    before = private(instances(state_doc(kl.ws)))
    # Committed, the first read's private data is Terraform's; the next refresh sends it and observes
    # what comes back.
    assert kl.refresh("--commit")["status"] == "succeeded"
    assert kl.refresh()["status"] == "succeeded"
    after = private(kl.pulled())
    if address == FW:
        # The framework build counts its reads in private state: create wrote 0 and each read adds
        # one to what it was sent, so 2 means kl sent back what the previous read returned.
        assert base64.b64decode(before["reads"]) == b"0"
        assert base64.b64decode(after["reads"]) == b"2"
    else:
        assert after == before == {"schema_version": "1"}  # the SDK's own private data, kept as sent


@pytest.mark.parametrize("address", [FW, SDK])
def test_an_object_stored_under_schema_version_0_is_upgraded(kl: Kl, address: str) -> None:
    doc = state_doc(kl.ws)
    inst = instances(doc)[address]
    inst["schema_version"] = 0
    inst["attributes"]["title"] = inst["attributes"].pop("name")  # version 0 called it "title"
    kl.import_state(doc)
    out = kl.refresh()
    assert out["status"] == "succeeded", out
    got = kl.pulled()[address]
    assert got["schema_version"] == 1
    assert got["attributes"]["name"] == ("alpha" if address == FW else "beta")
    assert "title" not in got["attributes"]


@pytest.mark.parametrize("address", [FW, SDK])
def test_identity_is_written_under_the_providers_identity_version(kl: Kl, address: str) -> None:
    assert "identity" not in instances(state_doc(kl.ws))[address]  # Terraform 1.8.5 writes none
    kl.import_state()
    assert kl.refresh()["status"] == "succeeded"
    got = kl.pulled()[address]
    assert (got["identity_schema_version"], got["identity"]) == (1, {"id": BUILDS[address][2], "region": "local"})


@pytest.mark.parametrize("address", [FW, SDK])
def test_an_identity_stored_under_version_0_is_upgraded_then_kept_across_a_change(kl: Kl, ws: Path, address: str) -> None:
    # Identity version 0 was {name}; the provider's upgrader makes it {id = name, region = "local"}.
    # Sent without the upgrade, {name} would not fit identity version 1 and the read would fail.
    ident = BUILDS[address][2]
    doc = state_doc(ws)
    instances(doc)[address].update(identity_schema_version=0, identity={"name": ident})
    kl.import_state(doc)
    edit_remote(ws, ident, tags={"env": "changed"})
    out = kl.refresh()
    assert out["status"] == "succeeded" and out["changed_addresses"] == [address], json.dumps(out)
    got = kl.pulled()[address]
    assert (got["identity_schema_version"], got["identity"]) == (1, {"id": ident, "region": "local"})
    assert got["attributes"]["tags"] == {"env": "changed"}
    assert _changes(kl.drift()[address])['tags["env"]'] == ("dev", "changed")
    r = kl("drift", "accept", "tp")  # Terraform's next version holds the upgraded identity
    assert r.returncode == 0, r.stderr
    assert kl.pulled(observed=False)[address]["identity"] == {"id": ident, "region": "local"}
    out = kl.refresh()  # the upgraded identity is now sent as it is, and kept
    assert out["status"] == "succeeded" and out["resources_changed"] == 0, out
    assert kl.pulled()[address]["identity"] == {"id": ident, "region": "local"}


def test_a_refresh_that_changes_nothing_stores_no_document_though_every_read_returns_an_identity(kl: Kl, db_url: str) -> None:
    # The SDKv2 provider returns each object's identity with every read (protocol 5.9). The first
    # refresh commits it (Terraform 1.8.5 wrote none); the second gets back what is stored, so no
    # object differs: --commit then writes no version, and records an observation that stores no
    # document at all, as a plain refresh does. (The framework provider's object is left out: it
    # counts its reads in private data, so every refresh changes it.)
    import psycopg

    doc = state_doc(kl.ws)
    doc["resources"] = [r for r in doc["resources"] if f"{r['type']}.{r['name']}" == SDK]
    kl.import_state(doc)
    committed = kl.refresh("--commit")
    assert committed["status"] == "succeeded" and committed["to_serial"] is not None, committed
    first = kl.pulled(observed=False)
    assert list(first) == [SDK] and first[SDK]["identity"] == {"id": BUILDS[SDK][2], "region": "local"}
    again = kl.refresh("--commit")
    assert (again["status"], again["to_serial"], again["observation"]) == (
        "succeeded", None, f"v{committed['to_serial']}.1"), again
    assert kl.pulled(observed=False) == first
    out = kl.refresh()
    assert (out["status"], out["resources_changed"], out["observation"]) == ("succeeded", 0, f"v{out['from_serial']}.2"), out
    assert kl.pulled() == first
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT raw_state IS NULL AND head_piece IS NULL FROM state_versions "
                         "WHERE kind = 'observation'").fetchall() == [(True,), (True,)]


@pytest.mark.parametrize("address", [FW, SDK])
def test_an_identity_from_a_newer_provider_fails_that_resource(kl: Kl, address: str) -> None:
    doc = state_doc(kl.ws)
    instances(doc)[address].update(identity_schema_version=2, identity={"id": BUILDS[address][2], "region": "local"})
    kl.import_state(doc)
    out = kl.refresh()
    assert out["status"] != "succeeded", out
    text = json.dumps(out)
    assert address in text and "identity schema version 2" in text, text


def test_the_read_delay_knob_slows_reads_down(kl: Kl) -> None:
    # Read latency for performance work: KL_TESTPROVIDER_READ_DELAY_MS (or the provider's
    # read_delay_ms). A 5 s read against a 1 s RPC timeout must time out; no clock is asserted.
    kl.import_state()
    out = kl.refresh("--rpc-timeout", "1s", env={"KL_TESTPROVIDER_READ_DELAY_MS": "5000"})
    assert out["status"] != "succeeded", out
    assert "did not answer within" in json.dumps(out), out


def test_a_provider_that_refuses_its_config_says_where_kl_takes_it_from(kl: Kl) -> None:
    # Terraform's provider block is never read: a provider that needs a setting there fails
    # Configure, and the run's one line must name the command that stores it for kl.
    kl.import_state()
    r = kl("refresh", "tp", "--provider-search-path", str(PLUGIN_CACHE), env={"KL_TESTPROVIDER_DIR": ""})
    err = r.stderr.decode()
    assert r.returncode == 1 and err.count("\n") == 1, err
    assert "no directory for the remote objects" in err, err
    assert re.search(r"fix: `kl provider configure kilolock/test(fw|sdk) --state tp --config FILE`", err), err


def test_a_read_a_cancel_cuts_short_resolves_no_drift(kl: Kl) -> None:
    # A read still in flight when the run is cancelled has no answer: it must not be reported as the
    # object read back as Terraform wrote it, which would claim its open drift resolved.
    kl.import_state()
    edit_remote(kl.ws, "sdk-b", tags={"env": "prod"})
    first = kl.refresh()
    assert first["status"] == "succeeded" and SDK in kl.drift(), first
    out = kl.refresh("--timeout", "10s", env={"KL_TESTPROVIDER_READ_DELAY_MS": "120000", "KL_STOP_GRACE": "1"})
    assert out["status"] == "cancelled" and out["resources_checked"] == 2, out  # both reads were sent, neither answered
    assert [d for d in out["drift"] if d["status"] == "resolved"] == [], out
    assert SDK in kl.drift()


def test_a_schema_cached_without_identity_schemas_is_fetched_again_once(kl: Kl, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A provider schema cached before kl asked for identity schemas would hide the identity for
    # good: the factory fetches it again, the cache then holds the identity schemas too.
    import dataclasses

    import psycopg

    from kilolock.refresh.factory import ProviderFactory
    from kilolock.store import provider_schemas, states

    kl.import_state()
    monkeypatch.setenv("KL_TESTPROVIDER_DIR", str(kl.ws / "remote"))
    source = "registry.terraform.io/kilolock/testfw"
    with psycopg.connect(db_url, autocommit=True) as conn:
        def opened() -> tuple[int, int | None]:
            factory = ProviderFactory(conn, states.state_id(conn, "tp"), (str(PLUGIN_CACHE),))
            client = factory.open(source, "", Redactor())
            try:
                return factory.get_schema_calls, client.identity_schema_version("testfw_thing")
            finally:
                client.close()

        calls, identity = opened()
        assert (calls, identity) == (1, 1)
        cached = provider_schemas.get(conn, source, "0.1.0")
        assert cached is not None and cached.identity_schemas is not None
        provider_schemas.put(conn, source, "0.1.0", dataclasses.replace(cached, identity_schemas=None))
        assert opened()[0] == 1  # fetched again
        assert opened()[0] == 0  # and cached with its identity schemas from then on
