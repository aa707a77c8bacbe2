"""The identity index (resource_identities): which remote object each open instance is, kept by the
write path with the lifecycle rows, following Terraform's versions and the latest observation of
the current one; store.identities.claims is how an object is looked up."""
from __future__ import annotations

import json
from typing import Any

from kilolock import tfstate
from kilolock.store import identities, versions, writes

LOCAL = 'provider["registry.terraform.io/hashicorp/local"]'
AWSLIKE = 'provider["registry.terraform.io/acme/cloud"]'
SOURCE = "registry.terraform.io/acme/cloud"


def obj(id_: str, identity: dict[str, Any] | None = None, version: int = 0, **attrs: Any) -> dict[str, Any]:
    o: dict[str, Any] = {"schema_version": 0, "attributes": {"id": id_, **attrs}, "sensitive_attributes": []}
    if identity is not None:
        o["identity"], o["identity_schema_version"] = identity, version
    return o


def doc(serial: int, objects: dict[str, dict[str, Any]], *, provider: str = AWSLIKE, type_: str = "cloud_role",
        lineage: str = "l") -> bytes:
    return json.dumps({"version": 4, "terraform_version": "1.12.2", "serial": serial, "lineage": lineage, "outputs": {},
                       "resources": [{"mode": "managed", "type": type_, "name": name, "provider": provider,
                                      "instances": [o]} for name, o in objects.items()]}).encode()


def write(conn, name: str, raw: bytes, source: str = "apply") -> writes.WriteResult:
    return writes.store_document(conn, name, tfstate.parse_state(raw), raw, source=source, actor="t")


def observe(conn, name: str, raw: bytes, touched: set[tuple[str, str]]) -> writes.Observation:
    sid = conn.execute("SELECT id FROM states WHERE name = %s", (name,)).fetchone()[0]
    base = versions.current_version(conn, str(sid))
    assert base is not None
    return writes.record_observation(conn, name, tfstate.parse_state(raw), raw, base=base, touched=touched,
                                     same_as_base=not touched, actor="t")


def claimed(conn, *wanted: identities.Wanted, type_: str = "cloud_role") -> list[list[tuple[str, str, str]]]:
    return [[(c.state, c.address, c.evidence) for c in found]
            for found in identities.claims(conn, SOURCE, type_, list(wanted))]


ROLE_A = {"account_id": "111", "name": "deploy"}
ROLE_B = {"account_id": "222", "name": "deploy"}


def test_each_open_instance_is_keyed_by_its_identity_or_its_id(conn):
    write(conn, "prod", doc(1, {"a": obj("deploy", ROLE_A), "legacy": obj("old-role")}))
    write(conn, "dev", doc(1, {"b": obj("deploy", ROLE_B)}))
    rows = conn.execute("SELECT provider_source, provider_alias, type, identity_key IS NOT NULL, object_id, identity "
                        "FROM resource_identities ORDER BY object_id, identity_key").fetchall()
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [
        (SOURCE, "", "cloud_role", True, "deploy"), (SOURCE, "", "cloud_role", True, "deploy"),
        (SOURCE, "", "cloud_role", False, "old-role")]
    # the same name in two accounts is two objects: the identity decides, not the id
    assert claimed(conn, identities.Wanted(ROLE_A), identities.Wanted(ROLE_B)) == [
        [("prod", "cloud_role.a", "identity")], [("dev", "cloud_role.b", "identity")]]
    # key order and the schema version: one spelling of the identity, another version is another key
    assert claimed(conn, identities.Wanted({"name": "deploy", "account_id": "111"})) == [[("prod", "cloud_role.a", "identity")]]
    assert claimed(conn, identities.Wanted(ROLE_A, identity_schema_version=1)) == [[]]
    # without an identity on one side the id is the (weak) evidence
    assert claimed(conn, identities.Wanted(object_id="old-role"), identities.Wanted(ROLE_A, object_id="old-role")) == [
        [("prod", "cloud_role.legacy", "id")], [("prod", "cloud_role.a", "identity"), ("prod", "cloud_role.legacy", "id")]]
    assert identities.identity_key(conn, {"name": "deploy", "account_id": "111"}, 0) == identities.identity_key(conn, ROLE_A, 0)
    assert identities.identity_key(conn, {"name": None}, 0) is None


def test_a_new_version_closes_and_opens_index_rows_with_the_lifecycles(conn):
    write(conn, "prod", doc(1, {"a": obj("deploy", ROLE_A), "b": obj("x")}))
    write(conn, "prod", doc(2, {"b": obj("y")}))
    assert claimed(conn, identities.Wanted(ROLE_A), identities.Wanted(object_id="x"), identities.Wanted(object_id="y")) == [
        [], [], [("prod", "cloud_role.b", "id")]]
    open_rows = conn.execute("SELECT count(*) FROM resources WHERE delete_serial IS NULL").fetchone()[0]
    assert conn.execute("SELECT count(*) FROM resource_identities").fetchone()[0] == open_rows == 1


def test_the_latest_observation_decides_what_is_open(conn):
    base = {"a": obj("deploy", ROLE_A), "b": obj("x")}
    write(conn, "prod", doc(1, base))
    key = ("cloud_role.a", "")
    # a refresh found a gone and gave b its first identity (a read's new_identity)
    seen = observe(conn, "prod", doc(1, {"b": obj("x", {"id": "x"})}), {key, ("cloud_role.b", "")})
    assert seen.on_current
    assert claimed(conn, identities.Wanted(ROLE_A), identities.Wanted({"id": "x"})) == [
        [], [("prod", "cloud_role.b", "identity")]]
    # the next observation read both back as Terraform has them: a confirmation, no document
    observe(conn, "prod", doc(1, base), set())
    assert claimed(conn, identities.Wanted(ROLE_A), identities.Wanted({"id": "x"}), identities.Wanted(object_id="x")) == [
        [("prod", "cloud_role.a", "identity")], [], [("prod", "cloud_role.b", "id")]]
    # gone again, then Terraform writes a version: its objects are what is open, until observed again
    observe(conn, "prod", doc(1, {"b": obj("x")}), {key})
    assert claimed(conn, identities.Wanted(ROLE_A)) == [[]]
    write(conn, "prod", doc(2, {**base, "c": obj("z")}))
    assert claimed(conn, identities.Wanted(ROLE_A)) == [[("prod", "cloud_role.a", "identity")]]
    assert conn.execute("SELECT count(*) FROM resource_identities WHERE observed OR gone").fetchone()[0] == 0


def test_an_observation_of_an_old_version_changes_nothing(conn):
    write(conn, "prod", doc(1, {"a": obj("deploy", ROLE_A)}))
    sid = str(conn.execute("SELECT id FROM states WHERE name = 'prod'").fetchone()[0])
    old = versions.current_version(conn, sid)
    assert old is not None
    write(conn, "prod", doc(2, {"a": obj("deploy", ROLE_A), "b": obj("x")}))
    raw = doc(1, {})
    seen = writes.record_observation(conn, "prod", tfstate.parse_state(raw), raw, base=old,
                                     touched={("cloud_role.a", "")}, same_as_base=False, actor="t")
    assert not seen.on_current
    assert claimed(conn, identities.Wanted(ROLE_A)) == [[("prod", "cloud_role.a", "identity")]]


def test_the_migration_fills_the_index_from_a_released_store(empty_db_url):
    import psycopg

    from kilolock.store.migrate import apply_migrations, bundled_migrations
    from kit import upgrade as upgradekit

    fixture = upgradekit.FIXTURES / "schema-0022.sql"
    with psycopg.connect(empty_db_url, autocommit=True) as c:
        apply_migrations(c, upgradekit.released_migrations("0022"))
        upgradekit.load(c, fixture.read_text(encoding="utf-8"))
        # an identity as Terraform >= 1.12 writes it, in the piece that holds an open object
        found = c.execute(
            "SELECT p.id, p.attributes_of FROM version_pieces p JOIN resources r ON r.id = p.attributes_of "
            "WHERE r.delete_serial IS NULL AND NOT p.body ? 'instances' ORDER BY p.id LIMIT 1").fetchone()
        assert found is not None
        piece, rid = found
        c.execute("UPDATE version_pieces SET body = body || %s::jsonb WHERE id = %s",
                  (json.dumps({"identity": {"id": "x1"}, "identity_schema_version": 2}), piece))
        apply_migrations(c, bundled_migrations())
        counts = c.execute("SELECT (SELECT count(*) FROM resources WHERE delete_serial IS NULL), "
                           "(SELECT count(*) FROM resource_identities)").fetchone()
        assert counts is not None and counts[0] > 0 and counts[0] == counts[1]
        # the provider source as tfstate.parse_provider reads the address, legacy ones resolved
        for provider, source, alias in c.execute(
                "SELECT DISTINCT r.provider, x.provider_source, x.provider_alias FROM resource_identities x "
                "JOIN resources r ON r.id = x.resource_id").fetchall():
            ref = tfstate.parse_provider(provider)
            assert (source, alias) == (ref.source, ref.alias)
        row = c.execute("SELECT identity, identity_schema_version, identity_key IS NOT NULL FROM resource_identities "
                        "WHERE resource_id = %s", (rid,)).fetchone()
        assert row == ({"id": "x1"}, 2, True)


def test_deleting_a_state_takes_its_index_rows_with_it(conn):
    from kilolock.store import states

    write(conn, "prod", doc(1, {"a": obj("deploy", ROLE_A)}))
    write(conn, "dev", doc(1, {"b": obj("deploy", ROLE_B)}))
    with conn.transaction():
        sid = states.lock_state_row(conn, "prod", create=False)
        assert sid is not None
        states.delete_state(conn, sid)
    assert claimed(conn, identities.Wanted(ROLE_A), identities.Wanted(ROLE_B)) == [[], [("dev", "cloud_role.b", "identity")]]
    assert conn.execute("SELECT count(*) FROM resource_identities").fetchone() == (1,)


def _index_as_recomputed(conn) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The index's rows, and the rows its definition gives every open lifecycle row from scratch."""
    held = conn.execute("SELECT resource_id, provider_source, provider_alias, identity, identity_schema_version, "
                        "identity_key, object_id, observed, gone FROM resource_identities ORDER BY resource_id").fetchall()
    fresh = conn.execute("SELECT id, kl_provider_source(provider), kl_provider_alias(provider), identity, identity_schema_version, "
                         "kl_identity_key(identity, identity_schema_version), kl_object_id(attributes), false, false "
                         "FROM resources WHERE delete_serial IS NULL ORDER BY id").fetchall()
    return held, fresh


def test_a_row_a_version_changes_in_place_follows_it(conn):
    # A write sets the rows of the lifecycles it opens and of those it changes in place (a first
    # identity, another provider address, another identity schema version), and only those: the
    # index must still be what its definition gives every open row.
    write(conn, "prod", doc(1, {"a": obj("deploy"), "b": obj("x"), "c": obj("z", ROLE_B)}))
    steps = [
        doc(2, {"a": obj("deploy", ROLE_A), "b": obj("x"), "c": obj("z", ROLE_B)}),  # a's first identity
        doc(3, {"a": obj("deploy", ROLE_A), "b": obj("x"), "c": obj("z", ROLE_B)}, provider=AWSLIKE + ".west"),
        doc(4, {"a": obj("deploy", ROLE_A, version=1), "b": obj("y"), "c": obj("z", ROLE_B)}, provider=AWSLIKE + ".west"),
    ]
    for raw in steps:
        write(conn, "prod", raw)
        held, fresh = _index_as_recomputed(conn)
        assert held == fresh
    assert claimed(conn, identities.Wanted(ROLE_A, identity_schema_version=1), identities.Wanted(object_id="y")) == [
        [("prod", "cloud_role.a", "identity")], [("prod", "cloud_role.b", "id")]]
    assert {r[2] for r in held} == {"west"}


def test_an_observation_that_differs_only_where_nothing_is_indexed_resets_what_earlier_ones_put_in_place(conn):
    # A refresh whose reads differ from the base only in what the index never holds (a provider's
    # private data) records its document, finds nothing, and the index is Terraform's again.
    base = {"a": obj("deploy", ROLE_A), "b": obj("x")}
    write(conn, "prod", doc(1, base))
    observe(conn, "prod", doc(1, {"b": obj("x")}), {("cloud_role.a", "")})
    assert claimed(conn, identities.Wanted(ROLE_A)) == [[]]
    sid = str(conn.execute("SELECT id FROM states WHERE name = 'prod'").fetchone()[0])
    current = versions.current_version(conn, sid)
    assert current is not None
    raw = doc(1, {**base, "b": {**obj("x"), "private": "bmV3"}})
    seen = writes.record_observation(conn, "prod", tfstate.parse_state(raw), raw, base=current, touched=set(),
                                     same_as_base=False, actor="t")
    assert (seen.on_current, seen.found) == (True, 0)
    assert conn.execute("SELECT raw_state IS NOT NULL OR head_piece IS NOT NULL FROM state_versions WHERE id = %s",
                        (seen.version.id,)).fetchone() == (True,)
    assert claimed(conn, identities.Wanted(ROLE_A)) == [[("prod", "cloud_role.a", "identity")]]
    held, fresh = _index_as_recomputed(conn)
    assert held == fresh
