"""kl state diff with observations at either end: a Terraform 1.0.3 state, real providers, real
refreshes. An observation (v1.2) is named as 1.2, `--observed` is Terraform's current version →
the latest observation, and what the refresh read comes from the observation's document, so it
diffs against Terraform's versions and other observations alike, in JSON and as a table."""
from __future__ import annotations

import json
from pathlib import Path

from kit.paths import PLUGIN_CACHE
from kit.tfworkspace import terraform

ONE, TWO = 'local_file.f["one"]', 'local_file.f["two"]'


def _import(run_kl, ws: Path) -> int:
    r = run_kl("state", "import", "prod", str(ws / "terraform.tfstate"), "--source", "apply")
    assert r.returncode == 0, r.stderr
    return int(json.loads((ws / "terraform.tfstate").read_text())["serial"])


def _refresh(run_kl, ws: Path) -> str:
    r = run_kl("refresh", "prod", "--workdir", str(ws), "--provider-search-path", str(PLUGIN_CACHE), "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    observation: str = json.loads(r.stdout)["observation"]
    return observation


def _diff(run_kl, *args: str) -> dict:
    r = run_kl("state", "diff", "prod", *args, "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    doc: dict = json.loads(r.stdout)
    return doc


def _entries(doc: dict) -> list[tuple[str, str]]:
    return [(e["address"], e["action"]) for e in doc["instances"]]


def test_state_diff_names_observations_and_reads_what_they_found(workspace, db_url, run_kl):
    v = _import(run_kl, workspace)
    # The first refresh adds schema-sensitive marks only: an observation that differs from its
    # base in metadata alone, which is no change.
    first = _refresh(run_kl, workspace)
    assert first == f"v{v}.1"
    assert _entries(_diff(run_kl, "--observed")) == []

    (workspace / "out" / "two.txt").unlink()
    (workspace / "out" / "one.txt").write_text("edited behind Terraform's back")
    second = _refresh(run_kl, workspace)
    assert second == f"v{v}.2"

    observed = _diff(run_kl, "--observed")
    assert (observed["from"], observed["to"], observed["from_version"], observed["to_version"]) == (v, v, f"v{v}", second)
    assert (observed["added"], observed["removed"], observed["changed"]) == (0, 2, 0)
    assert _entries(observed) == [(ONE, "removed"), (TWO, "removed")]
    assert _diff(run_kl, str(v), f"{v}.2") == observed  # the same, named
    assert _diff(run_kl, f"v{v}", f"v{v}.2") == observed  # as kl state versions prints them
    back = _diff(run_kl, f"{v}.2", f"{v}.1")  # observation to observation, either order
    assert (back["from_version"], back["to_version"], _entries(back)) == (second, first, [(ONE, "added"), (TWO, "added")])

    table = run_kl("state", "diff", "prod", "--observed")
    assert table.returncode == 0, table.stderr.decode()
    lines = table.stdout.decode().splitlines()
    assert lines[0] == f"prod: v{v} → {second}: 0 added, 2 removed, 0 changed", lines
    assert lines[1:] == [f"- {ONE}", f"- {TWO}"], lines
    same = run_kl("state", "diff", "prod", f"{v}.2", f"{v}.2")
    assert same.stdout.decode() == f"prod: {second} against itself; nothing to compare\n"

    # Terraform puts the files back and writes a newer version: the old observation diffs against it too, and
    # Terraform's own serials diff as they always did (the lifecycle index).
    terraform(workspace, "apply", "-auto-approve")
    after = _import(run_kl, workspace)
    assert after > v
    forward = _diff(run_kl, f"{v}.2", str(after))
    assert (forward["from_version"], forward["to_version"], _entries(forward)) == (
        second, f"v{after}", [(ONE, "added"), (TWO, "added")])
    terraforms = _diff(run_kl, str(v), str(after))
    assert (terraforms["from_version"], terraforms["to_version"], _entries(terraforms)) == (f"v{v}", f"v{after}", [])
    assert _diff(run_kl) == terraforms  # the default: the version before the current one → the current one
    # --observed follows Terraform's current version; the latest observation is still of v.
    assert _entries(_diff(run_kl, "--observed")) == [(ONE, "removed"), (TWO, "removed")]
    assert _refresh(run_kl, workspace) == f"v{after}.1"
    assert _entries(_diff(run_kl, "--observed")) == []


def test_state_diff_refuses_what_names_no_observation(workspace, db_url, run_kl):
    v = _import(run_kl, workspace)
    none_yet = run_kl("state", "diff", "prod", "--observed")
    assert none_yet.returncode == 1
    assert none_yet.stderr.decode() == "kl: state 'prod' has no observation yet: `kl refresh prod` records one\n"
    _refresh(run_kl, workspace)
    missing = run_kl("state", "diff", "prod", str(v), f"{v}.9")
    assert missing.returncode == 1
    assert missing.stderr.decode() == f"kl: state 'prod' has no observation v{v}.9 (see `kl state versions prod`)\n"
    both = run_kl("state", "diff", "prod", str(v), "--observed")
    assert both.returncode == 2 and "--observed compares Terraform's current version" in both.stderr.decode()
    for bad in (f"{v}.0", f"{v}.x", "x.1", f"{v}.", "-1"):
        r = run_kl("state", "diff", "prod", bad)
        assert r.returncode == 2, (bad, r.stderr)
        assert f"{bad!r} is not a version: a serial (7) or an observation (7.3)" in r.stderr.decode(), (bad, r.stderr)
