"""States for the web UI's tests and bench: servers of a made-up provider whose cached schema calls
`password` sensitive, written through the write path (store.writes) as
imports, applies and refreshes, so versions, lifecycles and drift records are kl's own."""
from __future__ import annotations

import json
from typing import Any

import psycopg

CLOUD = 'provider["registry.terraform.io/example/cloud"]'
CLOUD_SOURCE = "registry.terraform.io/example/cloud"
NULL = 'provider["registry.terraform.io/hashicorp/null"]'
PASSWORD_MARK = [{"type": "get_attr", "value": "password"}]
# Secrets that must never reach a page: each is a password of some version of some server.
SECRETS = ("hunter2-alpha-secret", "hunter2-bravo-secret", "hunter2-bravo-rotated", "nullsecret-charlie")


def server(name: str, *, port: int = 80, env: str = "prod", password: str = "hunter2-alpha-secret",
           extra: dict[str, Any] | None = None, marked: bool = True) -> dict[str, Any]:
    attrs = {"id": f"srv-{name}", "name": name, "port": port, "tags": {"env": env, "team": "core"}, "password": password,
             **(extra or {})}
    return {"mode": "managed", "type": "cloud_server", "name": name, "provider": CLOUD,
            "instances": [{"schema_version": 0, "attributes": attrs, "sensitive_attributes": [PASSWORD_MARK] if marked else []}]}


def null(name: str, triggers: dict[str, str]) -> dict[str, Any]:
    return {"mode": "managed", "type": "null_resource", "name": name, "provider": NULL,
            "instances": [{"schema_version": 0, "attributes": {"id": f"null-{name}", "triggers": triggers},
                           "sensitive_attributes": []}]}


def document(serial: int, resources: list[dict[str, Any]], lineage: str = "ui-lineage") -> bytes:
    return json.dumps({"version": 4, "terraform_version": "1.8.5", "serial": serial, "lineage": lineage,
                       "outputs": {}, "resources": resources}).encode()


def write(conn: psycopg.Connection, name: str, serial: int, resources: list[dict[str, Any]], source: str,
          actor: str, lineage: str = "ui-lineage") -> None:
    from kilolock import tfstate
    from kilolock.store import writes

    raw = document(serial, resources, lineage)
    writes.store_document(conn, name, tfstate.parse_state(raw), raw, source=source, actor=actor)


def cache_cloud_schema(conn: psycopg.Connection) -> None:
    """The provider's schema as a refresh would have cached it: `password` sensitive, `spec` dynamic
    (stored as Terraform's {"value": ..., "type": ...} wrapper)."""
    from kilolock import schema as sch
    from kilolock.store import provider_schemas

    block = sch.Block(attributes=(
        sch.Attribute("id", b'"string"', computed=True), sch.Attribute("name", b'"string"', required=True),
        sch.Attribute("port", b'"number"', optional=True), sch.Attribute("tags", b'["map","string"]', optional=True),
        sch.Attribute("password", b'"string"', optional=True, sensitive=True),
        sch.Attribute("notes", b'"string"', optional=True), sch.Attribute("spec", b'"dynamic"', optional=True)))
    ps = sch.ProviderSchema(6, sch.Schema(0, sch.Block()), {"cloud_server": sch.Schema(0, block)})
    provider_schemas.put(conn, CLOUD_SOURCE, "1.0.0", ps)


def populate(conn: psycopg.Connection) -> None:
    """Two states with history and drift, and one without any:

    - team/prod: servers alpha, bravo, charlie and null_resource.legacy over five versions: an
      import; an apply that changes alpha's port and rotates bravo's password; a refresh that finds
      bravo's tags changed out of band (drift) and charlie deleted; an apply; a refresh that finds
      alpha's tags changed (drift, still open).
    - team/dev: one server, tagged env = "dev".
    - sandbox: null_resource.legacy only (a provider without a cached schema: all values masked).
    """
    cache_cloud_schema(conn)
    legacy = null("legacy", {"secretish": "nullsecret-charlie"})
    write(conn, "team/prod", 1, [server("alpha"), server("bravo", password="hunter2-bravo-secret"), server("charlie", port=22), legacy],
          "import", "alice")
    write(conn, "team/prod", 2, [server("alpha", port=8080), server("bravo", password="hunter2-bravo-rotated"),
                                 server("charlie", port=22), legacy], "apply", "alice")
    write(conn, "team/prod", 3, [server("alpha", port=8080), server("bravo", env="staging", password="hunter2-bravo-rotated"),
                                 legacy], "refresh", "kl-refresh")
    write(conn, "team/prod", 4, [server("alpha", port=8080), server("bravo", password="hunter2-bravo-rotated"),
                                 server("delta", port=443), legacy], "apply", "bob")
    write(conn, "team/prod", 5, [server("alpha", port=8080, env="qa"), server("bravo", password="hunter2-bravo-rotated"),
                                 server("delta", port=443), legacy], "refresh", "kl-refresh")
    write(conn, "team/dev", 1, [server("echo", env="dev", port=3000)], "import", "carol")
    write(conn, "sandbox", 7, [null("legacy", {"secretish": "nullsecret-charlie"})], "import", "carol", lineage="sb")
    write(conn, "sandbox", 8, [null("legacy", {"secretish": "nullsecret-charlie", "round": "2"})], "apply", "carol", lineage="sb")
