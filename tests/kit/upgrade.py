"""Upgrade fixtures: a database as a released kl left it, frozen as data, and what it pulled to.

A fixture for schema NNNN (the last migration of a release) is two files in fixtures/:

- ``schema-NNNN.sql``: the rows of every table, one ``INSERT … jsonb_populate_recordset`` per
  table in foreign-key order, to be loaded on top of migrations 0001…NNNN (applied by the real
  runner, so schema_migrations holds their real checksums). jsonb's own text is written verbatim,
  so numbers, key order inside jsonb and unicode come back exactly.
- ``schema-NNNN.json``: what that kl said about it: the row count of every table and view, the
  sha256 of ``kl state pull --serial N`` for every plain version and of the backend's GET body for
  every state's current version, and the held locks.

Run ``PYTHONPATH=.:tests python -m kit.upgrade`` after adding migration NNNN (and the code that uses
it) to write the fixture for the new head schema with the code of that time; extend ``populate`` so
that the new tables and columns hold data. ``PYTHONPATH=/path/to/checkout:tests`` makes it import
kilolock from another checkout (the released one) instead of this one. A fixture is never regenerated afterwards: the code
that made it is gone by the time it matters. tests/store/test_upgrade.py loads each one and
migrates it with the current code.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "store" / "fixtures"
STATES = REPO / "tests" / "fixtures" / "states"

# Dollar-quoting tag around the JSON in the .sql files: no escaping, so the file stays readable.
_TAG = "$rows$"

_NULL = 'provider["registry.terraform.io/hashicorp/null"]'


def released_migrations(upto: str) -> list[Any]:
    """The bundled migrations a release whose last migration is ``upto`` (e.g. "0006") had."""
    from kilolock.store.migrate import bundled_migrations

    released = [m for m in bundled_migrations() if m.name[:4] <= upto]
    if not released or not released[-1].name.startswith(upto):
        raise AssertionError(f"no bundled migration {upto}_*.sql: the fixture's schema is not a released one")
    return released


def tables_in_load_order(conn: psycopg.Connection) -> list[str]:
    """The public base tables (schema_migrations aside), every table after those it references."""
    names = [r[0] for r in conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname <> 'schema_migrations' ORDER BY c.relname"
    ).fetchall()]
    refs: dict[str, set[str]] = {n: set() for n in names}
    for child, parent in conn.execute(
        "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint WHERE contype = 'f'"
    ).fetchall():
        if child in refs and parent != child:
            refs[child].add(parent)
    ordered: list[str] = []
    while len(ordered) < len(names):
        ready = [n for n in names if n not in ordered and refs[n] <= set(ordered)]
        if not ready:
            raise AssertionError(f"foreign keys form a cycle among {sorted(set(names) - set(ordered))}")
        ordered.extend(ready)
    return ordered


def counted_relations(conn: psycopg.Connection) -> list[str]:
    """Every table and view whose row count an upgrade must keep."""
    views = [r[0] for r in conn.execute(
        "SELECT table_name FROM information_schema.views WHERE table_schema = 'public' ORDER BY table_name").fetchall()]
    return tables_in_load_order(conn) + views


def row_counts(conn: psycopg.Connection, relations: list[str]) -> dict[str, int]:
    out = {}
    for rel in relations:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(rel))).fetchone()
        out[rel] = int(row[0]) if row else 0
    return out


def dump(conn: psycopg.Connection) -> str:
    parts = [("-- Rows of a kl database; load on top of the migrations named by this file's schema number.\n"
              "-- Written by tests/kit/upgrade.py; never edit or regenerate (see its docstring).\n")]
    for table in tables_in_load_order(conn):
        rows = [r[0] for r in conn.execute(
            sql.SQL("SELECT to_jsonb(t)::text FROM {} t ORDER BY ctid").format(sql.Identifier(table))).fetchall()]
        if not rows:
            continue
        if any(_TAG in r for r in rows):
            raise AssertionError(f"a row of {table} contains {_TAG}; pick another dollar-quoting tag")
        body = ",\n".join(rows)
        parts.append(f"\nINSERT INTO {table} SELECT * FROM jsonb_populate_recordset(NULL::{table}, {_TAG}[\n{body}\n]{_TAG});\n")
    return "".join(parts)


def load(conn: psycopg.Connection, fixture_sql: str) -> None:
    with conn.transaction():
        conn.execute(fixture_sql.encode())
        # The rows came with their ids: identity columns go on after the highest, as they would
        # have in the database the fixture froze (a later write must not collide with them).
        for table, column in conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public' AND is_identity = 'YES'"
        ).fetchall():
            conn.execute(sql.SQL("SELECT setval(pg_get_serial_sequence({t}, {c}), max({col})) FROM {tbl} HAVING count(*) > 0").format(
                t=sql.Literal(table), c=sql.Literal(column), col=sql.Identifier(column), tbl=sql.Identifier(table)))


def digest(data: bytes) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def cli_pull(state: str, serial: int) -> bytes:
    """`kl state pull STATE --serial SERIAL`, in-process (KL_DATABASE_URL names the database)."""
    from kilolock import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["state", "pull", state, "--serial", str(serial)])
    if code != 0:
        raise AssertionError(f"kl state pull {state} --serial {serial} failed ({code}): {err.getvalue().strip()}")
    return out.getvalue().encode("utf-8")


def backend_get(conn: psycopg.Connection, state: str) -> bytes:
    """The body Terraform's GET /states/STATE receives."""
    from kilolock.server import backend

    resp = backend.get_state(conn, state)
    if resp.status != 200:
        raise AssertionError(f"GET {state}: {resp.status} {resp.body!r}")
    return resp.body


def held_locks(conn: psycopg.Connection) -> dict[str, Any]:
    from kilolock.store import locks

    return locks.held(conn)


def describe(conn: psycopg.Connection) -> dict[str, Any]:
    """What kl says about the database: counts, pull digests, locks (the fixture's .json).

    Which versions exist is read with this schema's SQL (this runs only when the fixture is made);
    what they pull to goes through kl itself.
    """
    pulls = []
    listed = conn.execute(
        """SELECT s.name, v.serial, v.encrypted, v.serial = max(v.serial) OVER (PARTITION BY s.id) AS is_current
           FROM states s JOIN state_versions v ON v.state_id = s.id ORDER BY s.name, v.serial"""
    ).fetchall()
    for name, serial, encrypted, is_current in listed:
        if not encrypted:  # kl state pull refuses an encrypted version; the backend serves it
            pulls.append({"state": name, "serial": serial, "via": "kl state pull", **digest(cli_pull(name, serial))})
        if is_current:
            pulls.append({"state": name, "serial": serial, "via": "GET", **digest(backend_get(conn, name))})
    held: dict[str, Any] = dict(conn.execute("SELECT s.name, l.info FROM state_locks l JOIN states s ON s.id = l.state_id ORDER BY s.name").fetchall())
    return {"counts": row_counts(conn, counted_relations(conn)), "pulls": pulls, "locks": held}


# --- the data (the code of the time writes it) ----------------------------------------------------


def _precise_state(serial: int) -> bytes:
    # Written by hand: numbers that a float would round, unicode, a line separator, an empty key.
    template = """{"version": 4, "terraform_version": "1.5.7", "serial": SERIAL, "lineage": "precise-lineage",
 "outputs": {"big": {"value": 123456789012345678901234567890, "type": "number"},
             "tiny": {"value": 0.1000000000000000055511151231257827021181583404541015625, "type": "number"},
             "exp": {"value": 1.5e300, "type": "number"},
             "text": {"value": "naïve ✓ \\u2028 \\"quoted\\" \\\\ tab\\t", "type": "string", "sensitive": true}},
 "resources": [{"mode": "managed", "type": "null_resource", "name": "n", "provider": PROVIDER,
   "instances": [{"schema_version": 0, "attributes": {"id": "SERIAL", "triggers": {"": "empty key", "k": "ünï"}},
                  "sensitive_attributes": [], "private": "bnVsbA=="}]}]}
"""
    return template.replace("SERIAL", str(serial)).replace("PROVIDER", json.dumps(_NULL)).encode()


def populate(conn: psycopg.Connection) -> None:
    """Fill every table: states with plain, encrypted and refresh-made versions (so lifecycles and
    drift records, open and resolved), refresh runs in each end state, held and released locks, provider
    configs and schemas, per-state refresh settings (a fixed and an `auto` parallelism), drift ignore
    rules (one active, one expired), the requests in flight a run used, notification channels with
    the events and deliveries the writes below make (one delivered, one failed once, the rest
    pending), access tokens (one revoked), grants (of users, tokens, a client certificate and OIDC
    subjects) and audit rows, OIDC trusts, a lock with its principal,
    fleet-wide provider limits with a lease of slots, a run's heartbeat."""
    import kilolock
    from kilolock import globs, tfstate
    from kilolock import schema as sch
    from kilolock.server import store_ops
    from kilolock.store import (
        deliveries,
        ignore_rules,
        locks,
        notify,
        provider_configs,
        provider_schemas,
        refresh_runs,
        settings,
        states,
        versions,
        writes,
    )

    # Notification channels (0013) first: the writes below then make events and deliveries.
    notify.add_channel(conn, name="ops", format="json", webhook={"env": "OPS_HOOK"}, secret="fixture-hmac",
                       states_glob="**", states_regex=globs.sql_regex("**"), events=list(notify.EVENTS), failed_after=1,
                       ui_url="https://kl.example.com", created_by="fixture@cli")
    notify.add_channel(conn, name="chat", format="slack", webhook="https://hooks.example.com/T0/B0/x", secret=None,
                       states_glob="hist*", states_regex=globs.sql_regex("hist*"), events=["drift.new", "drift.resolved"],
                       failed_after=2, ui_url=None, created_by="fixture@cli")

    def import_file(name: str, raw: bytes, source: str) -> writes.WriteResult:
        return writes.store_document(conn, name, tfstate.parse_state(raw), raw, source=source, actor="fixture@cli")

    # prod: real Terraform states, then a refresh that changed one object and lost another.
    import_file("prod", (STATES / "varied.tfstate").read_bytes(), "import")
    v2 = import_file("prod", (STATES / "varied-v2.tfstate").read_bytes(), "apply").version
    parser = tfstate.ExactJSON()
    doc = parser.loads(versions.raw_state_text(conn, "prod"))
    doc["serial"] = v2.serial + 1
    for res in doc["resources"]:
        if res["mode"] == "managed" and res["name"] == "changing":
            res["instances"][0]["attributes"]["triggers"] = {"drifted": "yes"}
        if res["mode"] == "managed" and res["name"] == "many":
            res["instances"] = res["instances"][:2]
    raw = parser.dumps_compact(doc).encode()
    prod_id = states.state_id(conn, "prod")
    run_id = refresh_runs.begin(conn, prod_id, v2.id, "fixture@cli")
    info = locks.lock_info("OperationTypeRefresh", "fixture@cli", f"kl {kilolock.__version__}", info=refresh_runs.lock_note(run_id))
    locks.acquire(conn, prod_id, "prod", info, "fixture@cli")
    v3 = writes.commit_delta(conn, "prod", tfstate.parse_state(raw), raw, expect_serial=v2.serial,
                             expect_lineage=v2.lineage, touched=None, actor="fixture@cli").version
    locks.release(conn, prod_id, info["ID"], "fixture@cli")
    # The requests in flight it used (0011): one adaptive provider group that was throttled, one fixed.
    refresh_runs.finish(conn, run_id, status="succeeded", checked=24, changed=2, failed=0, error_summary=None,
                        to_version_id=v3.id, concurrency=[
                            {"provider": "registry.terraform.io/hashicorp/null", "alias": None, "mode": "auto", "start": 10,
                             "max": 57, "final": 52, "throttled": 3},
                            {"provider": "registry.terraform.io/hashicorp/null", "alias": "west", "mode": "fixed", "start": 4,
                             "max": 4, "final": 4, "throttled": 0}])
    failed = refresh_runs.begin(conn, prod_id, v3.id, "fixture@cli")
    refresh_runs.finish(conn, failed, status="failed", checked=3, changed=0, failed=1,
                        error_summary="null_resource.plain: provider exited", to_version_id=None)
    refresh_runs.begin(conn, prod_id, v3.id, "fixture@cli")  # left running: its process "died"

    # history (0007 on): drift records open and resolved in every way, and lifecycles whose
    # metadata alone changed (marks, the provider address, the schema version) in place.
    def history(serial: int, objects: dict[str, dict[str, Any]], marked: tuple[str, ...] = (), legacy: bool = False,
                schema_version: int = 0) -> bytes:
        provider = 'provider["registry.terraform.io/-/null"]' if legacy else _NULL
        return json.dumps({"version": 4, "terraform_version": "1.0.3", "serial": serial, "lineage": "history-lineage",
                           "outputs": {}, "resources": [
            {"mode": "managed", "type": "null_resource", "name": n, "provider": provider,
             "instances": [{"schema_version": schema_version, "attributes": attrs,
                            "sensitive_attributes": [[{"type": "get_attr", "value": "id"}]] if n in marked else []}]}
            for n, attrs in objects.items()]}).encode()

    a, b, c, d = ({"id": x, "triggers": {"k": x}} for x in "abcd")
    import_file("history", history(1, {"a": a, "b": b, "c": c, "d": d}, legacy=True), "import")
    import_file("history", history(2, {"a": a, "b": b, "c": c, "d": d}), "apply")  # provider address rewritten
    import_file("history", history(3, {"a": a, "b": b, "c": c, "d": d}, marked=("a", "b")), "refresh")  # marks only
    import_file("history", history(4, {"a": {**a, "id": "a2"}, "c": c, "d": d}, marked=("a",)), "refresh")  # a changed, b gone
    import_file("history", history(5, {"a": a, "c": c, "d": d}, marked=("a",)), "refresh")  # a read back: resolved
    import_file("history", history(6, {"a": a, "b": b, "c": c, "d": d}, marked=("a",), schema_version=1), "apply")  # b recreated
    import_file("history", history(7, {"a": a, "b": b, "d": {**d, "triggers": {"k": "d2"}}}, marked=("a",), schema_version=1),
                "refresh")  # c gone, d changed: left open
    # Ignore rules (0009): one hides d's open drift (a path rule); one expired, so hides nothing.
    ignore_rules.add_rule(conn, ignore_rules.NewRule("hist*", "null_resource.d", sch.path_parse('triggers["k"]'),
                                                     "fixture: rebuilt nightly"), "fixture@cli")
    if hasattr(sch, "drift_path_parse"):  # 0018: a rule on a set element (path_element)
        ignore_rules.add_rule(conn, ignore_rules.NewRule("hist*", "null_resource.*", sch.drift_path_parse('tags[="x"]'),
                                                         "fixture: a set element"), "fixture@cli")
    expired = ignore_rules.add_rule(conn, ignore_rules.NewRule("**", "**", None, None, 60.0), "fixture@cli")
    conn.execute("UPDATE drift_ignore_rules SET expires_at = created_at - interval '1 day' WHERE id = %s", (expired,))

    # precise: hand-written JSON whose bytes only survive if jsonb and the layout stay exact.
    import_file("precise", _precise_state(1), "import")
    import_file("precise", _precise_state(2), "apply")

    # tofu: a plain version, then OpenTofu-encrypted envelopes, through the HTTP backend's path.
    store_ops.write_state(conn, "tofu", _precise_state(7).replace(b"precise-lineage", b"tofu-lineage"), None, "alice")
    for data in ("QUJD", "REVG", "REVG"):  # the last one is a byte-identical retry: no new version
        env = json.dumps({"meta": {"key_provider.pbkdf2.k": "eyJzYWx0Ijoi"}, "encrypted_data": data,
                          "encryption_version": "v0"}).encode()
        store_ops.write_state(conn, "tofu", env, None, "alice")

    # Observations (0022), before prod is locked for an apply (an observation under such a lock finds
    # no drift): what refreshes read of prod without moving its serial: one that found an
    # object changed (its observed object and drift record), then one that found it as Terraform
    # has it again (no document of its own; the record resolved).
    if hasattr(writes, "record_observation"):
        base = versions.current_version(conn, prod_id)
        assert base is not None
        base_raw = versions.raw_state_text(conn, "prod")
        doc = parser.loads(base_raw)
        observed_state = tfstate.parse_state(doc)
        seen = next(i for i in observed_state.instances if i.mode == "managed" and isinstance(i.obj.get("attributes"), dict))
        seen.obj["attributes"]["triggers"] = {"observed": "drift"}
        observed_raw = parser.dumps_compact(doc)
        changed = writes.record_observation(conn, "prod", tfstate.parse_state(observed_raw), observed_raw, base=base,
                                            touched={(seen.address, seen.deposed)}, same_as_base=False, actor="fixture@cli")
        writes.record_observation(conn, "prod", tfstate.parse_state(base_raw), base_raw, base=base, touched=set(),
                                  same_as_base=True, actor="fixture@cli")
        assert changed.found == 1

    # The identity index (0024): objects with identities (Terraform >= 1.12) and one without, and an
    # observation that found one gone and gave the other its first identity.
    import importlib.util

    if importlib.util.find_spec("kilolock.store.identities") is not None:
        def identified(objects: dict[str, dict[str, Any]]) -> bytes:
            return json.dumps({"version": 4, "terraform_version": "1.12.2", "serial": 1, "lineage": "identified-lineage",
                               "outputs": {}, "resources": [
                {"mode": "managed", "type": "null_resource", "name": n, "provider": _NULL, "instances": [o]}
                for n, o in objects.items()]}).encode()

        def ident(id_: str, identity: dict[str, Any] | None) -> dict[str, Any]:
            o: dict[str, Any] = {"schema_version": 0, "attributes": {"id": id_, "triggers": None}, "sensitive_attributes": []}
            return o if identity is None else {**o, "identity": identity, "identity_schema_version": 0}

        import_file("identified", identified({"a": ident("1", {"id": "1"}), "b": ident("2", None)}), "import")
        ibase = versions.current_version(conn, states.state_id(conn, "identified"))
        assert ibase is not None
        iraw = identified({"b": ident("2", {"id": "2"})})
        writes.record_observation(conn, "identified", tfstate.parse_state(iraw), iraw, base=ibase,
                                  touched={("null_resource.a", ""), ("null_resource.b", "")}, same_as_base=False,
                                  actor="fixture@cli")
        # Another state claims a's object: a resource.duplicate announced (its notice, event and
        # deliveries), then no evaluation again (the kl processes of the upgrade test would stamp it).
        import_file("identified-copy", identified({"a": ident("1", {"id": "1"})}).replace(b"identified-lineage", b"copy"),
                    "import")
        assert notify.record_duplicate_events(conn) >= 1
        conn.execute("UPDATE notify_channels SET duplicates_checked_at = 'infinity' WHERE duplicates_checked_at IS NOT NULL")

    # Locks: a lock and unlock, a force-unlock, a lock still held, and a state that only a LOCK made.
    def lock_body(who: str) -> dict[str, Any]:
        return locks.lock_info("OperationTypeApply", who, "1.5.7")

    first = lock_body("bob@host")
    store_ops.lock(conn, "precise", first, "bob")
    store_ops.unlock(conn, "precise", first["ID"], "bob", forced=False)
    store_ops.lock(conn, "precise", lock_body("carol@host"), "carol")
    store_ops.force_unlock(conn, "precise", "admin")
    store_ops.lock(conn, "prod", lock_body("dave@host"), "dave")
    store_ops.lock(conn, "only-locked", lock_body("erin@host"), "token:erin-ci", "token:erin-ci")  # 0015: its principal

    # Access control (0015): a token (its hash only), grants of a user and a token, a revoked and
    # an expiring token, and the audit those changes and a refusal wrote.
    import hashlib

    from kilolock.store import access
    access.create_token(conn, "erin-ci", hashlib.sha256(b"klt_fixture-secret-erin").digest(), "write", "only-*", None, "ops@cli")
    access.create_token(conn, "old-ci", hashlib.sha256(b"klt_fixture-secret-old").digest(), "read", "**", 86400.0, "ops@cli")
    access.revoke_token(conn, "old-ci", "ops@cli")
    access.add_grant(conn, "user:alice", "read", "prod", "ops@cli")
    access.add_grant(conn, "token:erin-ci", "admin", "precise", "ops@cli")
    access.audit(conn, "user:alice", "refused", "POST /states/prod", "prod", "user:alice has only read on state 'prod'")

    # Client certificates and OIDC (0020, 0021): a certificate's grant, trusts (one by discovery
    # with a claim rule, one with a JWKS file), grants on sub globs, and a refused token's audit.
    import importlib.util

    if importlib.util.find_spec("kilolock.store.oidc_trusts") is not None:
        from kilolock.store import oidc_trusts

        access.add_grant(conn, "cert:CN=ci-runner", "write", "only-*", "ops@cli")
        oidc_trusts.add_trust(conn, oidc_trusts.Trust("github", "https://token.actions.githubusercontent.com", "kilolock",
                                                      None, {"repository_owner": "acme"}, 60.0, 3600.0), "ops@cli")
        oidc_trusts.add_trust(conn, oidc_trusts.Trust("local", "https://issuer.example", "kl", "/etc/kl/jwks.json", {},
                                                      30.0, 600.0), "ops@cli")
        access.add_grant(conn, "oidc:github:repo:acme/*:ref:refs/heads/main", "write", "prod", "ops@cli")
        access.add_grant(conn, "oidc:github:repo:acme/infra:**", "read", "**", "ops@cli")
        access.audit(conn, "oidc:github:?", "refused", "GET /states/prod", None,
                     "bearer token refused: bad signature (key 'k1' of trust github)")

    # Provider configuration: global, per state, pinned, with an env reference.
    provider_configs.upsert(conn, None, "registry.terraform.io/hashicorp/null", "", config={"region": "eu"})
    provider_configs.upsert(conn, prod_id, "registry.terraform.io/hashicorp/null", "",
                            config={"token": {"env": "NULL_TOKEN"}}, pinned_version="3.2.1")
    provider_configs.upsert(conn, None, "registry.terraform.io/hashicorp/null", "west", pinned_version="2.1.2")
    # Refresh settings (0008): one state with all of them, one with a setting set and then unset.
    settings.update(conn, prod_id, settings.Changes({"workdir": "/srv/terraform/prod", "provider_search_paths": ("/opt/kl/providers", "/usr/share/terraform/plugins"),
                                                     "provider_parallelism": 4, "actor": "cron@ops"}), "fixture@cli")
    precise_id = states.state_id(conn, "precise")
    settings.update(conn, precise_id, settings.Changes({"actor": "ci@ops", "workdir": "/tmp/precise",
                                                        "provider_parallelism": "auto"}), "fixture@cli")  # auto: 0011
    settings.update(conn, precise_id, settings.Changes(unset=("workdir",)), "fixture@cli")
    provider_schemas.put(conn, "registry.terraform.io/hashicorp/null", "2.1.2", sch.provider_schema_from_json({
        "protocol_version": 5,
        "provider": {"version": 0, "block": {}},
        "resource_schemas": {"null_resource": {"version": 0, "block": {"attributes": {
            "id": {"type": "string", "computed": True},
            "triggers": {"type": ["map", "string"], "optional": True}}}}},
        "data_source_schemas": {},
    }))
    # Two deliveries tried: one delivered, one failed once and waiting to retry.
    sent, refused = deliveries.claim(conn, "fixture-host:1", lease_s=60, limit=2)
    deliveries.finish_attempt(conn, sent["delivery_id"], "fixture-host:1", ok=True, http_status=200, error=None,
                          duration_ms=12, retry_for_s=3600, max_delay_s=300)
    deliveries.finish_attempt(conn, refused["delivery_id"], "fixture-host:1", ok=False, http_status=500,
                          error="HTTP 500 Internal Server Error", duration_ms=30, retry_for_s=3600, max_delay_s=300)
    # Never due: the kl processes that describe() and the upgrade test run would otherwise send them
    # (to nowhere), and the fixture's counts would depend on when and where it was made.
    conn.execute("UPDATE notify_deliveries SET next_attempt_at = 'infinity' WHERE status = 'pending'")

    # The fleet (0010): an every- and a paused cron schedule, a worker, jobs queued, running,
    # succeeded (linked to its refresh run) and failed.
    from datetime import datetime, timedelta, timezone

    from kilolock.store import fleet

    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    fleet.add_schedule(conn, "prod", every_s=3600.0, cron=None, jitter_s=60.0, first_run_at=start, actor="fixture@cli")
    paused = fleet.add_schedule(conn, "hist*", every_s=None, cron="0 */4 * * *", jitter_s=0.0, first_run_at=start,
                                actor="fixture@cli")
    fleet.set_paused(conn, paused, True)
    fleet.enqueue_due_schedules(conn, lambda sc, now: now + timedelta(hours=1))  # prod queued
    fleet.enqueue_now(conn, "prod")  # its jittered due time moved up to now
    worker, _ = fleet.register_worker(conn, "fixture-worker", 2, 60.0)
    done = fleet.claim(conn, worker, 1, 60.0)[0]
    fleet.finish_job(conn, done.id, worker, "succeeded", run_id, None)
    fleet.enqueue_now(conn, "**")  # prod, history, precise (tofu's current version is encrypted)
    claimed = fleet.claim(conn, worker, 2, 60.0)
    fleet.finish_job(conn, claimed[0].id, worker, "failed", None, "fixture: provider exited")

    # refresh.stale (0013): a channel that asks for it, and a streak it was told of. Its threshold
    # (a century) keeps the kl processes the upgrade test runs from finding prod stale again, and
    # its evaluation time ('infinity') from evaluating (and stamping) it at all.
    stale = notify.add_channel(conn, name="stale", format="json", webhook="https://hooks.example.com/stale",
                               secret=None, states_glob="prod", states_regex=globs.sql_regex("prod"),
                               events=["refresh.stale"], failed_after=1, ui_url=None, created_by="fixture@cli",
                               stale_after_s=100 * 365 * 86400.0)
    conn.execute("INSERT INTO notify_stale_notices (state_id, channel_id, last_ok_at, noticed_at) "
                 "VALUES (%s, %s, '-infinity', '2026-01-02T00:00:00Z')", (states.state_id(conn, "prod"), stale.id))
    conn.execute("UPDATE notify_channels SET stale_checked_at = 'infinity' WHERE id = %s", (stale.id,))

    # Fleet-wide provider limits (0016): one for the unaliased null provider, one for an alias, and
    # the slots a worker held of the first when the fixture was frozen.
    from kilolock.store import provider_limits

    provider_limits.set_limit(conn, "registry.terraform.io/hashicorp/null", "", 8, "fixture@cli")
    provider_limits.set_limit(conn, "registry.terraform.io/hashicorp/aws", "prod", 40, "fixture@cli")
    provider_limits.sync(conn, "registry.terraform.io/hashicorp/null", "", "fixture-host:1:abcd", 3, 1, 60.0)

    # Run heartbeats (0017): a run made behind a transaction pooler beat until it finished.
    conn.execute("UPDATE refresh_runs SET heartbeat_at = finished_at"
                 " WHERE id = (SELECT id FROM refresh_runs WHERE status = 'failed' ORDER BY started_at LIMIT 1)")

    # Discovery runs (0025): two of one scope (each notifies the unmanaged objects it found new),
    # with every kind of match, and one that failed.
    if importlib.util.find_spec("kilolock.store.discovery_runs") is not None:
        from kilolock.store import discovery_runs

        scope = discovery_runs.Scope("registry.terraform.io/hashicorp/null", "", "prod", "null_resource", {"prefix": "n-"})
        claim = {"state": "prod", "address": "null_resource.plain", "deposed": ""}
        twice = [claim, {"state": "history", "address": "null_resource.a", "deposed": ""}]
        first_run = discovery_runs.begin(conn, scope, None, "fixture@cli")
        discovery_runs.finish(conn, first_run, [discovery_runs.Found({"id": "n-1"}, "n-1", "unmanaged", [])], status="succeeded")
        second_run = discovery_runs.begin(conn, scope, 100, "fixture@cli")
        discovery_runs.finish(conn, second_run, [
            discovery_runs.Found({"id": "n-1"}, "n-1", "unmanaged", []),
            discovery_runs.Found({"id": "n-2", "region": None}, "", "unmanaged", []),
            discovery_runs.Found({"id": "plain"}, "plain", "managed", [claim]),
            discovery_runs.Found({"id": "a"}, "a", "managed twice", twice)], status="succeeded")
        failed_scope = discovery_runs.Scope("registry.terraform.io/hashicorp/aws", "west", None, "aws_s3_bucket", {})
        failed_run = discovery_runs.begin(conn, failed_scope, None, "fixture@cli")
        discovery_runs.finish(conn, failed_run, [], status="failed", error="provider exited")
        # Their resource.unmanaged deliveries, never due as the others above.
        conn.execute("UPDATE notify_deliveries SET next_attempt_at = 'infinity' WHERE status = 'pending'")

    # Discovery by the fleet's workers (0026): a discover schedule, its job claimed by a worker and
    # linked to the discovery run it began, finished; and another firing of it still queued.
    if hasattr(fleet, "add_discovery_schedule"):
        from kilolock.store import discovery_runs

        spec: dict[str, Any] = {"source": "registry.terraform.io/hashicorp/null", "alias": "", "state": None, "type": "null_resource",
                "list_config": {}, "limit": None, "search_paths": ["/opt/kl/providers"]}
        disco = fleet.add_discovery_schedule(conn, spec, every_s=21600.0, cron=None, jitter_s=300.0, first_run_at=start,
                                             actor="fixture@cli")
        fleet.enqueue_due_schedules(conn, lambda sc, now: now + timedelta(hours=6))
        conn.execute("UPDATE fleet_jobs SET due_at = now() - interval '1 day' WHERE schedule_id = %s", (disco,))  # first claimed
        [job] = fleet.claim(conn, worker, 1, 60.0)
        assert job.kind == fleet.DISCOVER
        scope = discovery_runs.Scope(spec["source"], "", None, spec["type"], {})
        scheduled_run = discovery_runs.begin(conn, scope, None, "fixture-worker", fleet_job=job.id)
        discovery_runs.finish(conn, scheduled_run, [discovery_runs.Found({"id": "plain"}, "plain", "managed", [claim])],
                              status="succeeded")
        fleet.finish_job(conn, job.id, worker, "succeeded", None, None)
        conn.execute("UPDATE fleet_schedules SET next_run_at = now() WHERE id = %s", (disco,))
        fleet.enqueue_due_schedules(conn, lambda sc, now: now + timedelta(hours=6))


def main() -> int:
    """Write fixtures/schema-<head>.{sql,json} from a fresh database at the current head schema."""
    import tempfile

    from kilolock.store.embedded import EmbeddedCluster
    from kilolock.store.migrate import apply_migrations, bundled_migrations

    head = bundled_migrations()[-1].name[:4]
    out_sql, out_json = FIXTURES / f"schema-{head}.sql", FIXTURES / f"schema-{head}.json"
    if out_sql.exists() or out_json.exists():
        print(f"{out_sql.name} exists: fixtures are frozen once written; nothing done", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="kl-upgrade-fixture-") as tmp:
        os.chmod(tmp, 0o755)
        cluster = EmbeddedCluster(Path(tmp) / "pg")
        os.environ["KL_DATABASE_URL"] = cluster.ensure_running()
        try:
            with psycopg.connect(os.environ["KL_DATABASE_URL"], autocommit=True) as conn:
                apply_migrations(conn)
                populate(conn)
                FIXTURES.mkdir(exist_ok=True)
                out_sql.write_text(dump(conn), encoding="utf-8")
                out_json.write_text(json.dumps(describe(conn), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        finally:
            cluster.stop()
    print(f"wrote {out_sql.relative_to(REPO)} and {out_json.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
