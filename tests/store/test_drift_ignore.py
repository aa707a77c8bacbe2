"""Drift ignore rules (issue 12, migrations 0009 and 0012): rules hide open drift records from open
drift (kl drift, kl status, exit codes, the API) without touching them, combining their paths;
--all shows them as ignored with the rules; expiry and removal bring them back. Matching is SQL
(the resource_drift view)."""
from __future__ import annotations

import json
from typing import Any

import pytest

from kilolock import drift as drift_model
from kilolock import schema as sch
from kilolock import tfstate
from kilolock.store import drift as drift_store
from kilolock.store import ignore_rules, summary, writes
from kit.states import NULL_PROVIDER


def state(serial: int, objects: dict[str, dict[str, Any]]) -> bytes:
    return json.dumps({"version": 4, "terraform_version": "1.0.3", "serial": serial, "lineage": "l", "outputs": {}, "resources": [
        {"mode": "managed", "type": address.split(".")[0], "name": address.split(".")[1], "provider": NULL_PROVIDER,
         "instances": [{"schema_version": 0, "attributes": attrs, "sensitive_attributes": []}]}
        for address, attrs in objects.items()]}).encode()


def write(conn, name: str, raw: bytes, source: str) -> None:
    writes.store_document(conn, name, tfstate.parse_state(raw), raw, source=source, actor="t")


def doc(conn, name: str = "prod", include_resolved: bool = False) -> dict:
    rows = drift_store.list_drift(conn, name, include_resolved=include_resolved)
    open_count = drift_store.count_drift(conn, name)
    total = drift_store.count_drift(conn, name, include_resolved=True) if include_resolved else open_count
    return drift_model.document(name, rows, total=total, open_count=open_count,
                                 ignored_count=drift_store.count_ignored(conn, name),
                                 include_resolved=include_resolved)


def open_addresses(conn, name: str = "prod") -> list[str]:
    return [e["address"] for e in doc(conn, name)["drift"]]


def add(conn, states: str, address: str, path: str | None = None, reason: str | None = None,
        expires_in_s: float | None = None) -> int:
    return ignore_rules.add_rule(conn, ignore_rules.NewRule(
        states, address, sch.path_parse(path) if path else None, reason, expires_in_s), "t")


BASE: dict[str, dict[str, Any]] = {
    "null_resource.web": {"id": "w", "triggers": {"env": "prod", "stamp": "1"}},
    "null_resource.db": {"id": "d", "triggers": {"env": "prod", "stamp": "1"}},
    "local_file.conf": {"id": "c", "content": "x", "filename": "conf"},
}


def drifted(conn, name: str = "prod") -> None:
    """web: only triggers["stamp"] changed; db: triggers["stamp"] and id; local_file.conf deleted."""
    write(conn, name, state(1, BASE), "apply")
    write(conn, name, state(2, {
        "null_resource.web": {"id": "w", "triggers": {"env": "prod", "stamp": "2"}},
        "null_resource.db": {"id": "d2", "triggers": {"env": "prod", "stamp": "2"}},
    }), "refresh")


def test_a_glob_over_addresses_hides_records_everywhere_open_drift_is_counted_and_remove_restores(conn):
    drifted(conn)
    records_before = conn.execute("SELECT * FROM drift_records ORDER BY id").fetchall()
    assert open_addresses(conn) == ["local_file.conf", "null_resource.db", "null_resource.web"]
    rule = add(conn, "prod", "null_resource.*", reason="rebuilt nightly")
    assert open_addresses(conn) == ["local_file.conf"]
    status = summary.state_status(conn, "prod")
    assert (status["open_drift"], status["open_drift_first_serial"]) == (1, 2)
    assert doc(conn)["ignored"] == 2
    full = doc(conn, include_resolved=True)
    assert (full["total"], full["open"], full["ignored"]) == (3, 1, 2)
    by_address = {e["address"]: e for e in full["drift"]}
    assert by_address["local_file.conf"]["status"] == "open" and by_address["local_file.conf"]["ignored_by"] is None
    for address in ("null_resource.db", "null_resource.web"):
        assert by_address[address]["status"] == "ignored"
        assert by_address[address]["ignored_by"] == {"rule": rule, "reason": "rebuilt nightly",
                                                     "rules": [{"rule": rule, "reason": "rebuilt nightly"}]}
    assert [e["status"] for e in full["drift"]] == ["open", "ignored", "ignored"]  # open ones first
    [row] = [r for r in ignore_rules.list_rules(conn) if r["id"] == rule]
    assert (row["hidden"], row["expired"], row["path"]) == (2, False, None)
    # the records are untouched; removing the rule makes them open drift again
    assert conn.execute("SELECT * FROM drift_records ORDER BY id").fetchall() == records_before
    ignore_rules.remove_rule(conn, rule)
    assert open_addresses(conn) == ["local_file.conf", "null_resource.db", "null_resource.web"]
    assert summary.state_status(conn, "prod")["open_drift"] == 3
    with pytest.raises(ignore_rules.RuleNotFound, match=f"no drift ignore rule with id {rule}"):
        ignore_rules.remove_rule(conn, rule)


def test_address_globs_keep_star_within_a_segment_and_double_star_across(conn):
    write(conn, "prod", state(1, {"null_resource.a": {"id": "a"}}), "apply")
    raw = json.loads(state(1, {"null_resource.a": {"id": "a"}}))
    raw["resources"].append({"module": "module.m", "mode": "managed", "type": "null_resource", "name": "a",
                             "provider": NULL_PROVIDER, "instances": [{"attributes": {"id": "ma"}, "sensitive_attributes": []}]})
    raw["serial"] = 2
    write(conn, "prod", json.dumps(raw).encode(), "apply")
    raw["serial"] = 3
    raw["resources"][0]["instances"][0]["attributes"] = {"id": "a2"}
    raw["resources"][1]["instances"][0]["attributes"] = {"id": "ma2"}
    write(conn, "prod", json.dumps(raw).encode(), "refresh")
    assert open_addresses(conn) == ["module.m.null_resource.a", "null_resource.a"]
    one = add(conn, "prod", "null_resource.*")  # not the one in module m
    assert open_addresses(conn) == ["module.m.null_resource.a"]
    ignore_rules.remove_rule(conn, one)
    add(conn, "prod", "module.m.*")  # * stays within one segment: no match
    assert open_addresses(conn) == ["module.m.null_resource.a", "null_resource.a"]
    add(conn, "prod", "module.**")
    assert open_addresses(conn) == ["null_resource.a"]


def test_states_glob_selects_states(conn):
    drifted(conn, "team/dev")
    drifted(conn, "team/dev/eu")
    add(conn, "team/*", "**")
    assert open_addresses(conn, "team/dev") == []
    assert len(open_addresses(conn, "team/dev/eu")) == 3
    add(conn, "team/**", "**")
    assert open_addresses(conn, "team/dev/eu") == []


def test_a_path_rule_hides_a_record_only_when_every_change_lies_under_the_path(conn):
    drifted(conn)
    rule = add(conn, "**", "**", path='triggers["stamp"]')
    # a path above the change covers it too
    above = add(conn, "**", "null_resource.web", path="triggers")
    assert open_addresses(conn) == ["local_file.conf", "null_resource.db"]
    ignore_rules.remove_rule(conn, above)
    # web changed only there; db changed its id too; a deleted object is never under a path
    assert open_addresses(conn) == ["local_file.conf", "null_resource.db"]
    by_address = {e["address"]: e for e in doc(conn, include_resolved=True)["drift"]}
    assert by_address["null_resource.web"]["ignored_by"]["rule"] == rule
    assert by_address["null_resource.web"]["changes"] == [{"path": 'triggers["stamp"]', "before": "1", "after": "2"}]
    # db changed under triggers and at id: while no rule covers its id it stays open drift...
    triggers = add(conn, "**", "null_resource.db", path="triggers", reason="stamps")
    assert open_addresses(conn) == ["local_file.conf", "null_resource.db"]
    # ...and rules combine: with one for id too, every change is covered by some rule
    id_rule = add(conn, "**", "null_resource.db", path="id")
    assert open_addresses(conn) == ["local_file.conf"]
    db = {e["address"]: e for e in doc(conn, include_resolved=True)["drift"]}["null_resource.db"]
    assert (db["status"], db["ignored_by"]) == ("ignored", {"rule": rule, "reason": None, "rules": [
        {"rule": rule, "reason": None}, {"rule": triggers, "reason": "stamps"}, {"rule": id_rule, "reason": None}]})
    add(conn, "**", "local_file.conf", path="content")
    assert open_addresses(conn) == ["local_file.conf"]
    add(conn, "**", "local_file.conf")  # no path: a deletion is ignored
    assert open_addresses(conn) == []
    assert summary.state_status(conn, "prod")["open_drift"] == 0
    assert [r["path"] for r in ignore_rules.list_rules(conn)] == ['triggers["stamp"]', "triggers", "id", "content", None]
    assert [r["hidden"] for r in ignore_rules.list_rules(conn)] == [2, 1, 1, 0, 1]  # each rule that hides a record


def test_kl_drift_all_names_every_rule_that_hides_a_record(conn, run_kl):
    drifted(conn)
    ids = [int(run_kl("drift", "ignore", "add", "--states", "prod", "--address", "null_resource.db", "--path", path,
                      *(("--reason", "stamps") if path == "triggers" else ())).stdout) for path in ("triggers", "id")]
    assert run_kl("drift", "prod", "--detailed-exitcode", "-q").returncode == 2  # web and local_file.conf
    text = run_kl("drift", "prod", "--all").stdout.decode()
    assert f"ignored by rules {ids[0]} (stamps), {ids[1]}\n" in text, text
    md = run_kl("drift", "prod", "--all", "--format", "markdown").stdout.decode()
    assert f"ignored by rules {ids[0]} (stamps), {ids[1]}\n" in md, md
    assert [x["hides"] for x in json.loads(run_kl("drift", "ignore", "list", "--format", "json").stdout)["rules"]] == [1, 1]


def test_a_record_whose_attributes_did_not_change_is_not_covered_by_any_path(conn):
    write(conn, "prod", state(1, BASE), "apply")
    raw = json.loads(state(2, BASE))
    raw["resources"][0]["instances"][0]["status"] = "tainted"  # web: status only
    write(conn, "prod", json.dumps(raw).encode(), "refresh")
    assert open_addresses(conn) == ["null_resource.web"]
    add(conn, "**", "**", path="triggers")
    assert open_addresses(conn) == ["null_resource.web"]
    add(conn, "**", "null_resource.web")
    assert open_addresses(conn) == []


@pytest.mark.parametrize(("before", "after"), [
    ({"t": {"k": "1", "j": "1"}}, {"t": {"k": "2", "j": "1"}}),
    ({"t": {"k": "1", "j": "1"}}, {"t": {"k": "2", "j": "2"}}),
    ({"t": {"k": "1"}}, {"t": {}}),
    ({"t": None}, {"t": {"k": "1"}}),
    ({"t": "x"}, {"t": {"k": "1"}}),
    ({"l": ["a", "b"]}, {"l": ["x", "b"]}),
    ({"l": ["a", "b"]}, {"l": ["a"]}),
    ({"l": ["a"]}, {"l": []}),
    ({"l": [{"c": 1, "d": 1}]}, {"l": [{"c": 2, "d": 1}]}),
    ({"l": [{"c": 1, "d": 1}]}, {"l": [{"c": 2, "d": 2}]}),
    ({"l": ["a"]}, {"l": {"0": "b"}}),
    ({"t": {"k": "1"}, "id": "a"}, {"t": {"k": "2"}, "id": "b"}),
])
@pytest.mark.parametrize("path", ['t["k"]', "t", "l[0]", "l", "l[0].c", 'l["c"]', "id"])
def test_the_sql_path_test_agrees_with_the_changes_kl_drift_shows(conn, before, after, path):
    # In the JSON an attribute step and a key step are one thing: l[0].c covers l[0]["c"].
    steps = ignore_rules.path_steps(sch.path_parse(path))
    shown = [ignore_rules.path_steps(sch.path_parse(c.path)) for c in drift_model.changes(before, after)]
    expected = all(p[:len(steps)] == steps for p in shown)
    [(got,)] = conn.execute("SELECT kl_drift_changes_within(%s::jsonb, %s::jsonb, %s)",
                            (json.dumps(before), json.dumps(after), steps)).fetchall()
    assert got is expected


_CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"t": {"k": "1", "j": "1"}}, {"t": {"k": "2", "j": "1"}}),
    ({"t": {"k": "1", "j": "1"}}, {"t": {"k": "2", "j": "2"}}),
    ({"t": {"k": "1"}}, {"t": {}}),
    ({"t": None}, {"t": {"k": "1"}}),
    ({"t": "x"}, {"t": {"k": "1"}}),
    ({"l": ["a", "b"]}, {"l": ["x", "y"]}),
    ({"l": ["a", "b"]}, {"l": ["a"]}),
    ({"l": [{"c": 1, "d": 1}, {"c": 1}]}, {"l": [{"c": 2, "d": 2}, {"c": 2}]}),
    ({"l": ["a"]}, {"l": {"0": "b"}}),
    ({"t": {"k": "1"}, "id": "a", "l": ["a", "b"]}, {"t": {"k": "2"}, "id": "b", "l": ["a", "c"]}),
]
_PATHS = ['t["k"]', 't["j"]', "t", "l[0]", "l[1]", "l", "l[0].c", "l[0].d", "l[1].c", 'l["c"]', "id"]


def test_rules_combine_exactly_when_every_change_kl_drift_shows_lies_under_one_of_them(conn):
    """The SQL (kl_drift_ignored_by) against kilolock.drift.changes, for every pair of paths on
    every case: hidden iff each change shown lies at or under some rule's path (an attribute step
    and a key step are one thing in the JSON: l[0].c covers l[0]["c"])."""
    import itertools

    def under(change: list[str], rule: list[str]) -> bool:
        return change[:len(rule)] == rule

    for before, after in _CASES:
        shown = [ignore_rules.path_steps(sch.path_parse(c.path)) for c in drift_model.changes(before, after)]
        for pair in itertools.chain(itertools.combinations(_PATHS, 1), itertools.combinations(_PATHS, 2)):
            ids = [add(conn, "prod", "**", path=p) for p in pair]
            steps = [ignore_rules.path_steps(sch.path_parse(p)) for p in pair]
            expected = bool(shown) and all(any(under(c, r) for r in steps) for c in shown)
            [(got,)] = conn.execute("SELECT kl_drift_ignored_by('prod', 'null_resource.x', 'changed', %s::jsonb, %s::jsonb)",
                                    (json.dumps(before), json.dumps(after))).fetchall()
            assert (got is not None) is expected, (before, after, pair, got)
            if got is not None:  # the rules named are those that cover a change
                assert got == [i for i, r in zip(ids, steps, strict=True) if any(under(c, r) for c in shown)], (before, after, pair)
            conn.execute("DELETE FROM drift_ignore_rules")


def test_expired_rules_do_not_match(conn):
    drifted(conn)
    rule = add(conn, "prod", "**", expires_in_s=3600)
    assert open_addresses(conn) == []
    [(left,)] = conn.execute("SELECT expires_at - created_at FROM drift_ignore_rules WHERE id = %s", (rule,)).fetchall()
    assert left.total_seconds() == 3600
    conn.execute("UPDATE drift_ignore_rules SET expires_at = now() - interval '1 second' WHERE id = %s", (rule,))
    assert len(open_addresses(conn)) == 3
    [row] = ignore_rules.list_rules(conn)
    assert (row["expired"], row["hidden"]) == (True, 0)


def test_resolved_records_stay_resolved_and_new_drift_matches_the_rule(conn):
    drifted(conn)
    add(conn, "prod", "null_resource.web")
    write(conn, "prod", state(3, BASE), "apply")  # resolves all three
    full = doc(conn, include_resolved=True)
    assert [e["status"] for e in full["drift"]] == ["resolved"] * 3 and all(e["ignored_by"] is None for e in full["drift"])
    write(conn, "prod", state(4, {**BASE, "null_resource.web": {"id": "w9", "triggers": None}}), "refresh")
    assert open_addresses(conn) == []
    assert [r["hidden"] for r in ignore_rules.list_rules(conn)] == [1]


def test_the_api_agrees(conn):
    from kilolock.server import api

    drifted(conn)
    add(conn, "prod", "null_resource.*", reason="r")
    body = json.loads(api.drift_report(conn, "prod").body)
    assert (body["open"], body["ignored"], [e["address"] for e in body["drift"]]) == (1, 2, ["local_file.conf"])
    body = json.loads(api.drift_report(conn, "prod", include_resolved=True).body)
    assert [e["status"] for e in body["drift"]] == ["open", "ignored", "ignored"]


# --- the command line ---------------------------------------------------------------------------

def test_kl_drift_ignore_add_list_remove(conn, run_kl):
    drifted(conn)
    r = run_kl("drift", "ignore", "add", "--states", "prod", "--address", "null_resource.*", "--reason", "nightly",
               "--expires", "7d")
    assert r.returncode == 0, r.stderr
    rule = int(r.stdout)
    assert run_kl("drift", "prod", "--detailed-exitcode", "-q").returncode == 2  # local_file.conf still open
    lines = run_kl("drift", "prod").stdout.decode().splitlines()
    assert lines[0].startswith("local_file.conf: deleted at v2 (") and lines[-2:] == [
        "(2 more ignored by rules: kl drift prod --all)", "total: 1 drifted instance(s) open"]
    r = run_kl("drift", "ignore", "add", "--states", "prod", "--address", "local_file.conf", "--path", "content")
    assert int(r.stdout) == rule + 1
    assert run_kl("drift", "prod", "--detailed-exitcode", "-q").returncode == 2  # a deletion is under no path
    third = int(run_kl("drift", "ignore", "add", "--states", "prod", "--address", "local_*.*").stdout)
    assert run_kl("drift", "prod", "--detailed-exitcode", "-q").returncode == 0
    assert run_kl("drift", "prod").stdout.decode() == "prod: no drift\n(3 more ignored by rules: kl drift prod --all)\n"
    text = run_kl("drift", "prod", "--all").stdout.decode()
    assert "more ignored" not in text
    assert "null_resource.web: changed at v2 (first detected v2, " in text and f"ignored by rule {rule}: nightly" in text
    assert "local_file.conf: deleted at v2 (" in text and f"ignored by rule {third}\n" in text
    status = json.loads(run_kl("status", "prod", "--format", "json").stdout)
    assert status["open_drift"] == 0
    listed = json.loads(run_kl("drift", "ignore", "list", "--format", "json").stdout)
    assert [(x["id"], x["states"], x["address"], x["path"], x["hides"], x["reason"], x["expired"]) for x in listed["rules"]] == [
        (rule, "prod", "null_resource.*", None, 2, "nightly", False),
        (rule + 1, "prod", "local_file.conf", "content", 0, None, False),
        (third, "prod", "local_*.*", None, 1, None, False)]
    assert listed["rules"][0]["expires_at"] is not None and listed["rules"][1]["expires_at"] is None
    table = run_kl("drift", "ignore", "list").stdout.decode().splitlines()
    assert table[0].split() == ["ID", "STATES", "ADDRESS", "PATH", "HIDES", "EXPIRES", "REASON"]
    assert table[1].split()[:5] == [str(rule), "prod", "null_resource.*", "-", "2"] and table[1].endswith("nightly")
    assert table[2].split()[:6] == [str(rule + 1), "prod", "local_file.conf", "content", "0", "never"]
    r = run_kl("drift", "ignore", "remove", str(third))
    assert r.returncode == 0 and r.stdout.decode().startswith(f"removed drift ignore rule {third}")
    assert run_kl("drift", "prod", "--detailed-exitcode", "-q").returncode == 2
    assert json.loads(run_kl("status", "prod", "--format", "json").stdout)["open_drift"] == 1


def test_bad_input_is_one_line_and_writes_nothing(conn, run_kl):
    cases = [
        (("add", "--states", "", "--address", "x"), 2, "a state glob must not be empty"),
        (("add", "--states", "prod", "--address", ""), 2, "an address glob must not be empty"),
        (("add", "--states", "prod", "--address", "x", "--path", "tags[env]"), 2, "argument --path: attribute path 'tags[env]'"),
        (("add", "--states", "prod", "--address", "x", "--expires", "2w"), 2, "argument --expires: invalid duration '2w'"),
        (("add", "--states", "prod", "--address", "x", "--expires", "0s"), 2, "must be greater than zero"),
        (("add", "--address", "x"), 2, "the following arguments are required: --states"),
        (("remove", "x1"), 2, "'x1' is not a rule id"),
        (("remove", "41"), 1, "no drift ignore rule with id 41"),
    ]
    for argv, code, message in cases:
        r = run_kl("drift", "ignore", *argv)
        err = r.stderr.decode()
        assert r.returncode == code, (argv, err)
        assert err.startswith("kl: ") and message in err.splitlines()[0], (argv, err)
        assert r.stdout == b""
        if code == 2:
            assert err.count("\n") == 2 and err.splitlines()[1].startswith("usage: kl drift ignore ")
    assert run_kl("drift", "ignore", "remove", "41", "--detailed-exitcode").returncode == 1
    assert conn.execute("SELECT count(*) FROM drift_ignore_rules").fetchone() == (0,)
    r = run_kl("drift", "ignore")  # no action: the group's help
    assert r.returncode == 2 and "add" in r.stderr.decode() and "remove" in r.stderr.decode()


def test_a_state_named_ignore_is_reached_with_states(conn, run_kl):
    drifted(conn, "ignore")
    r = run_kl("drift", "--states", "ignore", "--detailed-exitcode", "-q")
    assert r.returncode == 2
    assert "null_resource.web" in run_kl("drift", "--states", "ignore").stdout.decode()


ADDRESSES = ['null_resource.a', 'null_resource.a[0]', 'null_resource.a["k.v"]', 'local_file.f["two"]',
             'module.m.null_resource.a', 'module.m.module.n.null_resource.a[1]', 'data.x.y', 'null_resource.ab']


@pytest.mark.parametrize("glob", ["null_resource.*", "null_resource.a", "null_resource.a[*]", 'local_file.f["two"]',
                                  'local_file.f["t?o"]', "module.m.*", "module.m.**", "**.null_resource.a", "**",
                                  "*.a*", "module.*.null_resource.*"])
def test_address_globs_mean_the_same_in_python_and_postgresql(conn, glob):
    from kilolock import globs

    pattern = globs.compile_address_glob(glob)
    in_sql = {a for (a,) in conn.execute("SELECT a FROM unnest(%s::text[]) a WHERE a ~ %s",
                                         (ADDRESSES, globs.address_regex(glob))).fetchall()}
    assert in_sql == {a for a in ADDRESSES if pattern.fullmatch(a)}
    expected = {"null_resource.*": {"null_resource.a", "null_resource.a[0]", "null_resource.ab"},
                'local_file.f["t?o"]': {'local_file.f["two"]'},
                "**.null_resource.a": {"null_resource.a", "module.m.null_resource.a"},  # ** is zero or more segments
                "module.m.**": {"module.m.null_resource.a", "module.m.module.n.null_resource.a[1]"}}
    if glob in expected:
        assert in_sql == expected[glob]


# Session 6: with the provider's schema kl drift goes through a dynamic value's stored wrapper
# (dyn.x) and compares sets as sets (labels[="a"] added or removed); the rules' SQL (migration
# 0018) must cover exactly those changes, without the schema.
_SHAPED = sch.block_from_json({"attributes": {
    "dyn": {"type": "dynamic", "optional": True},
    "labels": {"type": ["set", "string"], "optional": True},
    "objects": {"type": ["set", ["object", {"k": "string", "v": "number"}]], "optional": True},
}})
_OBJ_T = ["object", {"x": "number", "y": ["list", "string"]}]


def _dyn(value: Any, type_: Any) -> dict[str, Any]:
    return {"value": value, "type": type_}


_SHAPED_CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"dyn": _dyn({"x": 1, "y": ["a"]}, _OBJ_T)}, {"dyn": _dyn({"x": 2, "y": ["a"]}, _OBJ_T)}),
    ({"dyn": _dyn({"x": 1, "y": ["a"]}, _OBJ_T)}, {"dyn": _dyn({"x": 2, "y": ["b"]}, _OBJ_T)}),
    ({"dyn": _dyn({"x": 1, "y": ["a"]}, _OBJ_T)}, {"dyn": _dyn(["a", "b"], ["list", "string"])}),
    ({"dyn": _dyn(["a", "b"], ["list", "string"])}, {"dyn": _dyn(["a", "c"], ["list", "string"])}),
    ({"dyn": _dyn(["a", "b"], ["set", "string"])}, {"dyn": _dyn(["b", "c"], ["set", "string"])}),
    ({"labels": ["a", "b"]}, {"labels": ["b", "c"]}),
    ({"labels": ["a", "b"]}, {"labels": ["c", "a", "b"]}),
    ({"labels": None}, {"labels": ["a"]}),
    ({"objects": [{"k": "one", "v": 1}, {"k": "two", "v": 2}]}, {"objects": [{"k": "one", "v": 1}, {"k": "three", "v": 3}]}),
    ({"objects": [{"k": "one", "v": 1}, {"k": "two", "v": 2}]}, {"objects": [{"k": "two", "v": 2}]}),
    ({"labels": ["a"], "dyn": _dyn({"x": 1, "y": []}, _OBJ_T)}, {"labels": ["a", "c"], "dyn": _dyn({"x": 2, "y": []}, _OBJ_T)}),
]
# A list index into a set is left out: kl drift never shows one, and the SQL reads it as a position.
_SHAPED_PATHS = ["dyn", "dyn.x", "dyn.y", "dyn[1]", 'dyn[="a"]', 'dyn[="c"]', "labels", 'labels[="a"]', 'labels[="c"]',
                 'objects[={"k":"two","v":2}]', 'objects[={"k":"three","v":3}]', "objects"]


def _loose(path: sch.DriftPath) -> tuple[Any, ...]:
    return tuple(s.name if isinstance(s, sch.GetAttr) else ("=", sch.element_json(s.value)) if isinstance(s, sch.Element)
                 else s.key for s in path)


def test_rules_cover_the_dynamic_and_set_paths_kl_drift_shows_with_the_schema(conn):
    import itertools

    def under(change: tuple[Any, ...], rule: tuple[Any, ...]) -> bool:
        return change[:len(rule)] == rule

    for before, after in _SHAPED_CASES:
        shown = [_loose(sch.drift_path_parse(c.path)) for c in drift_model.changes(before, after, block=_SHAPED)]
        assert shown, (before, after)
        for pair in itertools.chain(itertools.combinations(_SHAPED_PATHS, 1), itertools.combinations(_SHAPED_PATHS, 2)):
            ids = [ignore_rules.add_rule(conn, ignore_rules.NewRule("prod", "**", sch.drift_path_parse(p)), "t") for p in pair]
            rules = [_loose(sch.drift_path_parse(p)) for p in pair]
            expected = all(any(under(c, r) for r in rules) for c in shown)
            [(got,)] = conn.execute("SELECT kl_drift_ignored_by('prod', 'x_thing.x', 'changed', %s::jsonb, %s::jsonb)",
                                    (json.dumps(before), json.dumps(after))).fetchall()
            assert (got is not None) is expected, (before, after, pair, shown, got)
            if got is not None:
                assert got == [i for i, r in zip(ids, rules, strict=True) if any(under(c, r) for c in shown)], (before, after, pair)
            conn.execute("DELETE FROM drift_ignore_rules")


def test_a_set_element_rule_is_stored_with_its_element_and_listed_as_written(conn):
    path = 'member[={"name":"eve","role":null}]'
    rule = ignore_rules.add_rule(conn, ignore_rules.NewRule("prod", "**", sch.drift_path_parse(path)), "t")
    [(steps, element, shown)] = conn.execute("SELECT path_steps, path_element, path FROM drift_ignore_rules WHERE id = %s",
                                             (rule,)).fetchall()
    assert (steps, element, shown) == (["member"], {"name": "eve", "role": None}, path)
