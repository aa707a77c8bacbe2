"""Equal to Terraform (issue 16): `kl refresh` writes what `terraform apply -refresh-only` writes.

A state made by Terraform 1.13.3, 1.12.2 or 1.8.5 (or OpenTofu 1.12.6 or 1.8.5) with real
providers, the same out-of-band changes, then from the same state and the same provider binaries:
Terraform refreshes one copy (`apply -refresh-only -auto-approve`), kl another (`state import`,
`refresh`, `state pull --observed`). The resources they write must be equal field by field (attributes,
sensitive_attributes, identity, private, schema_version, every other key of the instance objects,
which instances and resources remain), and `plan -refresh=false -detailed-exitcode` must give the
same exit code and the same planned actions on both states (0 when nothing drifted).

PROVIDERS is the table: a provider (and what it is tested with) is one row, its resources and the
out-of-band changes made to them. TOOLS are the CLIs it is checked against.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from kit.paths import CACHE, LOCAL_V, PLUGIN_CACHE, RANDOM_V
from kit.tfcli import tool_binary
from kit.tfequal import compare_resources

# Whether each CLI writes sensitive_attributes in a stable order: Terraform >= 1.12 sorts them (by
# their display form, as kl does); OpenTofu 1.12 writes them in go-cty's walk order (stable, and
# kl's order for every mark made here); Terraform 1.8 and OpenTofu 1.8 write them in Go's map
# order, so only the set can be compared.
MARKS_ORDERED = {"terraform-1.12.2": True, "tofu-1.8.5": False, "terraform-1.8.5": False,
                 "terraform-1.13.3": True, "tofu-1.12.6": True}
TOOLS = tuple(MARKS_ORDERED)
# Whether each CLI keeps resource identity (Terraform >= 1.12, OpenTofu >= 1.12). kl writes the identity a provider
# reports whatever CLI wrote the state (it matches the newest Terraform), so against an older CLI
# kl's identity fields are checked on their own and left out of the comparison: the plan on kl's
# state then shows that CLI reads such a state as it reads its own.
KEEPS_IDENTITY = {"terraform-1.12.2": True, "tofu-1.8.5": False, "terraform-1.8.5": False,
                  "terraform-1.13.3": True, "tofu-1.12.6": True}
IDENTITY_FIELDS = ("identity", "identity_schema_version")


@dataclass(frozen=True)
class ProviderRow:
    name: str  # its local name in required_providers
    version: str
    # Its resources, for the run with out-of-band changes (True: some resources need a setting for
    # that) and the CLI (write-only attributes need Terraform >= 1.11).
    resources: Callable[[bool, str], str]
    # The out-of-band changes, made in the workspace after the apply, before either refresh.
    drift: Callable[[Path], None]
    # What `plan -refresh=false` then plans for this row's resources ({address: actions}): proof
    # that the changes were made and seen. No-ops are left out.
    planned_after_drift: dict[str, list[str]]
    # The full source address: OpenTofu's default registry differs, the filesystem mirror does not.
    namespace: str = "registry.terraform.io/hashicorp"

    @property
    def requirement(self) -> str:
        return f'{self.name} = {{ source = "{self.namespace}/{self.name}", version = "{self.version}" }}'


def _null_resources(drifting: bool, tool: str) -> str:
    return """
resource "null_resource" "n" {
  count    = 2
  triggers = { index = count.index, note = "a<b & c" }
}
"""


def _local_resources(drifting: bool, tool: str) -> str:
    return """
resource "local_file" "f" {
  for_each = toset(["kept", "deleted", "edited"])
  filename = "${path.module}/out/${each.key}.txt"
  content  = "hello ${each.key}"
}
resource "local_sensitive_file" "s" {
  filename = "${path.module}/out/secret.txt"
  content  = "s3cr3t"
}
# kl does not read data sources; one whose source did not change must come out as Terraform's.
data "local_file" "kept" { filename = local_file.f["kept"].filename }
"""


def _local_drift(ws: Path) -> None:
    (ws / "out" / "deleted.txt").unlink()
    (ws / "out" / "edited.txt").write_text("edited behind Terraform's back")


def _random_resources(drifting: bool, tool: str) -> str:
    return """
resource "random_id" "k" {
  byte_length = 4
  keepers     = { generation = "1" }
}
resource "random_password" "p" { length = 16 }
resource "random_string" "s" { length = 8 }
resource "random_integer" "i" {
  min = 1
  max = 1000
}
resource "random_pet" "pet" {}
resource "random_shuffle" "sh" { input = ["a", "b", "c"] }
resource "random_uuid" "u" {}
"""


# time_rotating leaves the state once its rotation time has passed (Read removes it): a real
# out-of-band change made by the clock. Far in the future for the run without changes.
_ROTATE_AFTER_S = 3


def _time_resources(drifting: bool, tool: str) -> str:
    at = datetime.now(timezone.utc) + timedelta(seconds=_ROTATE_AFTER_S) if drifting else datetime(2099, 1, 1, tzinfo=timezone.utc)
    return f"""
resource "time_static" "t" {{}}
resource "time_offset" "o" {{ offset_days = 7 }}
resource "time_rotating" "r" {{ rotation_rfc3339 = "{at.strftime("%Y-%m-%dT%H:%M:%SZ")}" }}
"""


def _time_drift(ws: Path) -> None:
    time.sleep(_ROTATE_AFTER_S + 1.1)  # at most: the apply took part of it


def _nothing(ws: Path) -> None:
    pass


# Our test provider (tests/testprovider), both builds: each remote object is <workspace>/remote/<id>.json
# (KL_TESTPROVIDER_DIR, set per workspace by Cli.run and _kl_refresh), so editing a file is an
# out-of-band change of a complex value and deleting it a removal. Private state counts the reads
# (testfw) or holds sdk/v2's meta (testsdk); identity is written by Terraform and OpenTofu >= 1.12
# only; write-only attributes are set where the CLI takes them (Terraform and OpenTofu >= 1.11).
# testfw's dyn.pin is marked sensitive by the configuration: a mark inside a dynamic value, which
# state JSON stores under the value's {"value", "type"} wrapper while the mark's path does not name it.
_TESTPROVIDER_KEYS = ("kept", "edited", "gone")
_WRITE_ONLY_TOOLS = {"terraform-1.12.2", "terraform-1.13.3", "tofu-1.12.6"}


def _testfw_resources(drifting: bool, tool: str) -> str:
    write_only = '\n  password_wo = "wo-${each.key}"' if tool in _WRITE_ONLY_TOOLS else ""
    return f"""
resource "testfw_thing" "t" {{
  for_each    = toset({json.dumps(list(_TESTPROVIDER_KEYS))})
  id          = "fw-${{each.key}}"
  name        = "thing ${{each.key}}"
  tags        = {{ env = "dev", team = "core" }}
  secret      = "hunter2"{write_only}
  dyn         = {{ x = 1, y = ["a", "b"], pin = sensitive("pin-${{each.key}}") }}
  objects     = [{{ k = "one", v = 1 }}, {{ k = "two", v = 2.5 }}]
  single      = {{ a = "s", n = 3, token = "tok-1" }}
  list_nested = [{{ a = "l0", n = 0 }}, {{ a = "l1", n = 1 }}]
  set_nested  = [{{ a = "s0", n = null }}, {{ a = "s1", n = 1 }}]
  map_nested  = {{ m = {{ a = "m0", n = 7 }} }}
  rule {{
    key   = "r1"
    value = "v1"
  }}
  member {{
    name = "bob"
    role = "admin"
  }}
  member {{ name = "eve" }}
}}
"""


def _testsdk_resources(drifting: bool, tool: str) -> str:
    write_only = '\n  password_wo = "wo-${each.key}"' if tool in _WRITE_ONLY_TOOLS else ""
    return f"""
resource "testsdk_thing" "t" {{
  for_each = toset({json.dumps(list(_TESTPROVIDER_KEYS))})
  key      = "sdk-${{each.key}}"
  name     = "thing ${{each.key}}"
  size     = 1.5
  tags     = {{ env = "dev" }}
  labels   = ["x", "y"]
  secret   = "hunter3"{write_only}
  rule {{
    key   = "r1"
    value = "v1"
  }}
  member {{
    name = "bob"
    role = "admin"
  }}
}}
"""


def _edit_remote(ws: Path, ident: str, **changes: Any) -> None:
    path = ws / "remote" / f"{ident}.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def _testfw_drift(ws: Path) -> None:
    _edit_remote(ws, "fw-edited",
                 tags={"env": "prod", "team": "core"}, secret="hunter2-rotated",
                 dyn={"value": ["now", "a", "list"], "type": ["list", "string"]},
                 objects=[{"k": "one", "v": 1}, {"k": "three", "v": 3}],
                 single={"a": "s", "n": 4, "token": "tok-2"}, list_nested=[{"a": "l0", "n": 0}],
                 set_nested=[{"a": "s0", "n": None}, {"a": "s2", "n": 2}],
                 map_nested={"m": {"a": "m0", "n": 8}, "k": {"a": "k0", "n": None}},
                 rule=[{"key": "r1", "value": "v2"}], member=[{"name": "bob", "role": "viewer"}],
                 password_wo="written-out-of-band")  # write-only: the provider never reports it
    (ws / "remote" / "fw-gone.json").unlink()


def _testsdk_drift(ws: Path) -> None:
    _edit_remote(ws, "sdk-edited", size=2.25, tags={"env": "prod", "owner": "ops"}, labels=["y"],
                 secret="hunter3-rotated", rule=[{"key": "r1", "value": "v1"}, {"key": "r2", "value": ""}],
                 member=[{"name": "carol", "role": "admin"}])
    (ws / "remote" / "sdk-gone.json").unlink()


PROVIDERS = (
    ProviderRow("null", "2.1.2", _null_resources, _nothing, {}),
    ProviderRow("local", LOCAL_V, _local_resources, _local_drift,
                # The data source depends on local_file.f, which has changes planned: read at apply.
                {'local_file.f["deleted"]': ["create"], 'local_file.f["edited"]': ["create"], "data.local_file.kept": ["read"]}),
    ProviderRow("random", RANDOM_V, _random_resources, _nothing, {}),
    ProviderRow("time", "0.14.2", _time_resources, _time_drift, {"time_rotating.r": ["create"]}),
    ProviderRow("testfw", "0.1.0", _testfw_resources, _testfw_drift,
                {'testfw_thing.t["edited"]': ["update"], 'testfw_thing.t["gone"]': ["create"]},
                namespace="registry.terraform.io/kilolock"),
    ProviderRow("testsdk", "0.1.0", _testsdk_resources, _testsdk_drift,
                {'testsdk_thing.t["edited"]': ["update"], 'testsdk_thing.t["gone"]': ["create"]},
                namespace="registry.terraform.io/kilolock"),
)


def _main_tf(drifting: bool, tool: str) -> str:
    requirements = "\n    ".join(row.requirement for row in PROVIDERS)
    resources = "".join(row.resources(drifting, tool) for row in PROVIDERS)
    return f"terraform {{\n  required_providers {{\n    {requirements}\n  }}\n}}\n{resources}"


@dataclass
class Cli:
    tool: str
    binary: Path

    def run(self, ws: Path, *args: str, codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, TF_CLI_CONFIG_FILE=str(CACHE / "terraformrc"), TF_IN_AUTOMATION="1", CHECKPOINT_DISABLE="1",
                   **_testprovider_env(ws))
        env.pop("TF_LOG", None)
        r = subprocess.run([str(self.binary), *args, "-no-color"], cwd=ws, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode in codes, f"{self.tool} {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
        return r

    def planned(self, ws: Path) -> tuple[int, list[tuple[str, list[str]]]]:
        """`plan -refresh=false -detailed-exitcode`: its exit code and (address, actions) per resource change."""
        code = self.run(ws, "plan", "-refresh=false", "-detailed-exitcode", "-input=false", "-out=equal.tfplan",
                        codes=(0, 2)).returncode
        shown = json.loads(self.run(ws, "show", "-json", "equal.tfplan").stdout)
        return code, sorted((c["address"], c["change"]["actions"]) for c in shown.get("resource_changes", []))


def _testprovider_env(ws: Path) -> dict[str, str]:
    """Each workspace copy has its own remote objects."""
    return {"KL_TESTPROVIDER_DIR": str(ws / "remote")}


def _kl_refresh(run_kl, ws: Path, name: str) -> dict:
    """kl's refresh of the workspace's terraform.tfstate: its observation, the document `kl state pull
    --observed` gives after it (Terraform's serial and lineage, with what the refresh read), written
    back to the workspace for the CLI to plan from."""
    r = run_kl("state", "import", name, str(ws / "terraform.tfstate"), "--source", "apply")
    assert r.returncode == 0, r.stderr
    # local_file paths are relative to the workspace, as for Terraform.
    r = run_kl("state", "set", name, "--workdir", str(ws))
    assert r.returncode == 0, r.stderr
    r = run_kl("refresh", name, "--provider-search-path", str(PLUGIN_CACHE), "--format", "json", timeout=600,
               env=_testprovider_env(ws))
    out = json.loads(r.stdout or b"{}")
    assert r.returncode == 0 and out.get("status") == "succeeded" and out.get("to_serial") is None, (out, r.stderr)
    assert out.get("observation") == f"v{out['from_serial']}.1", out
    pulled = run_kl("state", "pull", name, "--observed")
    assert pulled.returncode == 0, pulled.stderr
    assert json.loads(pulled.stdout)["serial"] == out["from_serial"]
    (ws / "terraform.tfstate").write_bytes(pulled.stdout)
    return json.loads(pulled.stdout)


@pytest.mark.parametrize("drifting", [False, True], ids=["unchanged", "out-of-band"])
@pytest.mark.parametrize("tool", TOOLS)
def test_kl_refresh_writes_what_refresh_only_writes(tool: str, drifting: bool, run_kl, db_url, tmp_path: Path):
    cli = Cli(tool, tool_binary(tool))
    for row in PROVIDERS:
        if row.namespace.endswith("/kilolock") and not (PLUGIN_CACHE / row.namespace / row.name).exists():
            pytest.fail(f"the {row.name} test provider is missing: run scripts/test-providers.sh {row.name}", pytrace=False)
    ws = tmp_path / "applied"
    ws.mkdir()
    (ws / "main.tf").write_text(_main_tf(drifting, tool))
    cli.run(ws, "init", "-input=false")
    cli.run(ws, "apply", "-auto-approve", "-input=false")
    if drifting:
        for row in PROVIDERS:
            row.drift(ws)
    ws_tf, ws_kl = tmp_path / "terraform", tmp_path / "kl"
    shutil.copytree(ws, ws_tf, symlinks=True)
    shutil.copytree(ws, ws_kl, symlinks=True)

    cli.run(ws_tf, "apply", "-refresh-only", "-auto-approve", "-input=false")
    by_terraform = json.loads((ws_tf / "terraform.tfstate").read_text())
    by_kl = _kl_refresh(run_kl, ws_kl, "equal")

    _the_testprovider_rows_hold_what_they_test(by_terraform, tool)
    if not KEEPS_IDENTITY[tool]:
        by_kl = _identity_checked_and_left_out(by_kl)
    differences = compare_resources(by_terraform, by_kl, marks_ordered=MARKS_ORDERED[tool])
    assert not differences, f"kl's refresh differs from {tool}'s:\n" + "\n".join(map(str, differences))

    tf_code, tf_actions = cli.planned(ws_tf)
    kl_code, kl_actions = cli.planned(ws_kl)
    assert (kl_code, kl_actions) == (tf_code, tf_actions)
    # The test saw what it meant to: the changes it made, and none without them.
    expected = {a: actions for row in PROVIDERS for a, actions in row.planned_after_drift.items()} if drifting else {}
    assert (tf_code, {a: actions for a, actions in tf_actions if actions != ["no-op"]}) == (2 if expected else 0, expected)


@pytest.mark.parametrize("tool", [tool for tool in TOOLS if KEEPS_IDENTITY[tool]])
def test_schema_and_identity_upgrades_write_what_the_cli_writes(tool: str, run_kl, db_url, tmp_path: Path):
    """An instance stored under older versions: schema version 0 (testsdk's `title`, since renamed
    `name`) and identity schema version 0 ({name}, now {id, region}), as a state written with an
    older provider holds it (made by hand: no released provider had those versions). Each CLI that
    keeps identity (Terraform >= 1.12, OpenTofu >= 1.12) upgrades both before the read
    (UpgradeResourceState, UpgradeResourceIdentity); kl must write the same. Only the test
    provider's rows: they alone have versions to upgrade."""
    cli = Cli(tool, tool_binary(tool))
    rows = [row for row in PROVIDERS if row.namespace.endswith("/kilolock")]
    ws = tmp_path / "applied"
    ws.mkdir()
    requirements = "\n    ".join(row.requirement for row in rows)
    (ws / "main.tf").write_text(f"terraform {{\n  required_providers {{\n    {requirements}\n  }}\n}}\n"
                                + "".join(row.resources(False, tool) for row in rows))
    cli.run(ws, "init", "-input=false")
    cli.run(ws, "apply", "-auto-approve", "-input=false")
    doc = json.loads((ws / "terraform.tfstate").read_text())
    for resource in doc["resources"]:
        kept = next(i for i in resource["instances"] if i["index_key"] == "kept")
        kept["identity"], kept["identity_schema_version"] = {"name": kept["identity"]["id"]}, 0
        if resource["type"] == "testsdk_thing":
            kept["schema_version"] = 0
            kept["attributes"]["title"] = kept["attributes"].pop("name")
    (ws / "terraform.tfstate").write_text(json.dumps(doc))
    ws_tf, ws_kl = tmp_path / "terraform", tmp_path / "kl"
    shutil.copytree(ws, ws_tf, symlinks=True)
    shutil.copytree(ws, ws_kl, symlinks=True)

    cli.run(ws_tf, "apply", "-refresh-only", "-auto-approve", "-input=false")
    by_terraform = json.loads((ws_tf / "terraform.tfstate").read_text())
    by_kl = _kl_refresh(run_kl, ws_kl, "upgraded")
    upgraded = [i for r in by_terraform["resources"] for i in r["instances"] if i["index_key"] == "kept"]
    assert [(i["schema_version"], i["identity_schema_version"], "name" in i["attributes"]) for i in upgraded] == [(1, 1, True)] * 2
    differences = compare_resources(by_terraform, by_kl, marks_ordered=MARKS_ORDERED[tool])
    assert not differences, f"kl's refresh differs from {tool}'s:\n" + "\n".join(map(str, differences))
    assert cli.planned(ws_kl) == cli.planned(ws_tf)


@pytest.mark.parametrize("row_name", ["testsdk", "testfw"])
def test_an_instance_stored_without_identity_gets_the_identity_its_read_returns(row_name: str, run_kl, db_url,
                                                                                 tmp_path: Path):
    """A state from before Terraform 1.12 (made by 1.8.5: no identity stored) whose provider now
    has an identity schema (version 1), with out-of-band changes. Terraform 1.12.2 sends each such
    instance to UpgradeResourceIdentity (version 0, an empty identity): sdk/v2 answers with no
    identity, the read then returns one and Terraform stores it; the framework passes the empty
    identity to testfw's upgrader, which refuses it, and Terraform's refresh fails. kl does not ask
    for that upgrade: its refresh succeeds, stores the identity the read returns, and writes what
    Terraform writes where Terraform succeeds (docs/refresh.md: "Equal to Terraform")."""
    row = next(r for r in PROVIDERS if r.name == row_name)
    old, new = Cli("terraform-1.8.5", tool_binary("terraform-1.8.5")), Cli("terraform-1.12.2", tool_binary("terraform-1.12.2"))
    ws = tmp_path / "applied"
    ws.mkdir()
    (ws / "main.tf").write_text(f"terraform {{\n  required_providers {{\n    {row.requirement}\n  }}\n}}\n"
                                + row.resources(True, old.tool))
    old.run(ws, "init", "-input=false")
    old.run(ws, "apply", "-auto-approve", "-input=false")
    applied = json.loads((ws / "terraform.tfstate").read_text())
    assert all("identity" not in i for r in applied["resources"] for i in r["instances"])
    row.drift(ws)
    ws_tf, ws_kl = tmp_path / "terraform", tmp_path / "kl"
    shutil.copytree(ws, ws_tf, symlinks=True)
    shutil.copytree(ws, ws_kl, symlinks=True)

    by_kl = _kl_refresh(run_kl, ws_kl, "identity")
    instances = [i for r in by_kl["resources"] for i in r["instances"]]
    assert sorted(i["index_key"] for i in instances) == ["edited", "kept"]  # "gone" was removed
    for i in instances:
        assert (i["identity_schema_version"], i["identity"]) == (1, {"id": i["attributes"]["id"], "region": "local"}), i

    r = new.run(ws_tf, "apply", "-refresh-only", "-auto-approve", "-input=false", codes=(0, 1))
    if row_name == "testfw":
        assert r.returncode == 1 and "upgrading identity v0" in r.stderr, r.stderr
        assert json.loads((ws_tf / "terraform.tfstate").read_text()) == applied  # Terraform wrote nothing
        return
    by_terraform = json.loads((ws_tf / "terraform.tfstate").read_text())
    differences = compare_resources(by_terraform, by_kl, marks_ordered=MARKS_ORDERED[new.tool])
    assert not differences, f"kl's refresh differs from {new.tool}'s:\n" + "\n".join(map(str, differences))
    assert new.planned(ws_kl) == new.planned(ws_tf)


def _the_testprovider_rows_hold_what_they_test(state: dict[str, Any], tool: str) -> None:
    """Private state always, identity where the CLI keeps it, write-only values nowhere, a mark
    inside a dynamic value: else the comparison of those fields would pass without comparing anything."""
    things = [(r["type"], i) for r in state["resources"] if r["type"] in ("testfw_thing", "testsdk_thing") for i in r["instances"]]
    assert {t for t, _ in things} == {"testfw_thing", "testsdk_thing"}, things
    for type_, instance in things:
        assert instance.get("private"), (type_, instance)
        assert instance["attributes"]["password_wo"] is None, (type_, instance)
        assert ("identity" in instance) == KEEPS_IDENTITY[tool], (tool, type_, instance)
    pin = [{"type": "get_attr", "value": "dyn"}, {"type": "get_attr", "value": "pin"}]
    kept = [i for t, i in things if t == "testfw_thing" and i["attributes"]["id"] == "fw-kept"]
    assert kept and pin in kept[0]["sensitive_attributes"], kept  # a mark inside a dynamic value, kept


def _identity_checked_and_left_out(state: dict[str, Any]) -> dict[str, Any]:
    """kl's state without identity fields, after checking them: exactly the test provider's
    instances have them, as the provider reports them (identity schema version 1)."""
    out = json.loads(json.dumps(state))
    for resource in out["resources"]:
        for instance in resource["instances"]:
            if resource["type"] in ("testfw_thing", "testsdk_thing"):
                ident = instance["attributes"]["id"]
                assert (instance.get("identity"), instance.get("identity_schema_version")) == (
                    {"id": ident, "region": "local"}, 1), instance
            for field in IDENTITY_FIELDS:
                assert resource["type"] in ("testfw_thing", "testsdk_thing") or field not in instance, instance
                instance.pop(field, None)
    return out


def test_the_comparer_names_the_instance_and_field_that_differ():
    def state(*instances: dict) -> dict:
        return {"resources": [{"mode": "managed", "type": "null_resource", "name": "n",
                               "provider": 'provider["registry.terraform.io/hashicorp/null"]',
                               "instances": list(instances)}]}

    a: dict[str, Any] = {"index_key": 0, "schema_version": 0, "attributes": {"id": "1", "triggers": {"k": "v"}},
         "sensitive_attributes": [[{"type": "get_attr", "value": "b"}], [{"type": "get_attr", "value": "a"}]]}
    b = {**a, "index_key": 1, "private": "eyJ9"}
    assert compare_resources(state(a, b), state(a, b)) == []
    changed = {**a, "attributes": {"id": "1", "triggers": {"k": "w"}}, "schema_version": 1}
    found = [str(d) for d in compare_resources(state(a, b), state(changed))]
    assert found == ['null_resource.n: instance_count: terraform 2 != kl 1',
                     'null_resource.n[0]: attributes.triggers.k: terraform "v" != kl "w"',
                     'null_resource.n[0]: schema_version: terraform 0 != kl 1',
                     'null_resource.n[1]: terraform "present" != kl (absent)']
    reordered = {**a, "sensitive_attributes": a["sensitive_attributes"][::-1]}
    assert [d.field for d in compare_resources(state(a), state(reordered))] == ["sensitive_attributes"]
    assert compare_resources(state(a), state(reordered), marks_ordered=False) == []
    without_private = {**b}
    del without_private["private"]
    assert [str(d) for d in compare_resources(state(b), state(without_private))] == [
        'null_resource.n[1]: private: terraform "eyJ9" != kl (absent)']
