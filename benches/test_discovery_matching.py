"""Discovery at scale: 10,000 objects listed by the framework test provider (testfw, one JSON file
each) matched against 1,000,000 open instances with identities (KL_BENCH_QUICK=1: 100,000), in
10 states of the listed type. Half the listed objects are claimed (one of them by two states), half
are not. Timed: the whole `kl discover` run in process (launch, configure, list, match, record),
and the matching alone (kilolock.unmanaged.matching.claims, the one seam onto the identity index).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psycopg

from kit.paths import PLUGIN_CACHE
from kit.providers import our_provider

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
INSTANCES = 100_000 if QUICK else 1_000_000
STATES = 10
LISTED = 10_000
SOURCE = "registry.terraform.io/kilolock/testfw"
TYPE = "testfw_thing"


def _identity(i: int) -> dict[str, str]:
    return {"id": f"o-{i:07d}", "region": "local"}


def _state(n: int, first: int, count: int) -> str:
    """A Terraform 1.12-shaped state: COUNT testfw_thing instances (one resource with count), each
    with its identity, numbered from FIRST."""
    instances = [{"index_key": k, "schema_version": 1, "attributes": {"id": f"o-{first + k:07d}"},
                  "sensitive_attributes": [], "identity_schema_version": 1, "identity": _identity(first + k)}
                 for k in range(count)]
    return json.dumps({"version": 4, "terraform_version": "1.12.2", "serial": 1, "lineage": f"bench-{n}", "outputs": {},
                       "resources": [{"mode": "managed", "type": TYPE, "name": "t", "provider": f'provider["{SOURCE}"]',
                                      "instances": instances}]})


def _populate(conn: psycopg.Connection) -> None:
    from kilolock import tfstate
    from kilolock.store import writes

    per = INSTANCES // STATES
    for n in range(STATES):
        raw = _state(n, n * per, per)
        writes.store_document(conn, f"bench/{n}", tfstate.parse_state(raw), raw, source="import", actor="bench")
    # One object claimed twice: the first of state 0 is imported into one more state.
    raw = _state(STATES, 0, 1)
    writes.store_document(conn, "bench/again", tfstate.parse_state(raw), raw, source="import", actor="bench")


def test_discovery_of_10000_listed_objects_against_the_index(bench_db: str, tmp_path: Path,
                                                              bench_summary: list[str]) -> None:
    from kilolock.store import provider_configs
    from kilolock.store.discovery_runs import Scope
    from kilolock.unmanaged import matching, service

    our_provider("testfw")
    remote = tmp_path / "remote"
    remote.mkdir()
    # Half the listed objects are instances of the states (every 200th of the first 5,000), half not.
    claimed = [i * (INSTANCES // 2 // (LISTED // 2)) for i in range(LISTED // 2)]
    unclaimed = [INSTANCES + i for i in range(LISTED // 2)]
    for i in claimed + unclaimed:
        (remote / f"o-{i:07d}.json").write_text(json.dumps({"id": f"o-{i:07d}"}))
    with psycopg.connect(bench_db, autocommit=True) as conn:
        started = time.perf_counter()
        _populate(conn)
        populate_s = time.perf_counter() - started
        provider_configs.upsert(conn, None, SOURCE, "", config={"dir": str(remote)})

        started = time.perf_counter()
        found = matching.claims(conn, SOURCE, TYPE, [_identity(i) for i in claimed + unclaimed], 1)
        match_s = time.perf_counter() - started
        assert sum(1 for c in found if c) == LISTED // 2 and len(found[0]) == 2

        started = time.perf_counter()
        outcome = service.discover(conn, service.Request(Scope(SOURCE, "", None, TYPE, {}), actor="bench",
                                                         search_paths=(str(PLUGIN_CACHE),)))
        discover_s = time.perf_counter() - started
    counts: dict[str, Any] = {m: outcome.count(m) for m in ("managed", "unmanaged", "managed twice")}
    assert counts == {"managed": LISTED // 2 - 1, "unmanaged": LISTED // 2, "managed twice": 1}
    line = (f"discovery: {LISTED:,} listed against {INSTANCES:,} instances in {STATES + 1} states: kl discover "
            f"{discover_s:.1f} s (matching alone {match_s:.1f} s); populating the states took {populate_s:.0f} s")
    bench_summary.append(line)
    print(line)
