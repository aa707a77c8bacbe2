"""--provider-parallelism auto against a real provider on the same machine (null 2.1.2): it answers
in well under a millisecond, so kl's own CPU sets the pace and more reads in flight complete no
more reads per second. Before growth had to pay in reads per second (kilolock.refresh.inflight),
latency noise on a busy machine let auto grow to 137-256 reader threads at 4,000 instances (256 at
20,000: 35.5 s against 18.7 s for a fixed 10)."""
from __future__ import annotations

import json

from kit.paths import PLUGIN_CACHE
from kit.states import null_count_state

INSTANCES = 4000
# Where throughput stops improving against null is about 10-20 in flight; measured with the fix
# (busy machine): 15-23. A quarter of AUTO_MAX leaves room for noise and none for a runaway.
RUNAWAY = 64


def null_state(instances: int) -> bytes:
    return null_count_state(instances, instances, "0a0a0a0a-0000-4000-8000-000000004000")


def test_auto_does_not_run_away_against_a_provider_that_kl_itself_cannot_keep_busy(run_kl, db_url):
    assert run_kl("state", "import", "big", "-", input=null_state(INSTANCES)).returncode == 0
    r = run_kl("refresh", "big", "--dry-run", "--format", "json", "--provider-search-path", str(PLUGIN_CACHE))
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["resources_checked"] == INSTANCES and out["resources_failed"] == 0, r.stderr
    [used] = out["concurrency"]
    assert used["mode"] == "auto" and used["start"] == 10
    assert used["max"] <= RUNAWAY, used
