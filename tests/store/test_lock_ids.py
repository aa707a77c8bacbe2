"""Lock IDs are random version-4 UUIDs in uuid's text form, made without the uuid module (see
tests/test_refresh_imports.py for why)."""
from __future__ import annotations

import uuid

from kilolock.store import locks


def test_lock_ids_are_distinct_random_version_4_uuids_in_uuid_text_form():
    ids = [locks.lock_info("OperationTypeRefresh", "me", "kl")["ID"] for _ in range(500)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert str(parsed) == text
