"""Where providers run (issue 12): a relative-path local_file, applied by real Terraform 1.0.3 and
refreshed by kl with the real local provider from a directory that is not the configuration's.

Before, such a run read the one file as gone and committed its removal with exit 0 (a group of one
escapes the mass-removal guard). Now a state's workdir says where providers run, from any
directory; without one, a run that finds deletions commits nothing and says how to set it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import psycopg
import pytest

from kit.paths import LOCAL_V, PLUGIN_CACHE, TERRAFORM
from kit.tfworkspace import terraform

ONE_FILE_TF = f"""
terraform {{
  required_providers {{
    local = {{ source = "hashicorp/local", version = "{LOCAL_V}" }}
  }}
}}
resource "local_file" "only" {{
  filename = "out/only.txt"
  content  = "hello"
}}
"""
SEARCH = ("--provider-search-path", str(PLUGIN_CACHE))


@pytest.fixture(scope="session")
def one_file_applied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for path, script in ((TERRAFORM, "scripts/test-terraform.sh"),
                         (PLUGIN_CACHE / "registry.terraform.io/hashicorp/local" / LOCAL_V, "scripts/test-providers.sh")):
        if not path.exists():
            pytest.fail(f"{path} is missing: run {script}", pytrace=False)
    ws = tmp_path_factory.mktemp("tf-one-file")
    (ws / "main.tf").write_text(ONE_FILE_TF)
    terraform(ws, "init")
    terraform(ws, "apply", "-auto-approve")
    return ws


@pytest.fixture
def ws(one_file_applied: Path, tmp_path: Path, run_kl) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(one_file_applied, ws, symlinks=True)
    state = json.loads((ws / "terraform.tfstate").read_text())
    assert state["resources"][0]["instances"][0]["attributes"]["filename"] == "out/only.txt"  # relative, as written
    r = run_kl("state", "import", "prod", str(ws / "terraform.tfstate"), "--source", "apply")
    assert r.returncode == 0, r.stderr
    return ws


def refresh(run_kl, cwd: Path, *extra: str, env: dict[str, str] | None = None):
    r = run_kl("refresh", "prod", "--format", "json", *extra, cwd=cwd, env=env)
    try:
        return r, json.loads(r.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"kl refresh printed no JSON (rc {r.returncode}):\n{r.stdout!r}\n{r.stderr.decode()}") from None


def serials(db_url: str) -> list[tuple[int, str, str]]:
    """(serial, kind, source) of every version, Terraform's and observations, in the order written."""
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT serial, kind, source FROM state_versions ORDER BY seq").fetchall()


def test_from_another_directory_without_a_workdir_a_relative_file_is_not_committed_as_gone(run_kl, db_url, ws, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = serials(db_url)
    r, out = refresh(run_kl, elsewhere, *SEARCH)
    assert r.returncode == 1 and (out["status"], out["to_serial"]) == ("failed", None)
    assert out["changed_addresses"] == ["local_file.only"]  # what the provider said, from the wrong directory
    assert out["error"] == (f"1 instance(s) came back deleted (first: local_file.only) and state 'prod' has no workdir, so "
                            f"providers ran in {elsewhere}, where relative paths may not resolve; nothing committed: "
                            "set one with `kl state set prod --workdir DIR` (or give --workdir DIR for this run)")
    assert r.stderr.decode() == f"kl: refresh failed: {out['error']}\n"
    assert serials(db_url) == before and (ws / "out" / "only.txt").exists()
    # Even from the right directory, a deletion needs the workdir said: kl cannot know it is right.
    (ws / "out" / "only.txt").unlink()
    r, out = refresh(run_kl, ws, *SEARCH)
    assert r.returncode == 1 and out["to_serial"] is None and "has no workdir" in out["error"]
    # --workdir . from the configuration's directory records it, for that run.
    r, out = refresh(run_kl, ws, *SEARCH, "--workdir", ".")
    assert r.returncode == 0 and out["status"] == "succeeded" and out["changed_addresses"] == ["local_file.only"], r.stderr
    assert (out["to_serial"], out["observation"]) == (None, "v1.1")
    assert serials(db_url) == [*before, (1, "observation", "refresh")]
    observed = json.loads(run_kl("state", "pull", "prod", "--observed").stdout)
    assert [r["type"] for r in observed["resources"] if r["mode"] == "managed"] == []  # local_file.only: gone


def test_a_stored_workdir_refreshes_the_same_way_from_any_directory(run_kl, db_url, ws, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert run_kl("state", "set", "prod", "--workdir", str(ws)).returncode == 0
    # No search path and another HOME: the provider is found in the workdir's .terraform/providers,
    # where terraform init put it, as a run from the workdir itself would find it.
    home = {"HOME": str(tmp_path / "home")}
    r, out = refresh(run_kl, elsewhere, env=home)
    assert r.returncode == 0 and (out["status"], out["resources_changed"]) == ("succeeded", 0), (out, r.stderr)
    assert str(ws / ".terraform" / "providers") in out["providers"][0]
    (ws / "out" / "only.txt").write_text("edited behind Terraform's back")
    r, out = refresh(run_kl, elsewhere, env=home)
    assert r.returncode == 0 and out["changed_addresses"] == ["local_file.only"], r.stderr
    d = json.loads(run_kl("drift", "prod", "--format", "json").stdout)["drift"]
    # (The drift view may also list the lifecycle the first refresh closed when it added sensitivity
    # marks: the drift store is being reworked separately; this test is about where providers run.)
    assert out["observation"] == f"v{out['from_serial']}.2"
    assert ("local_file.only", "deleted", out["from_serial"]) in [(x["address"], x["kind"], x["detected_serial"]) for x in d]


def test_a_stored_workdir_missing_on_this_host_fails_before_any_provider_starts(run_kl, db_url, ws, tmp_path):
    assert run_kl("state", "set", "prod", "--workdir", "/srv/terraform/prod-not-here").returncode == 0
    before = serials(db_url)
    r, out = refresh(run_kl, ws, *SEARCH)
    assert r.returncode == 1 and out["status"] == "failed" and out["providers"] == [] and out["resources_checked"] == 0
    assert out["error"].startswith("workdir /srv/terraform/prod-not-here of state 'prod' does not exist on this host; nothing was refreshed")
    assert r.stderr.count(b"\n") == 1
    assert serials(db_url) == before
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT status, error_summary FROM refresh_runs").fetchone() == ("failed", out["error"])
    # --workdir overrides it for one run.
    r, out = refresh(run_kl, tmp_path, *SEARCH, "--workdir", str(ws))
    assert r.returncode == 0 and out["resources_changed"] == 0, r.stderr
