"""Drift records and metadata-blind lifecycles (issue 12): one record per drift while it stays open,
first detection fixed, resolution by apply, import, recreation or a refresh reading it back; a
change of metadata alone (marks, provider address, schema version) neither reopens a lifecycle nor
is drift; `kl status` counts exactly what `kl drift` lists."""
from __future__ import annotations

import json
from typing import Any

from kilolock import drift as drift_model
from kilolock import tfstate
from kilolock.store import drift as drift_store
from kilolock.store import states, summary, writes
from kit.states import NULL_PROVIDER

MARK = [[{"type": "get_attr", "value": "secret"}]]


def state(serial: int, objects: dict[str, Any], *, marks: dict[str, list] | None = None, provider: str = NULL_PROVIDER,
          schema_version: int = 0) -> bytes:
    marks = marks or {}
    return json.dumps({"version": 4, "terraform_version": "1.0.3", "serial": serial, "lineage": "l", "outputs": {}, "resources": [
        {"mode": "managed", "type": "null_resource", "name": name, "provider": provider,
         "instances": [{"schema_version": schema_version, "attributes": attrs, "sensitive_attributes": marks.get(name, [])}]}
        for name, attrs in objects.items()]}).encode()


def write(conn, raw: bytes, source: str):
    return writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source=source, actor="t")


def lifecycles(conn) -> list[tuple]:
    return conn.execute("SELECT address, create_serial, delete_serial FROM resources ORDER BY address, create_serial").fetchall()


def records(conn) -> list[tuple]:
    return conn.execute(
        """SELECT address, kind, first_detected_serial, detected_serial, resolved_serial, resolved_how, changed_attributes
           FROM drift_records ORDER BY address, first_detected_serial""").fetchall()


def doc(conn, include_resolved: bool = False) -> dict:
    rows = drift_store.list_drift(conn, "prod", include_resolved=include_resolved)
    open_count = drift_store.count_drift(conn, "prod")
    total = drift_store.count_drift(conn, "prod", include_resolved=True) if include_resolved else open_count
    return drift_model.document("prod", rows, total=total, open_count=open_count,
                                 ignored_count=drift_store.count_ignored(conn, "prod"),
                                 include_resolved=include_resolved)


A, B = {"id": "a", "secret": "s", "triggers": {"k": "1"}}, {"id": "b", "secret": "t", "triggers": None}


def test_new_sensitivity_marks_alone_keep_the_lifecycle_and_are_no_drift(conn):
    write(conn, state(1, {"a": A, "b": B}), "import")
    res = write(conn, state(2, {"a": A, "b": B}, marks={"a": MARK, "b": MARK}), "refresh")
    assert (res.opened, res.closed, res.unchanged, res.metadata_updated) == (0, 0, 2, 2)
    assert lifecycles(conn) == [("null_resource.a", 1, None), ("null_resource.b", 1, None)]
    # the open row follows the metadata, in place; the version keeps it exactly
    assert [r[0] for r in conn.execute("SELECT sensitive_attributes FROM resources")] == [MARK, MARK]
    assert records(conn) == [] and doc(conn)["drift"] == [] and summary.state_status(conn, "prod")["open_drift"] == 0


def test_provider_address_rewrite_and_schema_upgrade_without_value_change_keep_the_lifecycle(conn):
    # Terraform 0.13's legacy address (namespace "-"), rewritten to its modern form by a later apply
    legacy, modern = 'provider["registry.terraform.io/-/null"]', 'provider["registry.terraform.io/hashicorp/null"]'
    write(conn, state(1, {"a": A}, provider=legacy), "apply")
    write(conn, state(2, {"a": A}, provider=modern), "apply")
    write(conn, state(3, {"a": A}, provider=modern, schema_version=1), "refresh")
    assert lifecycles(conn) == [("null_resource.a", 1, None)]
    assert conn.execute("SELECT provider, schema_version FROM resources").fetchone() == (modern, 1)
    assert records(conn) == []


def test_the_issue_scenario_marks_then_one_deletion_is_one_record(conn):
    # import, a refresh that adds marks only, then an out-of-band deletion seen by two refreshes:
    # 0006 listed it twice ("deleted at v2" and "deleted at v3") and status said 3 for 2 drifts.
    write(conn, state(1, {"a": A, "b": B, "c": {"id": "c", "secret": "u"}}), "import")
    write(conn, state(2, {"a": A, "b": B, "c": {"id": "c", "secret": "u"}}, marks={"a": MARK, "b": MARK, "c": MARK}), "refresh")
    write(conn, state(3, {"b": B, "c": {"id": "c2", "secret": "u"}}, marks={"b": MARK, "c": MARK}), "refresh")
    write(conn, state(4, {"b": B, "c": {"id": "c2", "secret": "u"}}, marks={"b": MARK, "c": MARK}), "refresh")
    assert records(conn) == [("null_resource.a", "deleted", 3, 3, None, None, None),
                             ("null_resource.c", "changed", 3, 3, None, None, ["id"])]
    d = doc(conn)
    assert [(e["address"], e["kind"], e["detected_serial"], e["first_detected"]["serial"], e["last_confirmed_serial"], e["status"])
            for e in d["drift"]] == [("null_resource.a", "deleted", 3, 3, 4, "open"), ("null_resource.c", "changed", 3, 3, 4, "open")]
    assert d["drift"][1]["changes"] == [{"path": "id", "before": "c", "after": "c2"}]
    assert d["total"] == d["open"] == summary.state_status(conn, "prod")["open_drift"] == 2
    # the deleted branch never reports the lifecycle as it was before the (metadata-only) refresh
    assert lifecycles(conn)[0] == ("null_resource.a", 1, 3)


def test_a_drift_stays_one_record_while_open_first_detection_fixed(conn):
    write(conn, state(1, {"a": A, "b": B}), "apply")
    v2 = write(conn, state(2, {"a": {**A, "triggers": {"k": "2"}}, "b": B}), "refresh").version
    write(conn, state(3, {"a": {**A, "triggers": {"k": "3"}}, "b": B}), "refresh")
    write(conn, state(4, {"a": {**A, "triggers": {"k": "3"}}, "b": B}), "refresh")
    assert records(conn) == [("null_resource.a", "changed", 2, 3, None, None, ["triggers"])]
    [e] = doc(conn)["drift"]
    assert e["first_detected"] == {"serial": 2, "version": "v2", "at": v2.created_at} and e["last_confirmed_serial"] == 4
    assert (e["detected_version"], e["last_confirmed_version"]) == ("v3", None)  # refresh versions of old: no observation
    # measured against what the apply wrote, not against the previous refresh
    assert e["changes"] == [{"path": 'triggers["k"]', "before": "1", "after": "3"}]
    assert e["changes"] and e["open_for_s"] >= 0 and e["resolved"] is None
    # then it is deleted: still the same record, now `deleted`
    write(conn, state(5, {"b": B}), "refresh")
    assert records(conn) == [("null_resource.a", "deleted", 2, 5, None, None, None)]


def test_a_refresh_reading_the_object_back_resolves_it(conn):
    write(conn, state(1, {"a": A}), "apply")
    write(conn, state(2, {"a": {**A, "id": "x"}}), "refresh")
    # read back equal to what the apply wrote, with new marks besides: resolved, by refresh
    write(conn, state(3, {"a": A}, marks={"a": MARK}), "refresh")
    assert records(conn) == [("null_resource.a", "changed", 2, 2, 3, "refresh", ["id"])]
    assert doc(conn)["drift"] == [] and summary.state_status(conn, "prod")["open_drift"] == 0
    [e] = doc(conn, include_resolved=True)["drift"]
    assert (e["status"], e["resolved"]["serial"], e["resolved"]["how"]) == ("resolved", 3, "refresh")
    assert e["changes"] == [{"path": "id", "before": "a", "after": "x"}]  # what the drift was
    # drifting again later is a new record
    write(conn, state(4, {"a": {**A, "id": "y"}}), "refresh")
    assert [r[:5] for r in records(conn)] == [("null_resource.a", "changed", 2, 2, 3), ("null_resource.a", "changed", 4, 4, None)]


def test_apply_import_and_recreation_resolve(conn):
    write(conn, state(1, {"a": A, "b": B}), "apply")
    write(conn, state(2, {"a": {**A, "id": "x"}}), "refresh")  # a changed, b deleted
    write(conn, state(3, {"a": {**A, "id": "x"}, "b": B}), "apply")  # Terraform recreated b
    assert [(r[0], r[4], r[5]) for r in records(conn)] == [("null_resource.a", 3, "apply"), ("null_resource.b", 3, "recreated")]
    write(conn, state(4, {"a": {**A, "id": "x"}}), "refresh")  # b gone again
    write(conn, state(5, {"a": {**A, "id": "x"}}), "import")  # and dropped from the configuration
    assert [(r[0], r[2], r[4], r[5]) for r in records(conn)][-1] == ("null_resource.b", 4, 5, "import")
    assert drift_store.count_drift(conn, "prod") == 0 and drift_store.count_drift(conn, "prod", include_resolved=True) == 3
    all_doc = doc(conn, include_resolved=True)
    assert (all_doc["total"], all_doc["open"], all_doc["all"]) == (3, 0, True)
    assert [e["resolved"]["serial"] for e in all_doc["drift"]] == [5, 3, 3]  # latest resolution first


def test_an_encrypted_apply_resolves_too(conn):
    write(conn, state(1, {"a": A}), "apply")
    write(conn, state(2, {}), "refresh")
    env = json.dumps({"meta": {}, "encrypted_data": "QUJD", "encryption_version": "v0"}).encode()
    writes.store_envelope(conn, "prod", env, None, source="apply", actor="t")
    assert records(conn) == [("null_resource.a", "deleted", 2, 2, 3, "apply", None)]


def test_deleting_the_state_deletes_its_records(conn):
    write(conn, state(1, {"a": A}), "apply")
    write(conn, state(2, {}), "refresh")
    with conn.transaction():
        states.delete_state(conn, states.state_id(conn, "prod"))
    assert records(conn) == []


def test_kl_drift_table_all_and_status_agree(conn, run_kl):
    write(conn, state(1, {"a": A, "b": B}), "apply")
    write(conn, state(2, {"a": {**A, "id": "x"}}, marks={"a": MARK}), "refresh")  # a changed, b deleted
    write(conn, state(3, {"a": A}), "refresh")  # a read back
    text = run_kl("drift", "prod").stdout.decode()
    assert text.startswith("null_resource.b: deleted at v2 (first detected v2, ") and ", open " in text
    assert "null_resource.a" not in text and "the object no longer exists" in text
    text = run_kl("drift", "prod", "--all").stdout.decode()
    assert "null_resource.a: changed at v2 (first detected v2, " in text and "resolved at v3 by refresh" in text
    assert "  id: \"a\" → \"x\"" in text and "  secret: (sensitive) → (sensitive)" not in text  # secret did not change
    listed = json.loads(run_kl("drift", "prod", "--format", "json").stdout)
    status = json.loads(run_kl("status", "prod", "--format", "json").stdout)
    assert status["open_drift"] == listed["total"] == len(listed["drift"]) == 1
    assert status["open_drift_first_serial"] == 2 and status["open_drift_oldest_s"] >= 0
    assert "open drift:   1 (oldest first detected v2, open " in run_kl("status", "prod").stdout.decode()
    r = run_kl("drift", "nope", "--all")
    assert r.returncode == 1 and r.stderr.decode().startswith("kl: no state named 'nope'") and r.stderr.count(b"\n") == 1


def test_the_api_serves_the_same_document(conn):
    from kilolock.server import api

    write(conn, state(1, {"a": A}), "apply")
    write(conn, state(2, {"a": {**A, "secret": "changed"}}, marks={"a": MARK}), "refresh")
    body = json.loads(api.drift_report(conn, "prod").body)
    [e] = body["drift"]
    assert (body["total"], body["open"], e["kind"], e["first_detected"]["serial"], e["changed_attributes"]) == (1, 1, "changed", 2, ["secret"])
    assert e["changes"] == [{"path": "secret", "before": "(sensitive)", "after": "(sensitive)"}]
    assert api.drift_report(conn, "nope").status == 404
    write(conn, state(3, {"a": A}, marks={"a": MARK}), "apply")
    assert json.loads(api.drift_report(conn, "prod").body)["drift"] == []
    body = json.loads(api.drift_report(conn, "prod", include_resolved=True).body)
    assert (body["total"], body["open"], body["drift"][0]["resolved"]["how"]) == (1, 0, "apply")


def test_scoped_refresh_commits_keep_the_same_drift_records_as_a_full_reindex(conn, db_url):
    # The refresh commit indexes only the objects it touched; a replay of every version through the
    # full index must give the same lifecycles and the same drift records.
    from kit.invariants import reindex_mismatches

    write(conn, state(1, {"a": A, "b": B, "c": {"id": "c"}}), "apply")
    steps = [({"a": {**A, "id": "x"}, "b": B, "c": {"id": "c"}}, {"a": MARK}, {("null_resource.a", "")}),
             ({"a": {**A, "id": "y"}, "c": {"id": "c"}}, {"a": MARK, "c": MARK}, {("null_resource.a", ""), ("null_resource.b", ""), ("null_resource.c", "")}),
             ({"a": A, "c": {"id": "c"}}, {"a": MARK, "c": MARK}, {("null_resource.a", "")})]
    for serial, (objects, marks, touched) in enumerate(steps, start=2):
        raw = state(serial, objects, marks=marks)
        writes.commit_delta(conn, "prod", tfstate.parse_state(raw), raw, expect_serial=serial - 1, expect_lineage="l",
                            touched=touched, actor="t")
    assert records(conn) == [("null_resource.a", "changed", 2, 3, 4, "refresh", ["id"]),
                             ("null_resource.b", "deleted", 3, 3, None, None, None)]
    assert reindex_mismatches(db_url, "prod") == []
    conn.execute("UPDATE drift_records SET first_detected_serial = 3 WHERE address = 'null_resource.a'")
    assert any("drift records differ" in p for p in reindex_mismatches(db_url, "prod"))
