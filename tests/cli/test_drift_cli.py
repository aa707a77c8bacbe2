"""kl drift as a CI gate and a report: --detailed-exitcode, -q, --states GLOB, --format markdown."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import psycopg
import pytest

from kilolock import tfstate
from kilolock.cli import main
from kilolock.store import states, versions, writes


def _kl(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _write(db_url: str, name: str, raw: bytes, source: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        writes.store_document(c, name, tfstate.parse_state(raw), raw, source=source, actor="test")


@pytest.fixture
def drifted(db_url, make_state):
    """team/dev has drift (a changed map key, a masked secret, a | in a value); team/dev/eu has one
    deleted instance (a); team/prod and prod have none."""
    for name in ("team/dev", "team/dev/eu", "team/prod", "prod"):
        _write(db_url, name, make_state(1, {"a": {"id": "1", "tags": {"env": "old"}, "pw": "hunter2"}, "b": {"id": "2"}}), "apply")
    doc = json.loads(make_state(2, {"a": {"id": "1", "tags": {"env": "new|x"}, "pw": "hunter3"}, "b": {"id": "2"}}))
    doc["resources"][0]["instances"][0]["sensitive_attributes"] = [[{"type": "get_attr", "value": "pw"}]]
    _write(db_url, "team/dev", json.dumps(doc).encode(), "refresh")
    _write(db_url, "team/dev/eu", make_state(2, {"b": {"id": "2"}}), "refresh")
    return db_url


def test_detailed_exitcode_gates_on_open_drift(drifted):
    assert _kl("drift", "team/dev")[0] == 0  # without the flag, today's codes
    code, out, _ = _kl("drift", "team/dev", "--detailed-exitcode")
    assert code == 2 and 'tags["env"]: "old" → "new|x"' in out and "pw: (sensitive) → (sensitive)" in out, out
    assert _kl("drift", "team/prod", "--detailed-exitcode") == (0, "team/prod: no drift\n", "")
    code, _, err = _kl("drift", "nope", "--detailed-exitcode")
    assert code == 1 and err.startswith("kl: no state named 'nope'"), err


def test_quiet_drops_the_human_output_but_not_the_json_asked_for(drifted):
    assert _kl("drift", "team/dev", "--detailed-exitcode", "-q") == (2, "", "")
    code, out, _ = _kl("drift", "team/dev", "--detailed-exitcode", "-q", "--format", "json")
    assert code == 2 and json.loads(out)["total"] == 1


def test_states_glob_is_one_gate_over_many_states(drifted):
    code, out, _ = _kl("drift", "--states", "team/*", "--detailed-exitcode", "--format", "json")
    doc = json.loads(out)
    assert code == 2 and [s["state"] for s in doc["states"]] == ["team/dev", "team/prod"] and doc["total"] == 1
    code, out, _ = _kl("drift", "--states", "team/**", "--format", "json")
    doc = json.loads(out)
    assert code == 0 and [(s["state"], s["total"]) for s in doc["states"]] == [("team/dev", 1), ("team/dev/eu", 1), ("team/prod", 0)]
    assert doc["states"][1]["drift"][0]["kind"] == "deleted"
    assert _kl("drift", "--states", "prod", "--detailed-exitcode")[0] == 0
    code, out, err = _kl("drift", "--states", "ghost/*", "--detailed-exitcode")
    assert code == 1 and out == "" and err == "kl: no state matches 'ghost/*' (see `kl state list`)\n", err
    code, out, _ = _kl("drift", "--states", "team/**")
    assert out.splitlines()[0] == "team/dev:" and "team/prod: no drift" in out


def _without_clock(doc: dict) -> dict:
    """A drift document without open_for_s, which moves with the clock between two commands."""
    return {**doc, "drift": [{k: v for k, v in e.items() if k != "open_for_s"} for e in doc["drift"]]}


def test_states_glob_reads_the_fleet_at_once_and_each_state_as_alone(drifted, make_state, monkeypatch):
    from kit.pg import record_statements

    # team/dev: a back as it was (its record resolved) and b changed (open): --all and --limit bite.
    both = make_state(3, {"a": {"id": "1", "tags": {"env": "old"}, "pw": "hunter2"}, "b": {"id": "2", "tags": {"x": "y"}}})
    _write(drifted, "team/dev", both, "refresh")
    names = ["prod", "team/dev", "team/dev/eu", "team/prod"]
    for flags in ((), ("--limit", "1"), ("--all",), ("--all", "--limit", "1")):
        _, out, _ = _kl("drift", "--states", "**", "--format", "json", *flags)
        many = [_without_clock(d) for d in json.loads(out)["states"]]
        alone = [_without_clock(json.loads(_kl("drift", n, "--format", "json", *flags)[1])) for n in names]
        assert many == alone, flags
        dev = many[1]
        assert (dev["open"], dev["total"], len(dev["drift"])) == {
            (): (1, 1, 1), ("--limit", "1"): (1, 1, 1), ("--all",): (1, 2, 2), ("--all", "--limit", "1"): (1, 2, 1)}[flags], dev
    sent = record_statements(monkeypatch)
    _kl("drift", "--states", "**", "--all", "-q")
    four = len(sent)
    for n in range(4):  # twice the states, as many statements: none is per state
        _write(drifted, f"more/{n}", both, "apply")
    sent.clear()
    _kl("drift", "--states", "**", "--all", "-q")
    assert len(sent) == four, sent
    # -q prints nothing: its gate reads the open counts, not every record and schema.
    printed = _kl("drift", "--states", "**", "--all", "--detailed-exitcode")[0]
    sent.clear()
    assert _kl("drift", "--states", "**", "--all", "--detailed-exitcode", "-q")[0] == printed == 2
    assert sent and not [q for q in sent if "row_number()" in q], sent



def test_markdown_report(drifted):
    code, out, _ = _kl("drift", "--states", "team/**", "--format", "markdown")
    assert code == 0 and "hunter" not in out
    assert "### Drift in `team/dev`: 1 instance(s)" in out and "### Drift in `team/prod`: none" in out, out
    assert '| `tags["env"]` | `"old"` | `"new\\|x"` |' in out and "| `pw` | `(sensitive)` | `(sensitive)` |" in out, out
    assert "**`null_resource.a`**: deleted at v2" in out and "The object no longer exists." in out, out


def test_one_state_or_states_not_both(drifted):
    code, _, err = _kl("drift", "prod", "--states", "*")
    assert code == 2 and err.startswith("kl: drift: name one state, or --states GLOB\nusage: kl drift "), err


def test_status_points_at_runs_stale_when_a_run_looks_dead_and_shows_time_zones(drifted):
    from kilolock.store import refresh_runs

    with psycopg.connect(drifted, autocommit=True) as c:  # a run whose process died: its session lock is gone
        sid = states.state_id(c, "prod")
        current = versions.current_version(c, sid)
        assert current is not None
        refresh_runs.begin(c, sid, current.id, "ghost@cli")
    code, out, _ = _kl("status", "prod")
    assert code == 0 and "kl runs prod --stale marks them failed" in out, out
    last = next(line for line in out.splitlines() if line.startswith("last refresh:"))
    assert last.rstrip()[-5] in "+-" and last.rstrip()[-4:].isdigit(), last  # 2026-11-30 11:51:43 +0000
    code, out, _ = _kl("status", "prod", "--format", "json")
    assert len(json.loads(out)["dead_runs"]) == 1
    assert _kl("runs", "prod", "--stale")[0] == 0
    assert "--stale" not in _kl("status", "prod")[1]


def test_status_of_many_states_says_what_each_states_status_says(drifted, make_state, monkeypatch):
    """`kl status --states GLOB`: a line a state, each as `kl status STATE` says it (a dead run, a
    lock, drift, none), in as many statements for twice the states."""
    from kilolock.store import locks, refresh_runs
    from kit.pg import record_statements

    with psycopg.connect(drifted, autocommit=True) as c:
        sid = states.state_id(c, "team/prod")
        current = versions.current_version(c, sid)
        assert current is not None
        refresh_runs.begin(c, sid, current.id, "ghost@cli")
        locks.acquire(c, states.state_id(c, "prod"), "prod", {"ID": "L1", "Operation": "OperationTypeApply", "Who": "ann@ci"},
                      "ann@ci")
    code, out, _ = _kl("status", "--states", "**", "--format", "json")
    many = json.loads(out)
    assert code == 0 and many["states_glob"] == "**"
    listed = {r["name"]: r["resources"] for r in json.loads(_kl("state", "list", "--format", "json")[1])["states"]}
    assert [r["state"] for r in many["states"]] == sorted(listed)
    for row in many["states"]:
        one = json.loads(_kl("status", row["state"], "--format", "json")[1])
        last = one["last_refresh"] and {"status": one["last_refresh"]["status"], "started_at": one["last_refresh"]["started_at"]}
        assert row == {"state": one["state"], "serial": one["serial"], "resources": listed[row["state"]],
                       "open_drift": one["open_drift"], "locked_by": one["locked_by"], "last_refresh": last}, one
    assert [(r["state"], r["open_drift"], r["locked_by"], r["last_refresh"] and r["last_refresh"]["status"])
            for r in many["states"]] == [("prod", 0, "ann@ci", None), ("team/dev", 1, None, None),
                                         ("team/dev/eu", 1, None, None), ("team/prod", 0, None, "running")]
    code, out, _ = _kl("status", "--states", "team/*")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["STATE", "SERIAL", "RESOURCES", "OPEN", "DRIFT", "LAST", "REFRESH", "LOCKED", "BY"]
    assert [line.split()[:4] for line in lines[1:]] == [["team/dev", "v2", "2", "1"], ["team/prod", "v1", "2", "0"]], out
    assert _kl("status", "--states", "ghost/*") == (1, "", "kl: no state matches 'ghost/*' (see `kl state list`)\n")
    assert _kl("status", "prod", "--states", "*")[0] == 2

    sent = record_statements(monkeypatch)
    _kl("status", "--states", "**")
    before = len(sent)
    for n in range(4):
        _write(drifted, f"more/{n}", make_state(1, {"a": {"id": "1"}}), "apply")
    sent.clear()
    _kl("status", "--states", "**")
    assert len(sent) == before, sent


def test_provider_list_with_nothing_configured_says_so(db_url):
    code, out, _ = _kl("provider", "list")
    assert code == 0 and out.startswith("no provider configured, pinned or cached"), out


def test_state_list_takes_the_same_glob(drifted):
    code, out, _ = _kl("state", "list", "--states", "team/*", "--format", "json")
    assert code == 0 and [r["name"] for r in json.loads(out)["states"]] == ["team/dev", "team/prod"]


def test_the_table_ends_with_a_total_and_many_states_markdown_begins_with_a_summary(drifted):
    code, out, _ = _kl("drift", "--states", "team/**")
    assert code == 0 and out.splitlines()[-1] == "total: 2 drifted instance(s) open, in 2 of 3 state(s)", out
    code, out, _ = _kl("drift", "team/dev")
    assert out.splitlines()[-1] == "total: 1 drifted instance(s) open", out
    code, out, _ = _kl("drift", "--states", "team/prod")
    assert out == "team/prod: no drift\ntotal: 0 drifted instance(s) open, in 0 of 1 state(s)\n", out
    code, out, _ = _kl("drift", "--states", "team/**", "--format", "markdown")
    assert out.startswith("## Drift across `team/**`: 2 drifted instance(s) open, in 2 of 3 state(s)\n\n### Drift in "), out
    code, out, _ = _kl("drift", "team/dev", "--format", "markdown")  # one state: its own heading is the summary
    assert out.startswith("### Drift in `team/dev`: 1 instance(s)"), out
