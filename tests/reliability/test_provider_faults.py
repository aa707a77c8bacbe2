"""Provider faults during `kl refresh`, each against the fault-injecting fake: what the run
reports, and what must hold afterwards (nothing committed, the audit row finished, no orphan)."""
from __future__ import annotations

import json

from faultkit import fake_state, last_run, serials


def test_crash_mid_group_names_provider_and_address_and_commits_nothing(run_kl, db_url, fake_cache):
    make, _ = fake_cache
    cache = make()
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_crash", "fake_echo"])).returncode == 0
    r = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--format", "json", "--provider-parallelism", "1")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "failed" and out["to_serial"] is None, out
    failures = {f["address"]: f["message"] for f in out["failures"]}
    assert "plugin exited" in failures["fake_crash.r1"] and failures["fake_crash.r1"].startswith("provider fake:"), failures
    status, _, to_version, finished = last_run(db_url)
    assert (status, to_version) == ("failed", None) and finished is not None
    assert serials(db_url) == [1]
