"""Secrets made by real Terraform with real providers, grepped for in every channel kl has.

Terraform 1.0.3 applies a random_password (`result` and `bcrypt_hash` are schema-sensitive) and a
null_resource whose trigger comes from a sensitive variable (so only `sensitive_attributes` marks
it). kl refreshes that state with the real random and null providers, logs on (KL_LOG=debug,
TF_LOG=trace), and nothing a user or tool reads may contain those values: kl refresh (table, JSON),
kl drift, status, runs, state list/versions, provider list, failure messages, kl serve's JSON API and
log, and every table except the ones that hold the state itself. `kl state pull` and the backend's
GET return the state, secrets included, by design: they serve as the positive control here."""
from __future__ import annotations

import json
import uuid

import pytest

from kit.leaks import LOUD, api_channels, db_rows, leaks, read_channels
from kit.paths import PLUGIN_CACHE, RANDOM_V, TERRAFORM
from kit.tfworkspace import terraform

SEARCH = ("--provider-search-path", str(PLUGIN_CACHE))
MAIN_TF = f"""
terraform {{
  required_providers {{
    random = {{ source = "hashicorp/random", version = "{RANDOM_V}" }}
    null   = {{ source = "hashicorp/null", version = "2.1.2" }}
  }}
}}
variable "token" {{
  type      = string
  sensitive = true
}}
resource "random_password" "p" {{
  length  = 40
  special = false
}}
resource "null_resource" "n" {{
  triggers = {{ token = var.token, plain = "visible-trigger" }}
}}
"""


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[str, str]]:
    """(the Terraform-written state, {what: secret value})."""
    for path, script in ((TERRAFORM, "scripts/test-terraform.sh"),
                         (PLUGIN_CACHE / "registry.terraform.io/hashicorp/random" / RANDOM_V, "scripts/test-providers.sh"),
                         (PLUGIN_CACHE / "registry.terraform.io/hashicorp/null/2.1.2", "scripts/test-providers.sh")):
        if not path.exists():
            pytest.fail(f"{path} is missing: run {script}", pytrace=False)
    ws = tmp_path_factory.mktemp("tf-secrets")
    (ws / "main.tf").write_text(MAIN_TF)
    token = f"KLVAR-{uuid.uuid4().hex}"
    terraform(ws, "init")
    terraform(ws, "apply", "-auto-approve", f"-var=token={token}")
    doc = json.loads((ws / "terraform.tfstate").read_text())
    pw = instance(doc, "random_password")
    null = instance(doc, "null_resource")
    assert null["attributes"]["triggers"]["token"] == token and null["sensitive_attributes"], null  # marked by Terraform
    secrets = {"random_password.result": pw["attributes"]["result"], "random_password.bcrypt_hash": pw["attributes"]["bcrypt_hash"],
               "sensitive variable in null_resource.triggers": token}
    assert len(secrets["random_password.result"]) == 40
    return doc, secrets


def instance(doc: dict, type_name: str) -> dict:
    return next(r for r in doc["resources"] if r["type"] == type_name)["instances"][0]


def variant(doc: dict, **random_password_changes) -> bytes:
    doc = json.loads(json.dumps(doc))
    inst = instance(doc, "random_password")
    for key, value in random_password_changes.items():
        if key == "drop":
            for attr in value:
                inst["attributes"].pop(attr)
        else:
            inst[key] = value
    return json.dumps(doc).encode()


def test_secrets_from_real_providers_reach_no_output_channel(run_kl, db_url, applied):
    doc, secrets = applied
    # Stored as random_password schema version 0 (before bcrypt_hash existed): the refresh upgrades
    # it through the real provider, which computes a new bcrypt_hash, so kl drift has a changed
    # sensitive value to show.
    assert run_kl("state", "import", "prod", "-", input=variant(doc, schema_version=0, drop=("bcrypt_hash", "numeric"))).returncode == 0
    channels = {}
    for fmt in ("table", "json"):
        r = run_kl("refresh", "prod", *SEARCH, "--format", fmt, env=LOUD)
        assert r.returncode == 0, r.stdout + r.stderr
        channels[f"kl refresh --format {fmt}"] = r.stdout + r.stderr
        assert b"DEBUG kilolock.provider.random" in r.stderr  # the providers' own logs were on
    state = json.loads(run_kl("state", "pull", "prod", "--observed").stdout)  # what the refresh read
    upgraded = instance(state, "random_password")
    assert upgraded["schema_version"] == 3 and upgraded["attributes"]["result"] == secrets["random_password.result"]
    secrets = {**secrets, "bcrypt_hash made by the upgrade": upgraded["attributes"]["bcrypt_hash"]}
    drift = json.loads(run_kl("drift", "prod", "--format", "json").stdout)["drift"]
    changes = {c["path"]: (c["before"], c["after"]) for d in drift for c in d["changes"]}
    assert changes.get("bcrypt_hash") == (None, "(sensitive)") and changes.get("numeric") == (None, True), changes
    assert "  bcrypt_hash: null → (sensitive)" in run_kl("drift", "prod").stdout.decode()

    channels |= read_channels(run_kl, "prod") | db_rows(db_url)
    api, pulled = api_channels(db_url, "prod")
    assert leaks(secrets, channels | api) == []
    # Positive control: the values are in the store, and the state itself returns them.
    assert all(v.encode() in pulled for v in (secrets["random_password.result"], secrets["sensitive variable in null_resource.triggers"]))
    assert "visible-trigger" in run_kl("state", "pull", "prod").stdout.decode()


def test_a_failed_refresh_of_instances_holding_secrets_names_no_secret(run_kl, db_url, applied):
    doc, secrets = applied
    assert run_kl("state", "import", "prod", "-", input=variant(doc, schema_version=99)).returncode == 0
    r = run_kl("refresh", "prod", *SEARCH, "--format", "json", env=LOUD)
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "failed", out
    failures = {f["address"]: f["message"] for f in out["failures"]}
    assert "managed by a newer provider version (state has schema version 99" in failures["random_password.p"], failures
    table = run_kl("refresh", "prod", *SEARCH, env=LOUD)
    assert table.returncode == 1 and b"random_password.p: resource instance managed by a newer provider version" in table.stdout
    runs = json.loads(run_kl("runs", "prod", "--format", "json").stdout)["runs"]
    assert all("random_password.p" in run["error_summary"] for run in runs), runs
    channels = {"kl refresh --format json": r.stdout + r.stderr, "kl refresh": table.stdout + table.stderr,
                **read_channels(run_kl, "prod"), **db_rows(db_url)}
    api, _ = api_channels(db_url, "prod")
    assert leaks(secrets, channels | api) == []


def test_provider_logs_at_trace_level_hold_no_secret(run_kl, db_url, applied, caplog, monkeypatch):
    """The CLI shows provider logs down to DEBUG; in-process every TRACE line can be seen too."""
    from kilolock.refresh.factory import ProviderFactory
    from kilolock.refresh.options import RefreshOptions
    from kilolock.refresh.orchestrator import run
    from kilolock.store import db, states

    doc, secrets = applied
    assert run_kl("state", "import", "prod", "-", input=variant(doc, schema_version=0, drop=("bcrypt_hash", "numeric"))).returncode == 0
    monkeypatch.setenv("TF_LOG", "trace")
    caplog.set_level(1)
    with db.open_store() as conn:
        factory = ProviderFactory(conn, states.state_id(conn, "prod"), (str(PLUGIN_CACHE),))
        result = run(conn, "prod", factory, RefreshOptions(dry_run=True))
    assert result.status == "succeeded" and result.changed == 1, result
    trace = [r for r in caplog.records if r.levelno < 10 and r.name == "kilolock.provider.random"]
    assert len(trace) > 20, len(trace)  # the provider did log at TRACE, and every line reached logging
    assert leaks(secrets, {"log records": "\n".join(r.getMessage() for r in caplog.records).encode()}) == []
