"""Invariant checks shared by the database-fault, concurrency and chaos tests (and the chaos runner).

What must hold after any fault, checked against the database and the process table only:
- versions: Terraform's serials strictly increase, observations keep their base's, and every stored
  version parses as Terraform state;
- lifecycles: the `resources` rows, and the drift records, equal what a re-index of the stored
  versions from scratch gives (replayed through kl's own write path inside a transaction that is
  rolled back);
- audit: no refresh_runs row is left `running` by a finished process;
- locks: no state lock is left behind by a refresh;
- processes: no provider (or kl) process carrying our mark outlives the run (kit.procs).
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import psycopg

# What the lifecycle index holds, minus row ids: the same history gives the same rows.
_LIFECYCLE_COLS = ("address", "deposed", "mode", "type", "name", "module", "index_key", "provider", "schema_version",
                   "status", "attributes", "sensitive_attributes", "content_hash", "create_serial", "delete_serial")


def _lifecycle_rows(conn: psycopg.Connection, state_id: str) -> list[tuple]:
    cols = ", ".join(f"r.{c}" for c in _LIFECYCLE_COLS)
    # The version links must agree with the serials they stand for.
    return conn.execute(
        f"""SELECT {cols}, o.serial = r.create_serial, (c.serial IS NOT DISTINCT FROM r.delete_serial)
            FROM resources r JOIN state_versions o ON o.id = r.opened_by_version_id
            LEFT JOIN state_versions c ON c.id = r.closed_by_version_id
            WHERE r.state_id = %s ORDER BY r.address, r.deposed, r.create_serial""",
        (state_id,),
    ).fetchall()


# What a drift record holds, minus ids: the same history gives the same records. Only the records
# Terraform's versions alone found, followed and resolved (a commit's closed lifecycles, an apply):
# drift an observation found, saw again or read back is the latest observation against its base,
# which a replay of Terraform's versions does not make.
_DRIFT_COLS = ("address", "deposed", "kind", "changed_attributes", "first_detected_serial", "detected_serial",
               "resolved_serial", "resolved_how")


def _drift_rows(conn: psycopg.Connection, state_id: str) -> list[tuple]:
    return conn.execute(
        f"""SELECT {", ".join(f"d.{c}" for c in _DRIFT_COLS)}, b.create_serial, cur.create_serial
            FROM drift_records d JOIN resources b ON b.id = d.baseline_resource_id
            LEFT JOIN resources cur ON cur.id = d.current_resource_id
            WHERE d.state_id = %s ORDER BY d.address, d.deposed, d.first_detected_serial""",
        (state_id,),
    ).fetchall()


def _observed_drift(conn: psycopg.Connection, state_id: str) -> set[tuple]:
    """(address, deposed, first detected serial) of the drift records an observation found, saw
    again or read back: what a replay of Terraform's versions cannot give (it gives such a record
    open, or none)."""
    return set(conn.execute(
        """SELECT d.address, d.deposed, d.first_detected_serial FROM drift_records d
           WHERE d.state_id = %s AND EXISTS (
               SELECT 1 FROM state_versions v
               WHERE v.id IN (d.first_detected_version_id, d.detected_version_id, d.resolved_version_id)
                 AND v.kind = 'observation')""",
        (state_id,),
    ).fetchall())


def reindex_mismatches(db_url: str, state: str) -> list[str]:
    """Differences between the stored lifecycle rows of STATE and a re-index from scratch: every
    stored version replayed in serial order into a scratch state by kl's own writes.store_document (the full,
    unscoped index), in a transaction that is rolled back. [] when they agree. Terraform's versions
    only: the lifecycle index is theirs, an observation changes none of it."""
    from kilolock import tfstate
    from kilolock.store import states, writes

    with psycopg.connect(db_url) as conn:  # not autocommit: everything below is one transaction
        sid = states.state_id(conn, state)
        stored = _lifecycle_rows(conn, sid)
        rows = conn.execute(
            "SELECT serial, source, actor, kl_version_document(id)::text, encrypted FROM state_versions"
            " WHERE state_id = %s AND kind = 'terraform' ORDER BY serial",
            (sid,),
        ).fetchall()
        scratch = f"kl-reindex-{uuid.uuid4().hex}"
        for serial, source, actor, text, encrypted in rows:
            if encrypted:
                continue
            writes.store_document(conn, scratch, tfstate.parse_state(text, origin=f"v{serial}"), text.encode(),
                                  source=source, actor=actor, force=True)
        rebuilt = _lifecycle_rows(conn, states.state_id(conn, scratch))
        observed = _observed_drift(conn, sid)
        drift_stored, drift_rebuilt = ([r for r in _drift_rows(conn, s) if (r[0], r[1], r[4]) not in observed]
                                       for s in (sid, states.state_id(conn, scratch)))
        conn.rollback()
    out = []
    stored_set, rebuilt_set = set(map(repr, stored)), set(map(repr, rebuilt))
    for r in stored:
        if repr(r) not in rebuilt_set:
            out.append(f"stored lifecycle row not in a re-index: {r[0]} create={r[13]} delete={r[14]} links_ok={r[-2:]}")
    for r in rebuilt:
        if repr(r) not in stored_set:
            out.append(f"re-index has a lifecycle row the store lacks: {r[0]} create={r[13]} delete={r[14]}")
    if drift_stored != drift_rebuilt:
        out.append(f"drift records differ from a re-index: stored {drift_stored}, re-indexed {drift_rebuilt}")
    return out


def version_problems(db_url: str, state: str) -> list[str]:
    """Terraform's serials strictly increasing (in the order written), every observation carrying
    its base's serial and lineage and numbered after the base's earlier ones, and every version
    parsing as a state (an observation without a document of its own, as its base's)."""
    from kilolock import tfstate

    out = []
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            """SELECT v.kind, v.serial, v.lineage, v.observation_number, b.serial, b.lineage, b.kind,
                      kl_version_document(kl_document_version(v.id))::text, v.encrypted
               FROM state_versions v JOIN states s ON s.id = v.state_id
               LEFT JOIN state_versions b ON b.id = v.base_version_id
               WHERE s.name = %s ORDER BY v.seq""",
            (state,),
        ).fetchall()
    last = None
    numbers: dict[int, int] = {}
    for kind, serial, lineage, number, base_serial, base_lineage, base_kind, text, encrypted in rows:
        name = f"v{serial}" if kind == "terraform" else f"v{serial}.{number}"
        if kind == "terraform":
            if last is not None and serial <= last:
                out.append(f"serial {serial} stored after serial {last}")
            last = serial
        else:
            if (base_kind, base_serial, base_lineage) != ("terraform", serial, lineage):
                out.append(f"{name} is based on {base_kind} v{base_serial} ({base_lineage}), not on its own serial and lineage")
            if number <= numbers.get(serial, 0):
                out.append(f"{name} recorded after v{serial}.{numbers[serial]}")
            numbers[serial] = number
        if encrypted:
            continue
        try:
            parsed = tfstate.parse_state(text, origin=name)
        except Exception as exc:  # noqa: BLE001 - any failure to parse is the finding
            out.append(f"{name} does not parse: {exc}")
            continue
        if parsed.serial != serial:
            out.append(f"{name} holds serial {parsed.serial}")
    return out


def running_runs(db_url: str) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT id, started_at FROM refresh_runs WHERE status = 'running' OR finished_at IS NULL").fetchall()


def state_locks(db_url: str) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT s.name, l.operation, l.who FROM state_locks l JOIN states s ON s.id = l.state_id").fetchall()


def kl_backends(db_url: str) -> list[int]:
    """Server pids of kl's own connections (application_name 'kilolock') to this database."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'kilolock'"
            " AND pid <> pg_backend_pid()")]


def terminate_kl_backends(db_url: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return sum(1 for (ok,) in conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'kilolock' AND pid <> pg_backend_pid()") if ok)


def wait_for(predicate, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def event_count(events: Path, name: str) -> int:
    return sum(1 for line in events.read_text().splitlines() if line == name)
