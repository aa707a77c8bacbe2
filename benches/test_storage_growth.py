"""Storage grows with change, not with how often refresh runs (issue 13).

A fleet of states (20 × 1,000 null_resource instances; KL_BENCH_QUICK=1: 4 × 200) is imported,
then refreshed ROUNDS times each with 1% of its resources changing per refresh, through the real
write paths: refresh commits (refresh/commit.commit_refresh, the compare-and-swap write with its
touched set), and the HTTP backend's POST (server/store_ops.write_state, as Terraform's apply).
Then every state gets no-change refreshes. Size is pg_total_relation_size summed over kl's tables
after VACUUM, measured in this run; each step's growth is reported per write, as a fraction of one
state's full size (what importing one state added). Gates: a 1%-change refresh or POST adds at
most 5% of one state (quick mode 6%: small states make the fixed per-version rows weigh more); a
no-change refresh adds only its rows: nothing to the pieces, lists or lifecycles, and at most 2 KiB
in all (its state_versions row and the two lock_events rows of its commit's lock, with indexes).

Measured on the 2-core dev machine (full size): before migration 0014 (a whole copy per version)
one state took 758 KiB and every refresh added 111 KiB (14.6%), a backend POST 104 KiB, a no-change
refresh 99 KiB; with pieces one state takes 1,205 KiB (its pieces are not compressed as one big
TOASTed document was), a refresh adds 22 KiB (1.8%: lifecycle rows 7.9, pieces 4.7, the id list
4.3, drift records 3.0), a POST 15 KiB (1.2%), a no-change refresh 1.2 KiB (lock events, its row).
Then observations (what `kl refresh` records without moving Terraform's serial, migration 0022):
ROUNDS with 1% of the objects found different (gate as for a refresh commit), NO_CHANGE_ROUNDS
that read again what the latest observation holds (a drift nobody fixed: a row sharing its document
and its observed objects copied, nothing else stored, and at most GATE_REPEAT_WAL of the WAL an
observation of a 1% change writes, measured in the same run: sending the document again through
temporary tables wrote ~60 KiB of catalog WAL a time), and NO_CHANGE_ROUNDS that
confirm the state unchanged, each at most 1 KiB (its state_versions row alone: no document, no
lock). The WAL of each observation step is reported beside its growth.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
from typing import Any

import psycopg

from kilolock import tfstate
from kilolock.refresh.commit import commit_refresh, record_observation
from kilolock.server import store_ops
from kilolock.store import states, versions, writes

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
STATES = 4 if QUICK else 20
INSTANCES = 200 if QUICK else 1_000
ROUNDS = 10 if QUICK else 50
POST_ROUNDS = 5 if QUICK else 10
NO_CHANGE_ROUNDS = 10 if QUICK else 20
CHANGE_SHARE = 0.01
GATE_CHANGE = 0.06 if QUICK else 0.05
GATE_NO_CHANGE_BYTES = 2048
GATE_CONFIRMATION_BYTES = 1024
GATE_REPEAT_WAL = 0.25
STORED_CONTENT = ("version_pieces", "version_lists", "resources")

_NULL = 'provider["registry.terraform.io/hashicorp/null"]'


def _instance(name: str, n: int, generation: int) -> dict[str, Any]:
    # Roughly what `terraform apply` writes for a null_resource with a few triggers, one of them a
    # digest (real states are full of ids and hashes that compress no better than these).
    digest = hashlib.sha256(f"{name}/{generation}".encode()).hexdigest()
    return {"schema_version": 0,
            "attributes": {"id": f"{7_000_000_000_000_000_000 + n * 7919 + generation}",
                           "triggers": {"name": name, "revision": str(generation), "zone": f"eu-west-{n % 3}",
                                        "owner": "team-platform", "checksum": digest}},
            "sensitive_attributes": [], "private": "bnVsbA==",
            "dependencies": [f"null_resource.r{max(n - 1, 0)}"] if n else []}


def _document(state: int, serial: int, generations: list[int]) -> dict[str, Any]:
    return {"version": 4, "terraform_version": "1.8.5", "serial": serial, "lineage": f"lineage-{state}",
            "outputs": {"count": {"value": len(generations), "type": "number"}},
            "resources": [{"mode": "managed", "type": "null_resource", "name": f"r{n}", "provider": _NULL,
                           "instances": [_instance(f"s{state}-r{n}", n, g)]}
                          for n, g in enumerate(generations)],
            "check_results": None}


def _table_bytes(conn: psycopg.Connection) -> dict[str, int]:
    """pg_total_relation_size (heap, TOAST, indexes) of each of kl's tables, after VACUUM."""
    conn.execute("VACUUM")
    return {name: int(size) for name, size in conn.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'").fetchall()}


def _wal_lsn(conn: psycopg.Connection) -> str:
    return str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]


def _wal_since(conn: psycopg.Connection, lsn: str) -> int:
    return int(conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (lsn,)).fetchone()[0])  # type: ignore[index]


def _growth(before: dict[str, int], after: dict[str, int], writes: int) -> str:
    """The tables that grew, largest first, in bytes per write."""
    grew = sorted(((after[t] - before.get(t, 0)) / writes, t) for t in after if after[t] > before.get(t, 0))
    return ", ".join(f"{t} {b / 1024:.1f}" for b, t in reversed(grew))


class _Fleet:
    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.generations = [[0] * INSTANCES for _ in range(STATES)]
        self.serials = [1] * STATES
        self.observed: list[tuple[list[int], set[tuple[str, str]]]] = [([], set())] * STATES
        self.rng = random.Random(13)

    def name(self, s: int) -> str:
        return f"fleet/s{s:02d}"

    def raw(self, s: int) -> bytes:
        return json.dumps(_document(s, self.serials[s], self.generations[s]), separators=(",", ":")).encode()

    def change(self, s: int) -> set[tuple[str, str]]:
        picked = self.rng.sample(range(INSTANCES), max(1, round(INSTANCES * CHANGE_SHARE)))
        for n in picked:
            self.generations[s][n] += 1
        self.serials[s] += 1
        return {(f"null_resource.r{n}", "") for n in picked}

    def import_all(self) -> None:
        for s in range(STATES):
            raw = self.raw(s)
            writes.store_document(self.conn, self.name(s), tfstate.parse_state(raw, keep_objects=False), raw,
                                   source="import", actor="bench")

    def refresh(self, s: int, changed: bool) -> None:
        """A refresh commit as the orchestrator makes it: the document parsed exactly, serial+1,
        the changed objects in place, and the touched set naming them."""
        sid = states.state_id(self.conn, self.name(s))
        start = versions.current_version(self.conn, sid)
        assert start is not None
        touched = self.change(s) if changed else set()
        if not changed:
            self.serials[s] += 1
        parser = tfstate.ExactJSON()
        state = tfstate.parse_state(parser.loads(self.raw(s)))
        commit_refresh(self.conn, self.name(s), sid, state, parser, start, "bench", None, touched)

    def observe(self, s: int, changed: bool) -> None:
        """A refresh's observation as the orchestrator records it: Terraform's serial kept, the
        objects found different in place (not kept here: Terraform's state does not change)."""
        sid = states.state_id(self.conn, self.name(s))
        base = versions.current_version(self.conn, sid)
        assert base is not None
        generations = list(self.generations[s])
        touched: set[tuple[str, str]] = set()
        if changed:
            for n in self.rng.sample(range(INSTANCES), max(1, round(INSTANCES * CHANGE_SHARE))):
                generations[n] += 1
                touched.add((f"null_resource.r{n}", ""))
        self.observed[s] = (generations, touched)
        self._record(s, sid, base, generations, touched, same_as_base=not changed)

    def observe_again(self, s: int) -> None:
        """A refresh that reads what the latest observation of the state holds."""
        sid = states.state_id(self.conn, self.name(s))
        base = versions.current_version(self.conn, sid)
        assert base is not None
        generations, touched = self.observed[s]
        self._record(s, sid, base, generations, touched, same_as_base=False)

    def _record(self, s: int, sid: str, base: versions.VersionRow, generations: list[int],
                touched: set[tuple[str, str]], *, same_as_base: bool) -> writes.Observation:
        parser = tfstate.ExactJSON()
        raw = json.dumps(_document(s, self.serials[s], generations), separators=(",", ":"))
        return record_observation(self.conn, self.name(s), sid, tfstate.parse_state(parser.loads(raw)), parser, base,
                                  "bench", None, touched, same_as_base=same_as_base)

    def post(self, s: int) -> None:
        self.change(s)
        store_ops.write_state(self.conn, self.name(s), self.raw(s), None, "bench")


def test_storage_grows_with_change(bench_db: str, bench_summary: list[str]) -> None:
    with psycopg.connect(bench_db, autocommit=True) as conn:
        fleet = _Fleet(conn)
        sizes = [_table_bytes(conn)]
        fleet.import_all()
        sizes.append(_table_bytes(conn))
        doc_size = sum(len(fleet.raw(s)) for s in range(STATES)) / STATES

        for _ in range(ROUNDS):
            for s in range(STATES):
                fleet.refresh(s, changed=True)
        sizes.append(_table_bytes(conn))

        for _ in range(POST_ROUNDS):
            for s in range(STATES):
                fleet.post(s)
        sizes.append(_table_bytes(conn))

        for _ in range(NO_CHANGE_ROUNDS):
            for s in range(STATES):
                fleet.refresh(s, changed=False)
        sizes.append(_table_bytes(conn))

        wal = _wal_lsn(conn)
        for _ in range(ROUNDS):
            for s in range(STATES):
                fleet.observe(s, changed=True)
        wal_per_observation = _wal_since(conn, wal) / (STATES * ROUNDS)
        sizes.append(_table_bytes(conn))

        wal = _wal_lsn(conn)
        for _ in range(NO_CHANGE_ROUNDS):
            for s in range(STATES):
                fleet.observe_again(s)
        wal_per_repeat = _wal_since(conn, wal) / (STATES * NO_CHANGE_ROUNDS)
        sizes.append(_table_bytes(conn))

        wal = _wal_lsn(conn)
        for _ in range(NO_CHANGE_ROUNDS):
            for s in range(STATES):
                fleet.observe(s, changed=False)
        wal_per_confirmation = _wal_since(conn, wal) / (STATES * NO_CHANGE_ROUNDS)
        sizes.append(_table_bytes(conn))

        # Every version still reads back as written (the last of each state, whose text we hold).
        for s in range(STATES):
            assert json.loads(versions.raw_state_text(conn, fleet.name(s))) == json.loads(fleet.raw(s))

    total = [sum(s.values()) for s in sizes]
    state_size = (total[1] - total[0]) / STATES
    per_refresh = (total[2] - total[1]) / (STATES * ROUNDS)
    per_post = (total[3] - total[2]) / (STATES * POST_ROUNDS)
    per_no_change = (total[4] - total[3]) / (STATES * NO_CHANGE_ROUNDS)
    per_observation = (total[5] - total[4]) / (STATES * ROUNDS)
    per_repeat = (total[6] - total[5]) / (STATES * NO_CHANGE_ROUNDS)
    # What the tables that grew added: confirmations resolve drift the observations before them
    # opened, and VACUUM then shrinks tables that are not theirs.
    per_confirmation = sum(max(0, sizes[7][t] - sizes[6].get(t, 0)) for t in sizes[7]) / (STATES * NO_CHANGE_ROUNDS)
    bench_summary.append(
        f"storage growth ({STATES} states x {INSTANCES} instances, {CHANGE_SHARE:.0%} changed per write): one state "
        f"{state_size / 1024:.0f} KiB in the database ({doc_size / 1024:.0f} KiB of JSON); per refresh commit "
        f"{per_refresh / 1024:.1f} KiB = {per_refresh / state_size:.1%} of a state ({ROUNDS} rounds, gate {GATE_CHANGE:.0%}); "
        f"per backend POST {per_post / 1024:.1f} KiB = {per_post / state_size:.1%}; per no-change refresh "
        f"{per_no_change:.0f} B (gate {GATE_NO_CHANGE_BYTES} B); per observation of a 1% change "
        f"{per_observation / 1024:.1f} KiB = {per_observation / state_size:.1%} and {wal_per_observation / 1024:.1f} KiB "
        f"of WAL; per read repeating the latest observation {per_repeat:.0f} B and {wal_per_repeat:.0f} B of WAL = "
        f"{wal_per_repeat / wal_per_observation:.2f}x an observation's (gate {GATE_REPEAT_WAL}x); per observation "
        f"of no change {per_confirmation:.0f} B (gate {GATE_CONFIRMATION_BYTES} B) and {wal_per_confirmation:.0f} B of WAL")
    for label, (a, b, count) in {"import": (0, 1, STATES), "refresh": (1, 2, STATES * ROUNDS),
                                  "POST": (2, 3, STATES * POST_ROUNDS), "no-change refresh": (3, 4, STATES * NO_CHANGE_ROUNDS),
                                  "observation": (4, 5, STATES * ROUNDS),
                                  "repeated observation": (5, 6, STATES * NO_CHANGE_ROUNDS),
                                  "no-change observation": (6, 7, STATES * NO_CHANGE_ROUNDS)}.items():
        bench_summary.append(f"  KiB per {label}: {_growth(sizes[a], sizes[b], count)}")
    assert per_refresh <= GATE_CHANGE * state_size, f"a 1% refresh adds {per_refresh / state_size:.1%} of a state"
    assert per_post <= GATE_CHANGE * state_size, f"a 1% backend POST adds {per_post / state_size:.1%} of a state"
    assert per_no_change <= GATE_NO_CHANGE_BYTES, f"a no-change refresh adds {per_no_change:.0f} B"
    grew = {t: sizes[4][t] - sizes[3][t] for t in STORED_CONTENT if sizes[4][t] != sizes[3][t]}
    assert not grew, f"no-change refreshes stored content: {grew} bytes"
    assert per_observation <= GATE_CHANGE * state_size, f"a 1% observation adds {per_observation / state_size:.1%} of a state"
    assert per_confirmation <= GATE_CONFIRMATION_BYTES, f"an observation of no change adds {per_confirmation:.0f} B"
    grew = {t: sizes[6][t] - sizes[5][t] for t in sizes[6]
            if sizes[6][t] > sizes[5].get(t, 0) and t not in ("state_versions", "observed_objects")}
    assert not grew, f"reads repeating the latest observation stored more than their rows: {grew} bytes"
    assert wal_per_repeat <= GATE_REPEAT_WAL * wal_per_observation, \
        f"a read repeating the latest observation wrote {wal_per_repeat / wal_per_observation:.2f}x an observation's WAL"
