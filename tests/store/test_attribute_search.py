"""A search by attribute value (`kl resources --where`, /api/v1/resources?where=, the UI's search)
asks the attribute index (migration 0032) for the instances that may hold the value, then either
gathers those few or, when many hold it, walks the states in order until a page is full. Both ways
list what reading every instance lists, page by page, a secret never matching; the UI counts its
matches only up to a cap and says "more than" past it."""
from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.rows import class_row

from kilolock import attrsearch, inventory, tfstate
from kilolock import schema as sch
from kilolock.store import inventory as store
from kilolock.store import ui_queries, writes

NULL = 'provider["registry.terraform.io/hashicorp/null"]'
SECRET_AT = ("s2", 3)  # this instance's triggers are marked sensitive


# What a refresh then reads differently (a drift): the inventory shows the observed value.
OBSERVED = {"s1": {1: "dev"}, "s3": {2: "prod"}}


def _document(state: str, observed: dict[int, str] | None = None) -> bytes:
    resources = []
    for i in range(6):
        marks = [[{"type": "get_attr", "value": "triggers"}]] if (state, i) == SECRET_AT else []
        env = (observed or {}).get(i, "prod" if i % 2 else "dev")
        resources.append({"mode": "managed", "type": "null_resource", "name": f"n{i}", "provider": NULL,
                          "instances": [{"schema_version": 0, "sensitive_attributes": marks, "attributes": {
                              "id": f"{state}-{i}", "triggers": {"env": env, "port": "80"},
                              "rules": [{"cidr": f"10.0.{i}.0/24"}]}}]})
    return json.dumps({"version": 4, "terraform_version": "1.8.5", "serial": 1, "lineage": f"l-{state}",
                       "outputs": {}, "resources": resources}).encode()


@pytest.fixture
def fleet(conn: psycopg.Connection) -> psycopg.Connection:
    from kilolock.store import states, versions

    for state in ("s1", "s2", "s3"):
        raw = _document(state)
        writes.store_document(conn, state, tfstate.parse_state(raw), raw, source="import", actor="test")
    for state, changed in OBSERVED.items():
        base = versions.current_version(conn, states.state_id(conn, state))
        assert base is not None
        raw = _document(state, changed)
        writes.record_observation(conn, state, tfstate.parse_state(raw), raw, base=base, same_as_base=False,
                                  touched={(f"null_resource.n{i}", "") for i in changed}, actor="test")
    return conn


def _keys(rows: list[store.InventoryRow]) -> list[tuple[str, str]]:
    return [(r["state"], r["address"]) for r in rows]


def _pages(conn: psycopg.Connection, f: store.Filters, size: int) -> list[store.InventoryRow]:
    out: list[store.InventoryRow] = []
    after = None
    while True:
        page = store.instances(conn, f, limit=size, after=after)
        out.extend(page)
        if len(page) < size:
            return out
        after = (page[-1]["state"], page[-1]["address"], page[-1]["deposed"] or "")


@pytest.mark.parametrize("gather_at_most", [0, 1_000], ids=["walk", "gather"])
@pytest.mark.parametrize("indexed", [True, False], ids=["index", "no-index"])
@pytest.mark.parametrize("text", ["triggers.env=prod", "triggers.port=80", "id=s3-4", "triggers.env=none",
                                  "rules[0].cidr=10.0.2.0/24"])
def test_both_ways_list_what_reading_every_instance_lists(fleet: psycopg.Connection, monkeypatch: pytest.MonkeyPatch,
                                                          gather_at_most: int, indexed: bool, text: str) -> None:
    f = store.filters(fleet, None, None, None, None, [inventory.where(text)], False)
    assert bool(f.wheres[0].contains) == (text[0] != "r")  # the index answers a scalar at keys
    # What reading every instance's value at the path finds: the view's rows filtered, as one query.
    read_all = store.Filters(wheres=tuple(store.Where(w.path, w.values, w.secret_types) for w in f.wheres))
    query, params = store._instances_query(read_all, None, None)
    expected = fleet.cursor(row_factory=class_row(store.InventoryRow)).execute(query, params).fetchall()
    if not indexed:
        f = read_all  # the candidates from every open row's value instead of the index
    monkeypatch.setattr(store, "GATHER_AT_MOST", gather_at_most)
    assert store.instances(fleet, f) == expected
    assert list(store.stream_instances(fleet, f)) == expected
    for size in (1, 2, 5):
        assert _pages(fleet, f, size) == expected


def test_the_values_are_matched_and_a_secret_never_is(fleet: psycopg.Connection) -> None:
    def listed(text: str) -> list[tuple[str, str]]:
        return _keys(store.instances(fleet, store.filters(fleet, None, None, None, None, [inventory.where(text)], False)))

    # as observed: s1's n1 now dev, s3's n2 now prod; s2's n3 marked secret
    assert listed("triggers.env=prod") == [("s1", "null_resource.n3"), ("s1", "null_resource.n5"), ("s2", "null_resource.n1"),
                                           ("s2", "null_resource.n5"), ("s3", "null_resource.n1"), ("s3", "null_resource.n2"),
                                           ("s3", "null_resource.n3"), ("s3", "null_resource.n5")]
    assert len(listed("triggers.port=80")) == 17  # "80" in a map of strings: the loose value; not s2's marked one
    assert listed("id=s2-3") == [("s2", "null_resource.n3")]  # the mark covers triggers only
    assert listed("rules[0].cidr=10.0.2.0/24") == [(s, "null_resource.n2") for s in ("s1", "s2", "s3")]


def test_containing_is_exact_for_a_scalar_at_keys_and_refuses_a_list_index() -> None:
    tags = sch.path_parse('tags["env"]')
    assert attrsearch.containing(tags, ['"prod"']) == attrsearch.Containing(('{"tags":{"env":"prod"}}',), True)
    assert attrsearch.containing(sch.path_parse("port"), ["80", '"80"']) == attrsearch.Containing(
        ('{"port":80}', '{"port":"80"}'), True)
    assert attrsearch.containing(sch.path_parse("tags"), ['{"env":"prod"}']) == attrsearch.Containing(
        ('{"tags":{"env":"prod"}}',), False)  # a larger object contains it too: still compared
    assert attrsearch.containing(sch.path_parse("rules[0].cidr"), ['"x"']) is None


def _ui_search(conn: psycopg.Connection, attr: str | None = None, **kw: Any) -> ui_queries.Page:
    if attr is not None:
        path, _, value = attr.partition("=")
        parsed = sch.path_parse(path)
        found = attrsearch.containing(parsed, [value])
        kw.update(path=attrsearch.path_steps(parsed), value=value,
                  contains=found.documents[0] if found else None, exact=bool(found and found.exact))
    with conn.transaction():
        ui_queries.read_only_snapshot(conn)
        return ui_queries.search(conn, ui_queries.Search(None, **kw), 4, 0)


def test_the_ui_search_counts_up_to_its_cap_and_says_more(fleet: psycopg.Connection,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    page = _ui_search(fleet, 'triggers.env="prod"')
    assert (len(page.rows), page.total, page.more) == (4, 8, False)
    assert [(r["state"], r["address"]) for r in page.rows] == [
        ("s1", "null_resource.n1"), ("s1", "null_resource.n3"), ("s1", "null_resource.n5"), ("s2", "null_resource.n1")]
    assert _ui_search(fleet, 'id="s2-3"').total == 1
    monkeypatch.setattr(ui_queries, "SEARCH_COUNT_CAP", 5)
    page = _ui_search(fleet, 'triggers.env="prod"')
    assert (len(page.rows), page.total, page.more) == (4, 5, True)
    page = _ui_search(fleet, type="null_resource")
    assert (page.total, page.more) == (5, True)


@pytest.mark.parametrize("gather_at_most", [0, 1_000], ids=["walk", "gather"])
def test_both_ways_keep_to_the_states_asked_for(fleet: psycopg.Connection, monkeypatch: pytest.MonkeyPatch,
                                                gather_at_most: int) -> None:
    ids = [str(r[0]) for r in fleet.execute("SELECT id FROM states WHERE name IN ('s1', 's3')")]
    f = store.filters(fleet, ids, None, None, None, [inventory.where("triggers.env=prod")], False)
    monkeypatch.setattr(store, "GATHER_AT_MOST", gather_at_most)
    assert _keys(_pages(fleet, f, 2)) == [("s1", "null_resource.n3"), ("s1", "null_resource.n5"), ("s3", "null_resource.n1"),
                                         ("s3", "null_resource.n2"), ("s3", "null_resource.n3"), ("s3", "null_resource.n5")]


def test_the_search_page_says_more_than_its_cap(fleet: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    from kilolock.server.access import Grant, Grants
    from kilolock.server.auth import Principal
    from kilolock.server.ui import pages, render

    def shown(**params: str) -> str:
        request = pages.Request(Principal("alice"), Grants("user:alice", (Grant("read", "**", "test"),)), "/ui/search",
                                {k: [v] for k, v in {"per": "4", **params}.items()})
        with fleet.transaction():
            ui_queries.read_only_snapshot(fleet)
            view = pages.search(fleet, request)
        return render.page(view.template, principal=request.principal, replica_lag=None, **view.context).decode()

    assert "8 results" in shown(attr='triggers["env"] = "prod"')
    monkeypatch.setattr(ui_queries, "SEARCH_COUNT_CAP", 5)
    html = shown(attr='triggers["env"] = "prod"')
    assert "more than 5 results" in html and "1–4 of more than 5" in html and "Page 1 of 2+" in html
    assert "Counted up to 5" in html
    assert "1 result<" in shown(attr='id = "s2-3"')
