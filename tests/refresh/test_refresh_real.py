"""kl refresh end to end: real Terraform-made state, real provider binaries, real PostgreSQL."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from kit.paths import PLUGIN_CACHE, REPO
from kit.pg import one_row
from kit.tfworkspace import terraform

SEARCH = ("--provider-search-path", str(PLUGIN_CACHE))
pytestmark = pytest.mark.usefixtures("read_path")  # both read paths (conftest.py)


def kl_refresh(run_kl, ws: Path, *extra: str, env: dict[str, str] | None = None):
    r = run_kl("refresh", "prod", *SEARCH, "--format", "json", *extra, cwd=ws, env=env)
    try:
        return r, json.loads(r.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"kl refresh printed no JSON (rc {r.returncode}):\n{r.stdout!r}\n{r.stderr.decode()}") from None


def import_state(run_kl, ws: Path) -> int:
    r = run_kl("state", "import", "prod", str(ws / "terraform.tfstate"), "--source", "apply")
    assert r.returncode == 0, r.stderr
    return json.loads((ws / "terraform.tfstate").read_text())["serial"]


def pulled(run_kl, *args: str) -> dict:
    r = run_kl("state", "pull", "prod", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def without_sensitivity_marks(doc: dict) -> dict:
    # Terraform 1.0.3 re-applies only prior marks; kl, like Terraform >= 1.8, adds the schema's
    # sensitive paths too, so that one field is compared separately.
    doc = json.loads(json.dumps(doc))
    for r in doc["resources"]:
        for i in r["instances"]:
            i.pop("sensitive_attributes", None)
    return doc


def test_unchanged_state_refreshes_to_zero_changed_exactly_as_terraform_refresh_only(run_kl, db_url, workspace, tmp_path):
    serial = import_state(run_kl, workspace)
    r, out = kl_refresh(run_kl, workspace)
    assert r.returncode == 0, r.stderr
    assert (out["status"], out["resources_checked"], out["resources_changed"], out["resources_failed"]) == ("succeeded", 10, 0, 0)
    assert (out["from_serial"], out["to_serial"], out["observation"]) == (serial, None, f"v{serial}.1")
    ours = pulled(run_kl, "--observed")
    assert (ours["serial"], pulled(run_kl)["serial"]) == (serial, serial)  # observed at Terraform's serial, which stays

    # Terraform's own refresh of the same state with the same binaries (it writes its next serial:
    # the one field compared apart).
    tf_ws = tmp_path / "tf"
    shutil.copytree(workspace, tf_ws, symlinks=True)
    terraform(tf_ws, "apply", "-refresh-only", "-auto-approve")
    theirs = json.loads((tf_ws / "terraform.tfstate").read_text())
    assert theirs["serial"] in (serial, serial + 1)
    assert without_sensitivity_marks({**ours, "serial": 0}) == without_sensitivity_marks({**theirs, "serial": 0})

    marks = {(r["type"], tuple(s["value"] for s in p[:1])) for r in ours["resources"] for i in r["instances"] for p in i["sensitive_attributes"]}
    assert ("random_password", ("result",)) in marks and ("random_password", ("bcrypt_hash",)) in marks

    with psycopg.connect(db_url) as c:
        run = one_row(c, "SELECT status, resources_checked, resources_changed, resources_failed, to_version_id IS NOT NULL, actor FROM refresh_runs")
        assert run[:5] == ("succeeded", 10, 0, 0, True) and run[5].endswith("@cli")
        assert one_row(c, "SELECT kind, source, serial FROM state_versions ORDER BY seq DESC LIMIT 1") == ("observation", "refresh", serial)
        assert one_row(c, "SELECT source, serial FROM state_versions WHERE kind = 'terraform' ORDER BY serial DESC LIMIT 1") == (
            "apply", serial)
        assert one_row(c, "SELECT count(*) FROM current_resource_drift")[0] == 0


def test_a_commit_that_finds_nothing_different_writes_no_version_and_stores_no_document(run_kl, db_url, workspace):
    # The first committed refresh after Terraform's write may rewrite private data (serial+1); the
    # second reads every object back as it is: a version repeating its predecessor would only make
    # saved plans stale, so it records a confirmation, one row with no document.
    serial = import_state(run_kl, workspace)
    outs = []
    for _ in range(2):
        r, out = kl_refresh(run_kl, workspace, "--commit")
        assert r.returncode == 0 and out["resources_changed"] == 0, r.stderr
        outs.append(out)
    committed = outs[0]["to_serial"] or serial  # the real providers' private data may equal what Terraform wrote
    assert (outs[1]["to_serial"], outs[1]["observation"]) == (None, f"v{committed}.1"), outs
    assert pulled(run_kl)["serial"] == committed
    assert pulled(run_kl, "--observed") == pulled(run_kl)
    with psycopg.connect(db_url) as c:
        assert one_row(c, "SELECT count(*) FROM state_versions WHERE kind = 'terraform' AND serial > %s",
                       (committed,)) == (0,)
        assert one_row(c, "SELECT raw_state IS NULL AND head_piece IS NULL, kl_document_version(id) = base_version_id "
                          "FROM state_versions WHERE kind = 'observation'") == (True, True)
        # The lifecycle rows stand as the first refresh left them: every object open, once.
        assert one_row(c, "SELECT count(*), count(DISTINCT address) FROM resources WHERE delete_serial IS NULL") == (10, 10)


# Loaded before kl by the interpreter's site hook: notes the collector's state around
# kilolock.gcpolicy.settled, the moment `kl refresh` has loaded its state.
_GC_SPY = """
import gc, os
import kilolock.gcpolicy as policy
real = policy.settled
def settled():
    before = gc.isenabled()
    real()
    with open(os.environ["KL_TEST_GC_SPY"], "a") as f:
        f.write(f"{before} {gc.isenabled()} {gc.get_freeze_count()}\\n")
policy.settled = settled
"""


def _refresh_with_site_hook(run_kl, workspace: Path, tmp_path: Path, started_as: str, hook_source: str,
                            spy_variable: str) -> tuple[subprocess.CompletedProcess, Path]:
    """`kl refresh prod --format json` with HOOK_SOURCE as the interpreter's sitecustomize, started as
    `python -m kilolock` or as the `kl` command pip installs (what scripts/demo.sh and users run);
    SPY_VARIABLE names the file the hook writes."""
    import_state(run_kl, workspace)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(hook_source)
    spy = tmp_path / "spy.txt"
    env = {"PYTHONPATH": f"{hook}:{REPO}", spy_variable: str(spy)}
    args = ("refresh", "prod", *SEARCH, "--format", "json")
    if started_as == "kl":
        script = Path(sys.executable).parent / "kl"
        assert script.exists(), f"{script} is missing: pip install -e . (scripts/setup-dev.sh) installs the kl command"
        r = subprocess.run([str(script), *args], cwd=workspace, capture_output=True, env={**os.environ, **env}, timeout=120)
    else:
        r = run_kl(*args, cwd=workspace, env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "succeeded", r.stderr
    return r, spy


@pytest.mark.parametrize("started_as", ["python -m kilolock", "kl"])
def test_kl_refresh_collects_nothing_until_its_state_is_loaded_then_freezes_it(run_kl, db_url, workspace, tmp_path,
                                                                                started_as):
    # kilolock.gcpolicy: the imports and the loaded state are never walked by the collector, however
    # kl was started.
    _, spy = _refresh_with_site_hook(run_kl, workspace, tmp_path, started_as, _GC_SPY, "KL_TEST_GC_SPY")
    before, after, frozen = spy.read_text().split()
    assert (before, after) == ("False", "True")
    assert int(frozen) > 10_000  # the imports alone (psycopg, grpc, protobuf) are tens of thousands


# Loaded before kl by the interpreter's site hook: at exit, notes which of the modules kl defers
# (kilolock.lazyimports) are still placeholders whose code never ran.
_LAZY_SPY = """
import atexit, os
def report():
    from kilolock import lazyimports
    with open(os.environ["KL_TEST_LAZY_SPY"], "w") as f:
        f.write(" ".join(n for n in lazyimports.UNUSED if lazyimports.deferred(n)))
atexit.register(report)
"""


@pytest.mark.parametrize("started_as", ["python -m kilolock", "kl"])
def test_kl_refresh_never_runs_the_modules_it_defers(run_kl, db_url, workspace, tmp_path, started_as):
    # Protobuf's pure-Python backend and the few standard modules in lazyimports.UNUSED are imported
    # by other libraries for paths a refresh never takes: their code never runs, however kl was started.
    from kilolock import lazyimports

    _, spy = _refresh_with_site_hook(run_kl, workspace, tmp_path, started_as, _LAZY_SPY, "KL_TEST_LAZY_SPY")
    never_ran = spy.read_text().split()
    if os.environ.get("KL_PROVIDER_TRANSPORT") == "grpcio":  # grpc itself uses copy: loaded when it asks
        assert never_ran == [n for n in lazyimports.UNUSED if n != "copy"]
    else:
        assert never_ran == list(lazyimports.UNUSED)


def test_schema_is_fetched_once_then_served_from_the_cache(run_kl, db_url, workspace, monkeypatch):
    from kilolock.refresh.factory import ProviderFactory
    from kilolock.refresh.options import RefreshOptions
    from kilolock.refresh.orchestrator import run
    from kilolock.store import states

    import_state(run_kl, workspace)
    monkeypatch.chdir(workspace)
    counts = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        for _ in range(2):
            factory = ProviderFactory(conn, states.state_id(conn, "prod"), (str(PLUGIN_CACHE),))
            res = run(conn, "prod", factory, RefreshOptions(actor="t"))
            assert res.status == "succeeded", res.error
            counts.append(factory.get_schema_calls)
        cached = conn.execute("SELECT source, version, protocol_version FROM provider_schemas ORDER BY source").fetchall()
    assert counts == [5, 0]
    assert [(s.rsplit("/", 1)[1], p) for s, _, p in cached] == [("local", 5), ("null", 5), ("random", 5), ("simple", 6), ("time", 5)]


def test_out_of_band_deletion_removes_the_instance_and_kl_drift_lists_it(run_kl, db_url, workspace):
    import_state(run_kl, workspace)
    (workspace / "out" / "two.txt").unlink()
    r, out = kl_refresh(run_kl, workspace, "--workdir", ".")  # a deletion is recorded only with a workdir said
    assert r.returncode == 0, r.stderr
    assert out["changed_addresses"] == ['local_file.f["two"]'] and out["resources_changed"] == 1
    keys = [i["index_key"] for res in pulled(run_kl, "--observed")["resources"] if res["type"] == "local_file" for i in res["instances"]]
    assert sorted(keys) == ["four", "one", "three"]
    keys = [i["index_key"] for res in pulled(run_kl)["resources"] if res["type"] == "local_file" for i in res["instances"]]
    assert sorted(keys) == ["four", "one", "three", "two"]  # Terraform's version, as Terraform wrote it
    d = json.loads(run_kl("drift", "prod", "--format", "json").stdout)
    assert [(x["address"], x["kind"], x["detected_serial"]) for x in d["drift"]] == [('local_file.f["two"]', "deleted", out["from_serial"])]
    text = run_kl("drift", "prod").stdout.decode()
    assert 'local_file.f["two"]: deleted at v' in text
    # Clause (2) of the drift predicate: the next apply clears it. Its file is Terraform's next
    # serial, which kl has not used (an observation does not take it): no --force.
    terraform(workspace, "apply", "-auto-approve")
    r = run_kl("state", "import", "prod", str(workspace / "terraform.tfstate"), "--source", "apply")
    assert r.returncode == 0, r.stderr
    assert json.loads(run_kl("drift", "prod", "--format", "json").stdout)["drift"] == []


def test_a_drift_read_again_shares_the_observations_document_until_the_read_changes(run_kl, db_url, workspace):
    """An object deleted behind Terraform's back stays deleted run after run: each run records an
    observation (so `kl drift` says when it was last seen), the later ones sharing the first one's
    document and copying its observed objects rather than storing the document again, and the
    drift stays as it was found. Once the read changes, the document is stored anew."""
    serial = import_state(run_kl, workspace)
    two = workspace / "out" / "two.txt"
    content = two.read_bytes()
    two.unlink()
    outs = []
    for _ in range(3):
        r, out = kl_refresh(run_kl, workspace, "--workdir", ".")
        assert r.returncode == 0 and out["status"] == "succeeded", r.stderr
        outs.append(out)
    assert [o["observation"] for o in outs] == [f"v{serial}.{n}" for n in (1, 2, 3)]
    assert [o["changed_addresses"] for o in outs] == [['local_file.f["two"]']] * 3
    with psycopg.connect(db_url) as c:
        rows = c.execute("SELECT v.head_piece, v.layout, v.content_hash, (SELECT array_agg(o.address) FROM observed_objects o "
                         "WHERE o.observation_id = v.id) FROM state_versions v WHERE v.kind = 'observation' "
                         "ORDER BY v.observation_number").fetchall()
        assert len(rows) == 3 and rows[0][0] is not None and rows[1] == rows[0] and rows[2] == rows[0], rows
        assert rows[0][3] == ['local_file.f["two"]']
    observed = pulled(run_kl, "--observed")
    assert sorted(i["index_key"] for res in observed["resources"] if res["type"] == "local_file"
                  for i in res["instances"]) == ["four", "one", "three"]
    d = json.loads(run_kl("drift", "prod", "--format", "json").stdout)
    assert [(x["address"], x["kind"], x["detected_version"], x["last_confirmed_version"]) for x in d["drift"]] == \
        [('local_file.f["two"]', "deleted", f"v{serial}.1", f"v{serial}.3")]

    two.write_bytes(content)  # put back as Terraform made it: the next read differs from the last one
    r, out = kl_refresh(run_kl, workspace, "--workdir", ".")
    assert r.returncode == 0 and out["observation"] == f"v{serial}.4", out
    assert json.loads(run_kl("drift", "prod", "--format", "json").stdout)["drift"] == []
    assert 'local_file.f["two"]' in {f'{res["type"]}.{res["name"]}["{i["index_key"]}"]'
                                     for res in pulled(run_kl, "--observed")["resources"] if res["type"] == "local_file"
                                     for i in res["instances"]}


def test_wrong_working_directory_trips_the_mass_removal_guard(run_kl, db_url, workspace, tmp_path):
    # local_file paths are relative: from elsewhere every file looks gone, which must not be committed.
    import_state(run_kl, workspace)
    r = run_kl("refresh", "prod", *SEARCH, "--format", "json", cwd=tmp_path)
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "failed" and (out["to_serial"], out["observation"]) == (None, None)
    assert "4 of 4 instances of registry.terraform.io/hashicorp/local came back deleted" in out["error"]
    assert r.stderr.decode().startswith("kl: refresh failed: 4 of 4 instances") and r.stderr.count(b"\n") == 1, r.stderr
    r, out = kl_refresh(run_kl, workspace)
    assert out["status"] == "succeeded" and out["resources_changed"] == 0


def test_forced_upgrade_bumps_schema_version_with_no_diagnostics(run_kl, db_url, workspace):
    import_state(run_kl, workspace)
    r, first = kl_refresh(run_kl, workspace)
    assert first["status"] == "succeeded"
    with psycopg.connect(db_url, autocommit=True) as c:  # doctor the cached schema version, as the ADR's test does
        c.execute("""UPDATE provider_schemas SET schema = jsonb_set(schema, '{resource_schemas,null_resource,version}', '1')
                     WHERE source = 'registry.terraform.io/hashicorp/null'""")
    r, second = kl_refresh(run_kl, workspace)
    assert r.returncode == 0 and second["status"] == "succeeded" and second["failures"] == [], second
    versions_by_type = {res["type"]: {i["schema_version"] for i in res["instances"]} for res in pulled(run_kl, "--observed")["resources"]}
    assert versions_by_type["null_resource"] == {1} and versions_by_type["random_password"] == {3}


def test_upgrade_of_an_old_shape_through_the_real_random_provider(run_kl, db_url, workspace):
    # random_password at schema version 0 lacked bcrypt_hash and the numeric flags; the provider's
    # own upgrader fills them in, which counts as changed.
    doc = json.loads((workspace / "terraform.tfstate").read_text())
    for res in doc["resources"]:
        if res["type"] == "random_password":
            inst = res["instances"][0]
            inst["schema_version"] = 0
            for k in ("bcrypt_hash", "numeric"):
                inst["attributes"].pop(k, None)
    (workspace / "terraform.tfstate").write_text(json.dumps(doc))
    import_state(run_kl, workspace)
    r, out = kl_refresh(run_kl, workspace)
    assert r.returncode == 0 and out["status"] == "succeeded", out
    assert "random_password.p" in out["changed_addresses"]
    inst = next(res for res in pulled(run_kl, "--observed")["resources"] if res["type"] == "random_password")["instances"][0]
    assert inst["schema_version"] == 3 and inst["attributes"]["bcrypt_hash"].startswith("$2")
    # The new bcrypt_hash and the password are secrets: kl drift shows the change, never the values.
    secrets = [inst["attributes"]["bcrypt_hash"], inst["attributes"]["result"]]
    text, as_json = run_kl("drift", "prod"), run_kl("drift", "prod", "--format", "json")
    assert "random_password.p: changed" in text.stdout.decode() and "bcrypt_hash: null → (sensitive)" in text.stdout.decode()
    for out in (text.stdout, text.stderr, as_json.stdout, as_json.stderr, r.stdout, r.stderr):
        assert not any(secret.encode() in out for secret in secrets)


def test_dry_run_and_table_output(run_kl, db_url, workspace):
    serial = import_state(run_kl, workspace)
    (workspace / "out" / "one.txt").write_text("edited out of band")
    r = run_kl("refresh", "prod", *SEARCH, "--dry-run", "--workdir", ".", cwd=workspace)  # an edited local_file reads as gone
    text = r.stdout.decode()
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith(" "))
    assert lines["status"].strip() == "succeeded" and lines["changed"].strip() == "1"
    assert lines["serial"].strip() == f"v{serial} → (dry run)"
    # What would change; not committed, so not "see kl drift".
    assert 'drift (not committed):\n  local_file.f["one"]: deleted\n' in text, text
    assert "see kl drift" not in text
    assert pulled(run_kl)["serial"] == serial
    # The audit trail says it was a dry run, not a run that committed nothing for another reason.
    [run] = json.loads(run_kl("runs", "prod", "--format", "json").stdout)["runs"]
    assert (run["status"], run["to_serial"], run["dry_run"]) == ("succeeded", None, True)
    assert f"v{serial} → (dry run)" in run_kl("runs", "prod").stdout.decode()


def _old_random_password(workspace: Path) -> None:
    """random_password at schema version 0, without bcrypt_hash and numeric: the real provider's
    upgrader fills them in, an attribute-level change with a secret in it."""
    doc = json.loads((workspace / "terraform.tfstate").read_text())
    for res in doc["resources"]:
        if res["type"] == "random_password":
            inst = res["instances"][0]
            inst["schema_version"] = 0
            for k in ("bcrypt_hash", "numeric"):
                inst["attributes"].pop(k, None)
    (workspace / "terraform.tfstate").write_text(json.dumps(doc))


def test_dry_run_diffs_in_json_and_markdown_and_the_ci_exit_codes(run_kl, db_url, workspace):
    _old_random_password(workspace)
    serial = import_state(run_kl, workspace)
    r, out = kl_refresh(run_kl, workspace, "--dry-run", "--detailed-exitcode", "-q")  # json is still printed
    assert r.returncode == 2 and out["to_serial"] is None, r.stderr
    [item] = out["drift"]
    assert (item["address"], item["kind"]) == ("random_password.p", "changed")
    assert {"path": "bcrypt_hash", "before": None, "after": "(sensitive)"} in item["changes"], item
    assert {"path": "numeric", "before": None, "after": True} in item["changes"], item
    r = run_kl("refresh", "prod", *SEARCH, "--dry-run", "--format", "markdown", cwd=workspace)
    md = r.stdout.decode()
    assert r.returncode == 0 and f"### Refresh of `prod`: succeeded (v{serial}, dry run, nothing recorded)" in md, md
    assert "**`random_password.p`**: changed" in md and "| `bcrypt_hash` | `null` | `(sensitive)` |" in md, md
    # Committed: the gate sees the open drift after the commit, and kl drift agrees.
    r = run_kl("refresh", "prod", *SEARCH, "--detailed-exitcode", "-q", cwd=workspace)
    assert (r.returncode, r.stdout, r.stderr) == (2, b"", b"")
    assert run_kl("drift", "prod", "--detailed-exitcode", "-q").returncode == 2
    # An apply (of the observed state, as `terraform apply -refresh-only` would write it) clears it.
    applied = pulled(run_kl, "--observed")
    applied["serial"] += 1
    assert run_kl("state", "import", "prod", "-", "--source", "apply", input=json.dumps(applied).encode()).returncode == 0
    assert run_kl("drift", "prod", "--detailed-exitcode").returncode == 0
    assert run_kl("refresh", "prod", *SEARCH, "--dry-run", "--detailed-exitcode", "-q", cwd=workspace).returncode == 0
    assert run_kl("refresh", "prod", *SEARCH, "--detailed-exitcode", "-q", cwd=workspace).returncode == 0
    # An error is 1 under the flag, whatever the cause: a refused commit, a bad duration.
    for name in ("one", "two", "three"):
        (workspace / "out" / f"{name}.txt").unlink()
    r = run_kl("refresh", "prod", *SEARCH, "--detailed-exitcode", cwd=workspace)
    assert r.returncode == 1 and "--allow-mass-removal" in r.stderr.decode() and "see kl drift" not in r.stdout.decode()
    assert run_kl("refresh", "prod", "--detailed-exitcode", "--timeout", "1", cwd=workspace).returncode == 1


def test_unknown_state_and_bad_flags(run_kl, db_url, workspace):
    r = run_kl("refresh", "nope", *SEARCH, cwd=workspace)
    assert r.returncode == 1 and r.stderr.decode().startswith("kl: no state named 'nope'")
    for args in (("--timeout", "soon"), ("--concurrency", "0"), ("--provider-parallelism", "x")):
        r = run_kl("refresh", "prod", *args, cwd=workspace)
        assert r.returncode == 2 and b"Traceback" not in r.stderr, (args, r.stderr)


def test_provider_not_found_is_a_per_group_failure_naming_where_it_looked(run_kl, db_url, workspace, tmp_path):
    import_state(run_kl, workspace)
    empty = tmp_path / "empty"  # no ./.terraform/providers here, and HOME has no plugin cache
    empty.mkdir()
    r = run_kl("refresh", "prod", "--provider-search-path", str(empty), "--format", "json", cwd=empty,
               env={"HOME": str(empty), "KL_PROVIDER_PATH": "", "TF_PLUGIN_CACHE_DIR": ""})
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "failed" and out["resources_failed"] == 10
    # One failure per provider group, not per instance, and nothing counted as checked.
    null = [f for f in out["failures"] if f["provider"] == "registry.terraform.io/hashicorp/null"]
    assert len(out["failures"]) == 5 and all(f["address"] is None for f in out["failures"]), out["failures"]
    assert [f["addresses"] for f in null] == [["null_resource.n[0]", "null_resource.n[1]", "null_resource.n[2]"]] and out["resources_checked"] == 0
    msg = null[0]["message"]
    assert "no binary for provider registry.terraform.io/hashicorp/null" in msg and str(empty) in msg
    assert ".terraform/providers" in msg  # the defaults were searched too
    text = run_kl("refresh", "prod", "--provider-search-path", str(empty), cwd=empty,
                  env={"HOME": str(empty), "KL_PROVIDER_PATH": "", "TF_PLUGIN_CACHE_DIR": ""}).stdout.decode()
    assert text.count("no binary for provider registry.terraform.io/hashicorp/null") == 1, text
