"""Lock IDs are random version-4 UUIDs made without the uuid module, and a refresh's modules do not
import it: on Linux ``import uuid`` imports ``platform`` (~3 ms of every small refresh)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from kilolock.store import locks
from kit.paths import REPO


def test_lock_ids_are_distinct_random_version_4_uuids_in_uuid_text_form():
    ids = [locks.lock_info("OperationTypeRefresh", "me", "kl")["ID"] for _ in range(500)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert str(parsed) == text


_PROBE = """
import json, sys
import kilolock.cli.refreshcmd, kilolock.refresh.prelaunch, kilolock.refresh.factory, kilolock.refresh.fleet
import kilolock.refresh.orchestrator, kilolock.refresh.slots, kilolock.store.db, kilolock.store.locks
import kilolock.provider.client, kilolock.provider.connection
kilolock.store.locks.lock_info("OperationTypeRefresh", "me", "kl")
print(json.dumps(sorted(sys.modules)))
"""


def test_the_refresh_commands_modules_do_not_import_uuid_or_platform():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n{_PROBE}"],
                       capture_output=True, text=True, env=env, timeout=60, check=True)
    modules = set(json.loads(r.stdout))
    assert "kilolock.refresh.orchestrator" in modules
    assert not modules & {"uuid", "platform"}
