"""kl state diff on versions Terraform 1.0.3 wrote (issue 12): apply, change variables, apply
again, import each state file; the diff is exactly what changed, in Terraform's path form, with
the value of a sensitive variable masked; a taint is a status change and nothing else."""
from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kit.paths import LOCAL_V, PLUGIN_CACHE, RANDOM_V, TERRAFORM
from kit.state_diff import instances_by_address
from kit.tfworkspace import terraform, terraform_env

DIFF_TF = f"""
terraform {{
  required_providers {{
    null  = {{ source = "hashicorp/null", version = "2.1.2" }}
    local = {{ source = "hashicorp/local", version = "{LOCAL_V}" }}
  }}
}}
variable "v" {{ type = string }}
variable "secret" {{
  type      = string
  sensitive = true
}}
variable "names" {{ type = set(string) }}
resource "null_resource" "keep" {{ triggers = {{ fixed = "x" }} }}
resource "null_resource" "n" {{ triggers = {{ v = var.v, fixed = "y" }} }}
resource "null_resource" "s" {{ triggers = {{ secret = var.secret }} }}
resource "null_resource" "each" {{
  for_each = var.names
  triggers = {{ name = each.key }}
}}
resource "local_file" "f" {{
  filename = "${{path.module}}/out/f.txt"
  content  = "v is ${{var.v}}"
}}
"""


def apply(ws: Path, v: str, secret: str, names: list[str]) -> None:
    # In a file, as a secret would be: never on a command line.
    (ws / "vars.auto.tfvars.json").write_text(json.dumps({"v": v, "secret": secret, "names": names}))
    terraform(ws, "apply", "-auto-approve")


def import_version(run_kl, ws: Path) -> int:
    r = run_kl("state", "import", "prod", str(ws / "terraform.tfstate"), "--source", "apply")
    assert r.returncode == 0, r.stderr
    serial: int = json.loads((ws / "terraform.tfstate").read_text())["serial"]
    return serial


def diff(run_kl, *args: str) -> dict:
    r = run_kl("state", "diff", "prod", *args, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc: dict = json.loads(r.stdout)
    return doc


def instances(ws: Path) -> dict[str, dict]:
    """The instances of the state file Terraform wrote, by address."""
    return instances_by_address(json.loads((ws / "terraform.tfstate").read_text()))


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(Terraform path, value) of every value in an object of the shapes these resources have:
    scalars and maps of strings."""
    if isinstance(value, dict):
        for key in sorted(value):
            yield from leaves(value[key], f"{path}[{json.dumps(key)}]" if path else key)
    else:
        yield path, value


def mark_text(mark: list[dict]) -> str:
    """A sensitive_attributes path of Terraform's file in the path form of kl's diff."""
    out = ""
    for step in mark:
        if step["type"] == "get_attr":
            out += f'.{step["value"]}' if out else step["value"]
        else:
            out += f'[{json.dumps(step["value"]["value"])}]'
    return out


def terraform_changes(before: dict, after: dict) -> list[dict[str, Any]]:
    """What differs between two of Terraform's instances, attribute by attribute, a value under a
    path either file marks sensitive masked."""
    marks = [mark_text(m) for i in (before, after) for m in i.get("sensitive_attributes", [])]
    old, new = dict(leaves(before["attributes"])), dict(leaves(after["attributes"]))

    def shown(path: str, value: Any) -> Any:
        return "(sensitive)" if any(path == m or path.startswith((m + "[", m + ".")) for m in marks) else value
    return [{"path": p, "before": shown(p, old.get(p)), "after": shown(p, new.get(p))}
            for p in sorted(old.keys() | new.keys()) if old.get(p) != new.get(p)]


def terraform_diff(before: dict[str, dict], after: dict[str, dict]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(address, action) -> changes: the diff of Terraform's two files kl's diff must equal."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for address in sorted(before.keys() | after.keys()):
        if address not in after:
            out[(address, "removed")] = []
        elif address not in before:
            out[(address, "added")] = []
        elif (changes := terraform_changes(before[address], after[address])) or \
                before[address].get("status") != after[address].get("status"):
            out[(address, "changed")] = changes
    return out


def next_second(t: float) -> None:
    """Return once the clock's second is past T's. null 2.1.2 seeds its ids with the second its
    process started: a process started in the same second as another draws the same ids."""
    deadline = time.monotonic() + 10
    while int(time.time()) <= int(t) and time.monotonic() < deadline:
        time.sleep(0.02)


RANDOM_TF = f"""
terraform {{
  required_providers {{
    random = {{ source = "hashicorp/random", version = "{RANDOM_V}" }}
  }}
}}
variable "len" {{ type = number }}
resource "random_password" "p" {{ length = var.len }}
"""


def workspace(tmp_path: Path, config: str) -> Path:
    for path in (TERRAFORM, PLUGIN_CACHE / "registry.terraform.io/hashicorp/local" / LOCAL_V):
        if not path.exists():
            pytest.fail(f"{path} is missing: run scripts/test-terraform.sh and scripts/test-providers.sh", pytrace=False)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.tf").write_text(config)
    terraform(ws, "init")
    return ws


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return workspace(tmp_path, DIFF_TF)


def test_diff_of_two_applies_is_what_terraform_changed(run_kl, db_url, ws: Path):
    apply(ws, "one", "hunter2", ["a", "b"])
    first = import_version(run_kl, ws)
    before = instances(ws)
    # The replaced null_resources get ids of their own only from providers seeded in another second.
    next_second(time.time())
    apply(ws, "two", "hunter3", ["b", "c"])
    second = import_version(run_kl, ws)
    after = instances(ws)
    # So the diff shows a replacement's new id, not only the values Terraform was given.
    ids = {a: (before[a]["attributes"]["id"], after[a]["attributes"]["id"]) for a in ("null_resource.n", "null_resource.s")}
    assert all(old != new for old, new in ids.values()), ids

    # Until kl has the providers' schemas it masks every value (test below); a dry run caches them.
    assert diff(run_kl)["masked_providers"] == ["registry.terraform.io/hashicorp/local", "registry.terraform.io/hashicorp/null"]
    r = run_kl("refresh", "prod", "--dry-run", "--provider-search-path", str(PLUGIN_CACHE), "--workdir", str(ws))
    assert r.returncode == 0, r.stderr
    doc = diff(run_kl)
    got = {(i["address"], i["action"]): i["changes"] for i in doc["instances"]}
    want = terraform_diff(before, after)
    # What Terraform changed: null_resource.keep and each["b"] did not, and n's triggers["fixed"]
    # stayed as it was through n's replacement; none of them is listed.
    assert sorted(want) == [('local_file.f', 'changed'), ('null_resource.each["a"]', 'removed'),
                            ('null_resource.each["c"]', 'added'), ('null_resource.n', 'changed'),
                            ('null_resource.s', 'changed')], want
    assert {"path": 'triggers["v"]', "before": "one", "after": "two"} in want[("null_resource.n", "changed")]
    assert {"path": 'triggers["secret"]', "before": "(sensitive)", "after": "(sensitive)"} in want[("null_resource.s", "changed")]
    assert {"path": "content", "before": "v is one", "after": "v is two"} in want[("local_file.f", "changed")]
    assert got == want
    assert (doc["from"], doc["to"], doc["added"], doc["removed"], doc["changed"]) == (first, second, 1, 1, 3), doc
    assert doc["masked_providers"] == []
    text = run_kl("state", "diff", "prod").stdout.decode()
    assert text.startswith(f"prod: v{first} → v{second}: 1 added, 1 removed, 3 changed\n"), text
    assert "hunter" not in text and 'triggers["secret"]: (sensitive) → (sensitive)' in text, text
    md = run_kl("state", "diff", "prod", str(first), str(second), "--format", "markdown").stdout.decode()
    assert '| `triggers["v"]` | `"one"` | `"two"` |' in md, md


def test_taint_is_a_status_change_only(run_kl, db_url, ws: Path):
    apply(ws, "one", "hunter2", ["a"])
    import_version(run_kl, ws)
    r = subprocess.run([str(TERRAFORM), "taint", "-no-color", "null_resource.keep"], cwd=ws, env=terraform_env(),
                       capture_output=True, text=True, timeout=120)  # taint takes no -input
    assert r.returncode == 0, r.stderr
    import_version(run_kl, ws)
    doc = diff(run_kl)
    assert [(i["address"], i["action"], i["status"], i["changes"]) for i in doc["instances"]] == [
        ("null_resource.keep", "changed", {"before": None, "after": "tainted"}, [])]


def test_a_schema_sensitive_value_terraform_did_not_mark_is_masked_once_kl_knows_the_schema(run_kl, db_url, tmp_path: Path):
    """random_password.result is sensitive by the provider's schema; Terraform 1.0.3 writes no
    mark for it. A kl refresh caches the schema (and marks the object): a later diff masks it."""
    ws = workspace(tmp_path, RANDOM_TF)
    (ws / "vars.auto.tfvars.json").write_text(json.dumps({"len": 12}))
    terraform(ws, "apply", "-auto-approve")
    import_version(run_kl, ws)
    r = run_kl("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "--workdir", str(ws))
    assert r.returncode == 0, r.stderr
    (ws / "terraform.tfstate").write_bytes(run_kl("state", "pull", "prod").stdout)  # Terraform goes on from kl's version
    (ws / "vars.auto.tfvars.json").write_text(json.dumps({"len": 14}))
    terraform(ws, "apply", "-auto-approve")
    import_version(run_kl, ws)
    secret = json.loads((ws / "terraform.tfstate").read_text())["resources"][0]["instances"][0]["attributes"]["result"]
    [p] = diff(run_kl)["instances"]
    assert (p["address"], p["action"]) == ("random_password.p", "changed")
    changes = {c["path"]: (c["before"], c["after"]) for c in p["changes"]}
    assert changes["length"] == (12, 14) and changes["result"] == ("(sensitive)", "(sensitive)"), changes
    assert secret not in run_kl("state", "diff", "prod").stdout.decode()


SENSITIVE_FILE_TF = f"""
terraform {{
  required_providers {{
    local = {{ source = "hashicorp/local", version = "{LOCAL_V}" }}
  }}
}}
variable "secret" {{ type = string }}
resource "local_file" "s" {{
  filename          = "${{path.module}}/out/s.txt"
  sensitive_content = var.secret
}}
"""


def test_a_never_refreshed_state_never_shows_a_schema_sensitive_value(run_kl, db_url, tmp_path: Path):
    """local_file.sensitive_content is sensitive by the local provider's schema only: Terraform
    1.0.3 writes it with no mark. With no schema of that provider cached, kl state diff masks every
    value of its resources and says so once; after a dry-run refresh cached the schema, only the
    secret stays masked."""
    ws = workspace(tmp_path, SENSITIVE_FILE_TF)
    secrets = ["first-s3cret", "second-s3cret"]
    for secret in secrets:
        (ws / "vars.auto.tfvars.json").write_text(json.dumps({"secret": secret}))
        terraform(ws, "apply", "-auto-approve")
        import_version(run_kl, ws)
    state = json.loads((ws / "terraform.tfstate").read_text())
    assert state["resources"][0]["instances"][0]["sensitive_attributes"] == []  # Terraform marked nothing

    for fmt in ("table", "json", "markdown"):
        out = run_kl("state", "diff", "prod", "--format", fmt).stdout.decode()
        assert not any(s in out for s in secrets), out
        assert out.count("registry.terraform.io/hashicorp/local") == 1, out
        assert fmt == "json" or "`kl refresh prod` (or --dry-run) caches it" in out, out
    [f] = diff(run_kl)["instances"]
    changes = {c["path"]: (c["before"], c["after"]) for c in f["changes"]}
    assert changes["sensitive_content"] == changes["id"] == ("(sensitive)", "(sensitive)"), changes

    r = run_kl("refresh", "prod", "--dry-run", "--provider-search-path", str(PLUGIN_CACHE), "--workdir", str(ws))
    assert r.returncode == 0, r.stderr
    doc = diff(run_kl)
    [f] = doc["instances"]
    changes = {c["path"]: (c["before"], c["after"]) for c in f["changes"]}
    assert doc["masked_providers"] == [] and changes["sensitive_content"] == ("(sensitive)", "(sensitive)"), changes
    assert changes["id"][0] != "(sensitive)" and changes["id"] != ("(sensitive)", "(sensitive)"), changes
    assert not any(s in run_kl("state", "diff", "prod").stdout.decode() for s in secrets)
