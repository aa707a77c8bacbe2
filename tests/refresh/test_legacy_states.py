"""Every state Terraform reads, kl reads (issue 19): 0.12-era provider addresses, flatmap
attributes, version 3, dynamic values, with real Terraform and the real null provider.

The corpus (tests/fixtures/states/legacy/, README there) is written in each shape; the Terraform
1.8.5 files in it were written by Terraform itself.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kit.invariants import reindex_mismatches
from kit.paths import CACHE, PLUGIN_CACHE, REPO
from kit.pg import one_row
from kit.tfcli import tool_binary

CORPUS = REPO / "tests" / "fixtures" / "states" / "legacy"
SEARCH = ("--provider-search-path", str(PLUGIN_CACHE))
NULL = 'provider["registry.terraform.io/hashicorp/null"]'
# Every version-4 file of the corpus comes back from `kl state pull` byte for byte.
V4_FILES = sorted(p.name for p in CORPUS.glob("*.tfstate") if json.loads(p.read_text())["version"] == 4)
# The ones whose every managed resource the real null provider can refresh.
REFRESHABLE = ["tf012-null-legacy-providers.tfstate", "tf012-provider-address-whitespace.tfstate",
               "tf013-legacy-namespace.tfstate", "tf125-flatmap.tfstate", "tf185-tainted-deposed-checks.tfstate",
               "v3-terraformer.tfstate"]


def lifecycle_rows(db_url: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute(
            """SELECT address, deposed, mode, provider, status, schema_version, attributes IS NULL, create_serial, delete_serial
               FROM resources ORDER BY address, deposed, create_serial""").fetchall()


def expected_rows(doc: dict, serial: int) -> list[tuple]:
    from kilolock import tfstate

    state = tfstate.parse_state(doc)
    return sorted((i.address, i.deposed, i.mode, i.provider, i.obj.get("status"), i.schema_version, i.flatmap is not None,
                   serial, None) for i in state.instances)


def kl_refresh(run_kl, ws: Path, *extra: str) -> dict:
    r = run_kl("refresh", "prod", *SEARCH, "--workdir", str(ws), "--format", "json", *extra)
    assert r.returncode == 0, r.stderr.decode() + r.stdout.decode()
    return json.loads(r.stdout)


def drift_count(db_url: str) -> int:
    with psycopg.connect(db_url) as c:
        return int(one_row(c, "SELECT count(*) FROM drift_records")[0])


class Terraform18:
    """Terraform 1.8.5 in a directory, offline: providers come from the test cache's mirror."""

    def __init__(self, ws: Path) -> None:
        self.ws = ws
        self.binary = tool_binary("terraform-1.8.5")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {"TF_CLI_CONFIG_FILE": str(CACHE / "terraformrc"), "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1",
               "PATH": "/usr/bin:/bin", "HOME": str(self.ws)}
        return subprocess.run([str(self.binary), *args, "-no-color"], cwd=self.ws, env=env, capture_output=True,
                              text=True, timeout=300)


# --- the corpus: import, pull, lifecycle rows ----------------------------------------------------


@pytest.mark.parametrize("name", V4_FILES)
def test_corpus_file_imports_pulls_byte_identical_and_indexes_every_object(db_url, run_kl, name):
    text = (CORPUS / name).read_text()
    r = run_kl("state", "import", "prod", str(CORPUS / name))
    assert r.returncode == 0, r.stderr
    pulled = run_kl("state", "pull", "prod")
    assert pulled.returncode == 0 and pulled.stdout.decode() == text
    doc = json.loads(text)
    assert lifecycle_rows(db_url) == expected_rows(doc, doc["serial"])


# Legacy provider addresses spelled every way Terraform's parser (HCL's traversal parser) reads,
# and some it does not: whitespace and comments between the parts, none inside a name.
SPELLINGS = ["provider.null", "provider. null", "provider .null", " provider.null ", "provider.\tnull",
             "provider.\r\nnull", "module. m .provider. null. al", "module.a.module.b.provider.aws.west",
             "provider./*c*/null", "provider.null # c", "provider.null // c", "provider.null#c\n",
             "provider.\rnull", "provider.nu ll", "provider.null /* c", "provider.null # c\nx", "provider. null.",
             "provider.null\v", "module.m[\"k\"].provider.null"]


def test_legacy_provider_addresses_are_read_as_terraform_reads_them(tmp_path):
    """Each spelling Terraform 1.8.5 reads, kl resolves to the same provider configuration (its
    type, module and alias; Terraform keeps the unresolved legacy namespace "-" where kl resolves
    it as 0.13 did), and each Terraform cannot read (it drops the resource), kl refuses."""
    from kilolock import tfstate

    resources = [{"mode": "managed", "type": "null_resource", "name": f"r{i}", "provider": spelling,
                  "instances": [{"schema_version": 0, "attributes": {"id": str(i)}}]} for i, spelling in enumerate(SPELLINGS)]
    doc = {"version": 4, "terraform_version": "0.12.31", "serial": 1, "lineage": "l-1", "outputs": {}, "resources": resources}
    (tmp_path / "terraform.tfstate").write_text(json.dumps(doc))
    r = Terraform18(tmp_path).run("state", "pull")
    assert r.returncode == 0, r.stderr
    terraform = {res["name"]: res["provider"].replace('"registry.terraform.io/-/', '"registry.terraform.io/hashicorp/')
                 for res in json.loads(r.stdout)["resources"]}
    kl = {}
    for i, spelling in enumerate(SPELLINGS):
        try:
            kl[f"r{i}"] = tfstate.parse_provider(spelling).modern
        except tfstate.StateError:
            pass
    assert kl == terraform
    assert len(kl) == 12  # the test read both kinds of spelling


def test_version_3_is_stored_as_the_version_4_terraform_upgrades_it_to(db_url, run_kl, tmp_path):
    r = run_kl("state", "import", "prod", str(CORPUS / "v3-terraformer.tfstate"))
    assert r.returncode == 0, r.stderr
    assert b"upgraded state format version 3 to 4 as Terraform does" in r.stdout
    assert b"stored serial 1 (import), 8 instances: 8 lifecycles opened" in r.stdout
    expected = (CORPUS / "v3-terraformer.v4.tfstate").read_text()
    ours = run_kl("state", "pull", "prod").stdout.decode()
    assert ours == expected
    assert lifecycle_rows(db_url) == expected_rows(json.loads(expected), 1)

    # Terraform 1.8.5 upgrades the same file the same way: replace-provider reads it and writes
    # version 4 (with modern provider addresses and what its writer adds).
    tf = Terraform18(tmp_path)
    shutil.copy(CORPUS / "v3-terraformer.tfstate", tmp_path / "terraform.tfstate")
    r2 = tf.run("state", "replace-provider", "-auto-approve", "--", "-/null", "hashicorp/null")
    assert r2.returncode == 0, r2.stderr
    theirs = json.loads((tmp_path / "terraform.tfstate").read_text())
    ours_doc = json.loads(ours)
    from kilolock import tfstate

    for res in ours_doc["resources"]:
        res["provider"] = tfstate.parse_provider(res["provider"]).modern
        for obj in res["instances"]:
            obj["sensitive_attributes"] = []
    for doc in (ours_doc, theirs):
        for key in ("terraform_version", "serial", "check_results"):
            doc.pop(key, None)
    assert ours_doc == theirs


def test_terraform_written_dynamic_values_come_back_byte_identical_from_pull_and_the_backend(db_url, run_kl, tmp_path):
    tf = Terraform18(tmp_path)
    (tmp_path / "main.tf").write_text("""
resource "terraform_data" "d" {
  input            = { name = "web", ports = [80, 443], tags = { b = "2", a = "1" }, on = true, nothing = null }
  triggers_replace = [{ type = "string", value = "x" }]
}
resource "terraform_data" "empty" {}
output "o" { value = terraform_data.d.output }
""")
    for args in (("init", "-input=false"), ("apply", "-auto-approve", "-input=false")):
        r = tf.run(*args)
        assert r.returncode == 0, r.stderr
    written = (tmp_path / "terraform.tfstate").read_text()
    attrs = json.loads(written)["resources"][0]["instances"][0]["attributes"]
    assert list(attrs["input"]) == ["value", "type"]  # what this test is about
    assert run_kl("state", "import", "prod", str(tmp_path / "terraform.tfstate")).returncode == 0
    assert run_kl("state", "pull", "prod").stdout.decode() == written

    from kilolock import tfstate
    from kilolock.server.store_ops import read_current

    with psycopg.connect(db_url) as conn:
        current = read_current(conn, "prod")
    assert current is not None and not current.encrypted
    assert tfstate.pretty_state(current.text) == written  # the body of GET /states/prod (server/backend.py)


# --- refresh with the real null provider ---------------------------------------------------------


STATE_012: dict[str, Any] = {
    "version": 4, "terraform_version": "0.12.31", "serial": 4, "lineage": "7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d",
    "outputs": {},
    "resources": [
        {"mode": "managed", "type": "null_resource", "name": "alt", "provider": "provider.null.alt",
         "instances": [{"schema_version": 0, "attributes": {"id": "8674665223082153551", "triggers": None}, "private": "bnVsbA=="}]},
        {"mode": "managed", "type": "null_resource", "name": "n", "each": "list", "provider": "provider.null",
         "instances": [
             {"index_key": 0, "schema_version": 0, "attributes": {"id": "3019858254213405221", "triggers": {"index": "0"}},
              "private": "bnVsbA=="},
             {"index_key": 1, "schema_version": 0, "attributes": {"id": "5577006791947779410", "triggers": {"index": "1"}},
              "private": "bnVsbA==", "dependencies": ["null_resource.alt"]}]},
        {"module": "module.net", "mode": "managed", "type": "null_resource", "name": "m", "provider": "module.net.provider.null",
         "instances": [{"schema_version": 0, "attributes": {"id": "6129484611666145821", "triggers": {"zone": "a"}},
                        "private": "bnVsbA=="}]},
    ],
}
CONFIG_012 = """
terraform {
  required_providers {
    null = { source = "hashicorp/null", version = "2.1.2" }
  }
}
provider "null" {}
provider "null" { alias = "alt" }
resource "null_resource" "alt" { provider = null.alt }
resource "null_resource" "n" {
  count    = 2
  triggers = { index = count.index }
}
module "net" { source = "./net" }
"""
CONFIG_012_NET = """
terraform {
  required_providers {
    null = { source = "hashicorp/null", version = "2.1.2" }
  }
}
provider "null" {}
resource "null_resource" "m" { triggers = { zone = "a" } }
"""


@pytest.mark.usefixtures("read_path")  # the upgrades run on a thread from the loop
def test_a_0_12_state_refreshes_commits_modern_provider_addresses_and_terraform_plans_no_changes(db_url, run_kl, tmp_path):
    ws = tmp_path / "ws"
    (ws / "net").mkdir(parents=True)
    (ws / "main.tf").write_text(CONFIG_012)
    (ws / "net" / "main.tf").write_text(CONFIG_012_NET)
    (tmp_path / "in.tfstate").write_text(json.dumps(STATE_012, indent=2) + "\n")
    assert run_kl("state", "import", "prod", str(tmp_path / "in.tfstate")).returncode == 0
    imported = lifecycle_rows(db_url)
    assert sorted(r[3] for r in imported) == ["module.net.provider.null", "provider.null", "provider.null", "provider.null.alt"]

    # Terraform 1.x itself refuses this state until its addresses are rewritten.
    tf = Terraform18(ws)
    (ws / "terraform.tfstate").write_bytes(run_kl("state", "pull", "prod").stdout)
    r = tf.run("init", "-input=false")
    assert r.returncode == 1 and "Invalid legacy provider address" in r.stderr

    md = run_kl("refresh", "prod", *SEARCH, "--workdir", str(ws), "--dry-run", "--format", "markdown")
    assert f"- provider address: module.net.provider.null → module.net.{NULL} (to be written when accepted)" in md.stdout.decode()
    # An observation holds the modern addresses; Terraform's version and its index keep the legacy ones.
    out = kl_refresh(run_kl, ws)
    assert (out["status"], out["observation"], out["resources_changed"], out["drift"]) == ("succeeded", "v4.1", 0, []), out
    assert len(out["provider_addresses"]) == 3
    observed = json.loads(run_kl("state", "pull", "prod", "--observed").stdout)
    assert [r["provider"] for r in observed["resources"]] == [NULL + ".alt", NULL, "module.net." + NULL]
    assert lifecycle_rows(db_url) == imported
    assert json.loads(run_kl("state", "pull", "prod").stdout)["resources"] == STATE_012["resources"]
    # Committed, Terraform's next version has them.
    out = kl_refresh(run_kl, ws, "--commit")
    assert (out["status"], out["resources_checked"], out["resources_changed"], out["drift"]) == ("succeeded", 4, 0, [])
    assert out["to_serial"] == 5
    assert out["provider_addresses"] == [
        {"from": "provider.null.alt", "to": NULL + ".alt"},
        {"from": "provider.null", "to": NULL},
        {"from": "module.net.provider.null", "to": "module.net." + NULL},
    ]
    table = run_kl("refresh", "prod", *SEARCH, "--workdir", str(ws), "--dry-run").stdout.decode()
    assert "provider address" not in table  # nothing legacy is left to rewrite

    # Metadata only: the same lifecycles (same create serial), their provider column rewritten, no drift.
    after = lifecycle_rows(db_url)
    assert [r[:3] + r[4:] for r in after] == [r[:3] + r[4:] for r in imported]
    assert sorted(r[3] for r in after) == sorted(["module.net." + NULL, NULL, NULL, NULL + ".alt"])
    assert drift_count(db_url) == 0
    assert reindex_mismatches(db_url, "prod") == []
    diff = json.loads(run_kl("state", "diff", "prod", "--format", "json").stdout)
    assert (diff["from"], diff["to"], diff["instances"]) == (4, 5, [])  # a rewritten address is not a change
    pulled = json.loads(run_kl("state", "pull", "prod").stdout)
    assert [r["provider"] for r in pulled["resources"]] == [NULL + ".alt", NULL, "module.net." + NULL]
    assert ([i["attributes"] for r in pulled["resources"] for i in r["instances"]]
            == [i["attributes"] for r in STATE_012["resources"] for i in r["instances"]])

    # Terraform 1.8.5 takes kl's committed state and plans no change.
    (ws / "terraform.tfstate").write_bytes(run_kl("state", "pull", "prod").stdout)
    r = tf.run("init", "-input=false")
    assert r.returncode == 0, r.stderr
    r = tf.run("plan", "-detailed-exitcode", "-input=false", "-lock=false")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "No changes" in r.stdout


CONFIG_FLAT = """
terraform {
  required_providers {
    null = { source = "hashicorp/null", version = "2.1.2" }
  }
}
resource "null_resource" "tfer--one" { triggers = { env = "dev", team = "net" } }
resource "null_resource" "tfer--two" {}
"""


@pytest.mark.usefixtures("read_path")  # the upgrades run on a thread from the loop
def test_flatmap_attributes_are_upgraded_by_the_real_provider_and_the_first_object_is_not_drift(db_url, run_kl, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.tf").write_text(CONFIG_FLAT)
    assert run_kl("state", "import", "prod", str(CORPUS / "tf125-flatmap.tfstate")).returncode == 0
    imported = lifecycle_rows(db_url)
    assert [r[6] for r in imported] == [True, True]  # attributes NULL: stored as flatmap

    # An observation holds the objects in their structured form, and finds no drift in it.
    out = kl_refresh(run_kl, ws)
    assert (out["status"], out["resources_checked"], out["resources_changed"], out["drift"]) == ("succeeded", 2, 0, [])
    assert out["upgraded_from_flatmap"] == ["null_resource.tfer--one", "null_resource.tfer--two"]
    observed = json.loads(run_kl("state", "pull", "prod", "--observed").stdout)
    objs = [r["instances"][0] for r in observed["resources"]]
    assert all("attributes_flat" not in o for o in objs)
    assert objs[0]["attributes"] == {"id": "4037200794235010051", "triggers": {"env": "dev", "team": "net"}}
    assert objs[1]["attributes"]["id"] == "3916589616287113937"
    assert lifecycle_rows(db_url) == imported and drift_count(db_url) == 0
    # Committed: Terraform's next version and its lifecycles hold them.
    out = kl_refresh(run_kl, ws, "--commit")
    assert (out["status"], out["resources_checked"], out["resources_changed"], out["drift"]) == ("succeeded", 2, 0, [])
    assert out["upgraded_from_flatmap"] == ["null_resource.tfer--one", "null_resource.tfer--two"]
    pulled = json.loads(run_kl("state", "pull", "prod").stdout)
    assert [r["instances"][0] for r in pulled["resources"]] == objs

    after = lifecycle_rows(db_url)
    assert [r[:6] + r[7:] for r in after] == [r[:6] + r[7:] for r in imported]  # the same lifecycles
    assert [r[6] for r in after] == [False, False]  # which now hold the objects
    assert drift_count(db_url) == 0
    with psycopg.connect(db_url) as c:
        assert one_row(c, "SELECT attributes FROM resources WHERE address = 'null_resource.tfer--one'")[0] == objs[0]["attributes"]

    # A second refresh reads the objects back: nothing changes.
    out = kl_refresh(run_kl, ws, "--commit")
    assert (out["resources_changed"], out["upgraded_from_flatmap"]) == (0, [])
    assert lifecycle_rows(db_url) == after
    # The versions alone give the same lifecycles: a re-index from scratch reshapes them too.
    assert reindex_mismatches(db_url, "prod") == []

    tf = Terraform18(ws)
    (ws / "terraform.tfstate").write_bytes(run_kl("state", "pull", "prod").stdout)
    assert tf.run("init", "-input=false").returncode == 0
    r = tf.run("plan", "-detailed-exitcode", "-input=false", "-lock=false")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", REFRESHABLE)
def test_corpus_file_refreshes_with_the_real_provider_without_drift_or_new_lifecycles(db_url, run_kl, tmp_path, name):
    from kilolock import tfstate

    assert run_kl("state", "import", "prod", str(CORPUS / name)).returncode == 0
    imported = lifecycle_rows(db_url)
    # A dry run says what a commit will write in the modern form, and writes nothing.
    dry = run_kl("refresh", "prod", *SEARCH, "--workdir", str(tmp_path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    for old in {r[3] for r in imported if tfstate.parse_provider(r[3]).legacy}:
        new = tfstate.parse_provider(old).modern
        assert f"provider address: {old} → {new} (to be written when accepted)" in dry.stdout.decode()
    flat = len({r[0] for r in imported if r[6] and r[2] == "managed"})
    assert (f"flatmap: {flat} instance(s) upgraded by their provider" in dry.stdout.decode()) == (flat > 0)
    assert lifecycle_rows(db_url) == imported
    # An observation finds no drift and leaves Terraform's index alone; its document is modern.
    out = kl_refresh(run_kl, tmp_path)
    assert (out["status"], out["resources_changed"], out["resources_failed"], out["to_serial"]) == ("succeeded", 0, 0, None)
    assert lifecycle_rows(db_url) == imported and drift_count(db_url) == 0
    observed = tfstate.parse_state(run_kl("state", "pull", "prod", "--observed").stdout)
    assert observed.serial == json.loads((CORPUS / name).read_text())["serial"]
    assert all(not tfstate.parse_provider(i.provider).legacy for i in observed.instances)
    assert all(i.flatmap is None for i in observed.instances if i.mode == "managed")
    # Committed (what Terraform then reads):
    out = kl_refresh(run_kl, tmp_path, "--commit")
    assert (out["status"], out["resources_changed"], out["resources_failed"]) == ("succeeded", 0, 0)
    assert out["resources_checked"] == sum(1 for r in imported if r[2] == "managed")
    after = lifecycle_rows(db_url)
    # Same lifecycles (address, deposed, status, create serial, still open); only metadata and a
    # flatmap's first structured form moved.
    assert [(r[0], r[1], r[4], r[7], r[8]) for r in after] == [(r[0], r[1], r[4], r[7], r[8]) for r in imported]
    assert all(not r[6] for r in after if r[2] == "managed")
    assert all("provider[" in r[3] and "/-/" not in r[3] for r in after)
    assert drift_count(db_url) == 0
    pulled = run_kl("state", "pull", "prod").stdout
    state = tfstate.parse_state(pulled)
    # A version only where the observation differs from Terraform's: a legacy address, a flatmap,
    # or what a provider rewrote (private data); a file with none of those gets a confirmation.
    legacy = any(tfstate.parse_provider(r[3]).legacy for r in imported)
    assert (out["to_serial"] is not None) or (not legacy and flat == 0), out
    written = 1 if out["to_serial"] is not None else 0
    assert state.serial == json.loads((CORPUS / name).read_text())["serial"] + written
    assert all(not tfstate.parse_provider(i.provider).legacy for i in state.instances)
