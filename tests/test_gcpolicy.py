"""kilolock.gcpolicy in a process of its own (the test process's collector is left alone)."""
from __future__ import annotations

import subprocess
import sys

from kit.paths import REPO

_PROBE = """
import gc
from kilolock import gcpolicy
{before}
gcpolicy.hold()
held = gc.isenabled()
gcpolicy.settled()
print(held, gc.isenabled(), gc.get_freeze_count() > 0)
"""


def _probe(before: str) -> str:
    r = subprocess.run([sys.executable, "-c", _PROBE.format(before=before)], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_kl_own_process_holds_the_collector_until_settled_then_freezes():
    assert _probe("gcpolicy.own_process()") == "False True True"


def test_a_process_kl_did_not_start_keeps_its_collector_as_it_was():
    # A test (or a program) calling kilolock.cli.main in its own process.
    assert _probe("") == "True True False"


def test_a_collector_already_off_is_not_turned_on():
    # Whoever disabled it decides when it runs again.
    assert _probe("gcpolicy.own_process(); gc.disable()") == "False False False"
