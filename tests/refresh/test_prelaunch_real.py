"""Providers started early (kilolock.refresh.prelaunch): the next `kl refresh STATE` starts the
binaries its last run used before it reads the state, and uses one only where discovery picks that
very binary for the same working directory. Real providers, real Terraform-made state."""
from __future__ import annotations

import json
from pathlib import Path

from kit.paths import PLUGIN_CACHE

SEARCH = ("--provider-search-path", str(PLUGIN_CACHE))

PROVIDERS = ("local", "null", "random", "simple", "time")


def _refresh(run_kl, ws: Path, cache: Path, *extra: str) -> tuple[dict, str]:
    r = run_kl("refresh", "prod", *SEARCH, "--format", "json", *extra, cwd=ws,
               env={"XDG_CACHE_HOME": str(cache), "KL_LOG": "info"})
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    assert (out["status"], out["resources_checked"], out["resources_failed"]) == ("succeeded", 10, 0)
    return out, r.stderr.decode()


def import_state(run_kl, ws: Path) -> None:
    r = run_kl("state", "import", "prod", str(ws / "terraform.tfstate"), "--source", "apply")
    assert r.returncode == 0, r.stderr


def _early_used(stderr: str) -> list[str]:
    return sorted(line.split("terraform-provider-")[1].split("_")[0] for line in stderr.splitlines()
                  if "started early, while the state was read" in line)


def test_the_next_run_of_a_state_uses_the_providers_started_early(run_kl, db_url, workspace, tmp_path):
    import_state(run_kl, workspace)
    cache = tmp_path / "cache"
    first, err1 = _refresh(run_kl, workspace, cache, "--workdir", str(workspace))
    assert _early_used(err1) == []  # nothing remembered yet
    memo = (cache / "kilolock" / "refresh-providers.json").read_text()
    assert db_url not in memo  # the URL may hold a password: only its hash keys the file
    second, err2 = _refresh(run_kl, workspace, cache, "--workdir", str(workspace))
    assert _early_used(err2) == sorted(PROVIDERS)
    assert "not used by this run" not in err2
    serial = first["from_serial"]
    assert (first["observation"], second["observation"]) == (f"v{serial}.1", f"v{serial}.2")  # both recorded, one after the other
    assert second["from_serial"] == serial and second["resources_changed"] == 0


def test_a_provider_started_early_in_another_directory_is_closed_not_used(run_kl, db_url, workspace, tmp_path):
    # The stored workdir moved: providers resolve relative paths in their working directory, so
    # one started in the old directory must not read anything (the autouse fixture checks that
    # no provider process outlives the run).
    import_state(run_kl, workspace)
    cache = tmp_path / "cache"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _refresh(run_kl, workspace, cache, "--workdir", str(elsewhere), "--allow-mass-removal", "--dry-run")
    _, err = _refresh(run_kl, workspace, cache, "--workdir", str(workspace))
    assert _early_used(err) == []
    assert err.count("was started early but not used by this run; closing it") == len(PROVIDERS)


def test_a_corrupt_or_stale_memory_costs_only_the_early_start(run_kl, db_url, workspace, tmp_path):
    import_state(run_kl, workspace)
    cache = tmp_path / "cache"
    (cache / "kilolock").mkdir(parents=True)
    memo = cache / "kilolock" / "refresh-providers.json"
    memo.write_text("{not json")
    _, err = _refresh(run_kl, workspace, cache, "--workdir", str(workspace))
    assert _early_used(err) == []
    doc = json.loads(memo.read_text())  # rewritten whole
    [entry] = doc["states"].values()
    for p in entry["providers"]:
        p["mtime_ns"] += 1  # as if the binary had been rebuilt since: not started early
    memo.write_text(json.dumps(doc))
    _, err = _refresh(run_kl, workspace, cache, "--workdir", str(workspace))
    assert _early_used(err) == [] and "not used by this run" not in err
