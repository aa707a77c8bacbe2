"""Drift ignore rules end to end (issue 12): a Terraform 1.0.3 state, the real local provider, real
refreshes. A glob over addresses hides the drift it matches from `kl drift`, `kl status` and
`--detailed-exitcode` (of `kl drift` and of `kl refresh`); `kl drift --all` shows it as ignored with
the rule; removing the rule brings it back.
"""
from __future__ import annotations

import json
from pathlib import Path

from kit.paths import PLUGIN_CACHE

GONE = ['local_file.f["three"]', 'local_file.f["two"]']


def status_open(run_kl) -> int:
    r = run_kl("status", "prod", "--format", "json")
    assert r.returncode == 0, r.stderr
    return int(json.loads(r.stdout)["open_drift"])


def gate(run_kl) -> int:
    return int(run_kl("drift", "prod", "--detailed-exitcode", "-q").returncode)


def refresh(run_kl, ws: Path) -> tuple[int, dict]:
    r = run_kl("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "--format", "json", "--detailed-exitcode", cwd=ws)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def test_a_glob_over_addresses_hides_real_drift_until_the_rule_is_removed(run_kl, db_url: str, workspace: Path):
    assert run_kl("state", "import", "prod", str(workspace / "terraform.tfstate"), "--source", "apply").returncode == 0
    r = run_kl("state", "set", "prod", "--workdir", str(workspace))
    assert r.returncode == 0, r.stderr
    (workspace / "out" / "two.txt").unlink()
    (workspace / "out" / "three.txt").unlink()
    code, out = refresh(run_kl, workspace)
    assert (code, out["status"], sorted(out["changed_addresses"])) == (2, "succeeded", GONE), out
    assert gate(run_kl) == 2 and status_open(run_kl) == 2

    # A rule for another state, and one with a path (deletions are under no path), hide nothing.
    assert run_kl("drift", "ignore", "add", "--states", "staging", "--address", "local_file.*").returncode == 0
    assert run_kl("drift", "ignore", "add", "--states", "prod", "--address", "local_file.*", "--path", "content").returncode == 0
    assert gate(run_kl) == 2 and status_open(run_kl) == 2

    r = run_kl("drift", "ignore", "add", "--states", "prod", "--address", "local_file.*", "--reason", "scratch files",
               "--expires", "1d")
    assert r.returncode == 0, r.stderr
    rule = int(r.stdout)
    assert gate(run_kl) == 0 and status_open(run_kl) == 0
    assert run_kl("drift", "prod").stdout.decode() == "prod: no drift\n(2 more ignored by rules: kl drift prod --all)\n"
    doc = json.loads(run_kl("drift", "prod", "--format", "json").stdout)
    assert (doc["total"], doc["open"], doc["ignored"], doc["drift"]) == (0, 0, 2, [])
    everything = json.loads(run_kl("drift", "prod", "--all", "--format", "json").stdout)
    assert (everything["total"], everything["open"]) == (2, 0)
    assert sorted((e["address"], e["kind"], e["status"], e["ignored_by"]["rule"], e["ignored_by"]["reason"])
                  for e in everything["drift"]) == [(a, "deleted", "ignored", rule, "scratch files") for a in GONE]
    text = run_kl("drift", "prod", "--all").stdout.decode()
    assert text.count(f"ignored by rule {rule}: scratch files") == 2, text
    # kl refresh's gate counts open drift after its commit: the same records, still hidden
    code, out = refresh(run_kl, workspace)
    assert (code, out["status"]) == (0, "succeeded"), out
    rules = json.loads(run_kl("drift", "ignore", "list", "--format", "json").stdout)["rules"]
    assert [(x["id"], x["hides"]) for x in rules][-1] == (rule, 2) and [x["hides"] for x in rules] == [0, 0, 2]

    assert run_kl("drift", "ignore", "remove", str(rule)).returncode == 0
    assert gate(run_kl) == 2 and status_open(run_kl) == 2
    assert sorted(e["address"] for e in json.loads(run_kl("drift", "prod", "--format", "json").stdout)["drift"]) == GONE


def dry_run(run_kl, ws: Path, *extra: str):
    return run_kl("refresh", "prod", "--dry-run", "--provider-search-path", str(PLUGIN_CACHE), "--detailed-exitcode",
                  *extra, cwd=ws)


def test_a_dry_run_gates_after_ignore_rules_and_shows_what_they_hide(run_kl, db_url: str, workspace: Path):
    """`kl refresh --dry-run --detailed-exitcode` counts what the run found after ignore rules, as
    `kl drift` would count it once committed: a run that finds only ignored changes exits 0 and
    shows them as ignored, with the rule; its JSON counts are what kl drift then says."""
    assert run_kl("state", "import", "prod", str(workspace / "terraform.tfstate"), "--source", "apply").returncode == 0
    assert run_kl("state", "set", "prod", "--workdir", str(workspace)).returncode == 0
    (workspace / "out" / "two.txt").unlink()
    (workspace / "out" / "three.txt").unlink()
    r = run_kl("drift", "ignore", "add", "--states", "prod", "--address", "local_file.*", "--reason", "scratch files")
    assert r.returncode == 0, r.stderr
    rule = int(r.stdout)

    r = dry_run(run_kl, workspace, "--format", "json")
    out = json.loads(r.stdout)
    assert (r.returncode, out["status"], out["open"], out["ignored"]) == (0, "succeeded", 0, 2), out
    ignored_by = {"rule": rule, "reason": "scratch files", "rules": [{"rule": rule, "reason": "scratch files"}]}
    assert [(d["address"], d["kind"], d["status"], d["ignored_by"]) for d in out["drift"]] == [
        (a, "deleted", "ignored", ignored_by) for a in GONE]
    text = dry_run(run_kl, workspace)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.decode().splitlines()
    assert f'  {GONE[0]}: deleted, ignored by rule {rule}: scratch files' in lines, lines
    assert "open drift found: 0 (2 more ignored by rules) (nothing committed)" in lines, lines
    md = dry_run(run_kl, workspace, "--format", "markdown").stdout.decode()
    assert f"**`{GONE[0]}`**: deleted, ignored by rule {rule}: scratch files" in md, md

    # A rule with a path does not hide a deletion, in the dry run as in kl drift.
    assert run_kl("drift", "ignore", "remove", str(rule)).returncode == 0
    assert run_kl("drift", "ignore", "add", "--states", "prod", "--address", "local_file.*", "--path", "content").returncode == 0
    r = dry_run(run_kl, workspace, "--format", "json")
    out = json.loads(r.stdout)
    assert (r.returncode, out["open"], out["ignored"], [d["status"] for d in out["drift"]]) == (2, 2, 0, ["open", "open"]), out

    # Committed: the run's counts are kl drift's, open and ignored alike.
    assert run_kl("drift", "ignore", "add", "--states", "prod", "--address", GONE[0]).returncode == 0
    code, out = refresh(run_kl, workspace)
    drift = json.loads(run_kl("drift", "prod", "--format", "json").stdout)
    assert (code, out["open"], out["ignored"]) == (2, drift["open"], drift["ignored"]) == (2, 1, 1), (out, drift)
    assert [(d["address"], d["status"]) for d in out["drift"]] == [(GONE[0], "ignored"), (GONE[1], "open")]
