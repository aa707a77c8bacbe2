"""kl.pyz runs the real commands with nothing but Debian's python3: version, db migrate, state import,
refresh against a real provider, and the embedded default database."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from kit.paths import PLUGIN_CACHE, REPO
from kit.procs import provider_pids
from kit.pyz import clean_env, extracted_files, unit_dir, version_fields

HEAVY = ("grpc", "psycopg", "google.protobuf", "kilolock.store", "kilolock.provider", "kilolock.refresh")

def test_version_on_a_fresh_home_extracts_and_reports_everything(run_pyz, home, pyz):
    r = run_pyz("version")
    assert r.returncode == 0, r.stderr
    f = version_fields(r.stdout)
    assert f["kilolock"] == "0.1.0" and f["codec"] == "rust"
    assert f["python"].startswith("3.11.") and "/usr/bin/python3" in f["python"]
    assert re.fullmatch(r"[0-9a-f]{16}", f["build"])
    root = home / ".cache" / "kilolock" / "pyz"
    unit = unit_dir(root)
    assert f["cache dir"] == str(unit) and unit.name.startswith(f["build"])
    files = extracted_files(unit)
    # Exactly this interpreter's natives: no other version's grpc, and psycopg's bundled libpq.
    assert "grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so" in files
    assert not any("cpython-310" in p or "cpython-312" in p for p in files)
    assert any(p.startswith("psycopg_binary.libs/libpq") for p in files)
    assert "kilolock/_native.abi3.so" in files and "google/_upb/_message.abi3.so" in files
    assert not list(unit.rglob("*.py")), "pure-Python code must stay in the zip"
    assert r.stderr == ""


@pytest.mark.parametrize("args", [("version",), ("--help",), ("refresh", "--help")])
def test_nothing_heavy_is_imported_for_version_and_help(run_pyz, args):
    r = run_pyz(*args, py_args=("-X", "importtime"))
    assert r.returncode == 0, r.stderr
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "kilolock.cli" in imported  # the measurement itself works
    heavy = sorted(m for m in imported if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == []


def test_opening_the_store_reads_the_migrations_without_importlib_resources(run_pyz, db_url):
    # kl.pyz reads its migrations through the zipimporter; importlib.resources (and what it
    # loads) only for a checkout: ~2 ms of every command that opens the store.
    r = run_pyz("state", "list", py_args=("-X", "importtime"))
    assert r.returncode == 0, r.stderr
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "kilolock.store.migrate" in imported  # the measurement itself works
    assert "importlib.resources" not in imported


def test_db_migrate_on_an_empty_database(run_pyz, empty_db_url):
    r = run_pyz("db", "migrate")
    assert r.returncode == 0, r.stderr
    assert "applied  0001_init.sql" in r.stdout and "0006_resource_drift_view.sql" in r.stdout  # read from the zip
    status = run_pyz("db", "status")
    assert status.returncode == 0 and "current" in status.stdout, status.stdout + status.stderr
    again = run_pyz("db", "migrate")
    assert again.returncode == 0 and "applied" not in again.stdout


def test_state_import_of_a_terraform_made_state(run_pyz, db_url, small_workspace):
    state = small_workspace / "terraform.tfstate"
    r = run_pyz("state", "import", "prod", str(state), "--source", "apply")
    assert r.returncode == 0, r.stderr
    listing = run_pyz("state", "list", "--format", "json")
    assert listing.returncode == 0, listing.stderr
    assert [s["name"] for s in json.loads(listing.stdout)["states"]] == ["prod"]
    pulled = run_pyz("state", "pull", "prod")
    assert pulled.returncode == 0, pulled.stderr
    theirs, ours = json.loads(state.read_text()), json.loads(pulled.stdout)
    assert ours["lineage"] == theirs["lineage"] and ours["resources"] == theirs["resources"]
    bad = run_pyz("state", "import", "prod", str(small_workspace / "missing.tfstate"))
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1 and "missing.tfstate" in bad.stderr


def test_refresh_against_real_providers_finds_an_out_of_band_deletion(run_pyz, db_url, small_workspace, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(small_workspace, ws, symlinks=True)
    before = provider_pids()
    assert run_pyz("state", "import", "prod", str(ws / "terraform.tfstate"), "--source", "apply").returncode == 0
    search = ("--provider-search-path", str(PLUGIN_CACHE), "--format", "json")

    r = run_pyz("refresh", "prod", *search, cwd=ws)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["status"], out["resources_checked"], out["resources_changed"], out["resources_failed"]) == ("succeeded", 4, 0, 0)
    # What a refresh writes is an observation of Terraform's version, never its next serial.
    base = out["from_serial"]
    assert (out["to_serial"], out["observation"]) == (None, f"v{base}.1")

    (ws / "out" / "two.txt").unlink()
    assert run_pyz("state", "set", "prod", "--workdir", str(ws)).returncode == 0  # deletions commit only with a workdir
    r = run_pyz("refresh", "prod", *search, cwd=tmp_path)  # and then from any directory
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["changed_addresses"] == ['local_file.f["two"]'] and out["resources_changed"] == 1
    assert (out["from_serial"], out["to_serial"], out["observation"]) == (base, None, f"v{base}.2")
    observed = run_pyz("state", "pull", "prod", "--observed")
    assert observed.returncode == 0, observed.stderr
    files = [i["index_key"] for r in json.loads(observed.stdout)["resources"] if r["type"] == "local_file" for i in r["instances"]]
    assert "two" not in files and files, files
    assert provider_pids() - before == set(), "provider processes outlived kl refresh"


def test_embedded_default_database_from_the_pyz(run_pyz, monkeypatch):
    monkeypatch.delenv("KL_DATABASE_URL", raising=False)
    # As root the server runs as an unprivileged account that must reach the data dir.
    base = Path(tempfile.mkdtemp(prefix="kl-pyz-embedded-"))
    os.chmod(base, 0o755)
    env = {"KL_DATA_DIR": str(base)}
    state = json.dumps({"version": 4, "terraform_version": "1.0.3", "serial": 1, "lineage": "l-1", "outputs": {},
                        "resources": []})
    try:
        r = run_pyz("state", "import", "dev", "-", input=state, env=env)
        assert r.returncode == 0, r.stderr
        status = run_pyz("db", "status", env=env)
        assert status.returncode == 0 and "embedded" in status.stdout and "current" in status.stdout, status.stdout
        listing = run_pyz("state", "list", env=env)
        assert listing.returncode == 0 and "dev " in listing.stdout
    finally:
        stop = run_pyz("db", "stop", env=env)
        shutil.rmtree(base, ignore_errors=True)
    assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stdout + stop.stderr


def test_a_multi_host_url_follows_a_failover(run_pyz):
    """kl.pyz's bundled libpq takes the multi-host URL as given (`target_session_attrs=read-write`):
    migrated on the primary, then, with the primary killed and the standby promoted, the same URL
    reaches the new primary, which holds what the primary acknowledged."""
    from kit.replication import replicated

    with replicated("kl-pyzfo-", databases=("kl",)) as pair:
        env = {"KL_DATABASE_URL": pair.url("kl")}
        r = run_pyz("db", "migrate", env=env)
        assert r.returncode == 0, r.stderr
        r = run_pyz("state", "import", "app", "-", env=env,
                    input='{"version": 4, "serial": 1, "lineage": "l", "terraform_version": "1.8.5", "outputs": {}, '
                          '"resources": []}')
        assert r.returncode == 0, r.stderr
        pair.kill_primary()
        pair.promote()
        r = run_pyz("state", "list", "--format", "json", env=env)
        assert r.returncode == 0, r.stderr
        assert [s["name"] for s in json.loads(r.stdout)["states"]] == ["app"], r.stdout


def test_completion_scripts_come_from_the_bundled_shtab(run_pyz, db_url, make_state, tmp_path):
    # shtab is one of kl.pyz's pure-Python wheels: kl completion works with nothing but Debian's python3.
    for shell, registers in (("bash", "complete -o bashdefault -F _shtab_kl kl"), ("zsh", "#compdef kl"),
                             ("fish", "complete -c kl ")):
        r = run_pyz("completion", shell)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert registers in r.stdout and "_kl_complete_state_names" in r.stdout, shell
    f = tmp_path / "s.tfstate"
    f.write_bytes(make_state(1, {"a": {"id": "1"}}))
    assert run_pyz("state", "import", "prod", str(f), env={"KL_DATABASE_URL": db_url}).returncode == 0
    r = run_pyz("completion", "--state-names", env={"KL_DATABASE_URL": db_url})
    assert (r.returncode, r.stdout, r.stderr) == (0, "prod\n", "")


def test_ci_drift_report_runs_kl_pyz_as_the_ci_examples_do(pyz, host_python, home, db_url, small_workspace, tmp_path):
    # examples/ci/drift-report.sh with its default KL (python3 kl.pyz, from the job's checkout) and
    # a CI runner's environment: a drift is exit 2 and a report naming it.
    checkout = tmp_path / "checkout"
    shutil.copytree(small_workspace, checkout / "infra", symlinks=True)
    shutil.copyfile(pyz, checkout / "kl.pyz")
    (checkout / "infra" / "out" / "two.txt").unlink()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(host_python)  # the runner's python3 is Debian's, without our packages
    env = clean_env(home, PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    assert subprocess.run([str(host_python), "-I", "kl.pyz", "state", "import", "prod", "infra/terraform.tfstate",
                           "--source", "apply"], cwd=checkout, env=env, capture_output=True, timeout=180).returncode == 0
    r = subprocess.run(["sh", str(REPO / "examples" / "ci" / "drift-report.sh"), "prod", "--workdir", "infra",
                        "--provider-search-path", "infra/.terraform/providers"], cwd=checkout, env=env,
                       capture_output=True, text=True, timeout=300)
    report = (checkout / "kl-drift.md").read_text()
    assert r.returncode == 2, r.stderr
    assert report.startswith("### Refresh of `prod`: succeeded") and '**`local_file.f["two"]`**: deleted' in report, report
