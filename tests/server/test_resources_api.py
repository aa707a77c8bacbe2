"""The fleet inventory over real states: Terraform 1.8.5 applies null, local and random resources to
two states through kl serve; `kl resources` lists them, `--duplicates` finds the one object both
claim by id alone (local_file's id is a hash of its content, so it is only `likely`, and not at all
once the states' provider configurations differ), and GET /api/v1/resources returns the same
objects a page at a time, only of the states the caller may read."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kit.paths import LOCAL_V, RANDOM_V
from kit.tfcli import Workspace, terraform_block, tool_binary

ROOT = ("root", "root-pw")


def config(url: str, out: Path, env: str) -> str:
    return terraform_block({"null": "2.1.2", "local": LOCAL_V, "random": RANDOM_V}, url) + f"""
resource "null_resource" "n" {{
  triggers = {{ env = "{env}", port = "80" }}
}}
resource "local_file" "same" {{
  filename = "{out}/same.txt"
  content  = "one content"
}}
resource "random_id" "r" {{
  byte_length = 4
}}
"""


@pytest.fixture
def fleet(start_server, tmp_path: Path, run_kl) -> Any:
    from kilolock.server.auth import Authenticator, hash_password

    users = tmp_path / "users"
    users.write_text(f"root:{hash_password('root-pw', n=2**10)}:admin\n")
    server = start_server(auth=Authenticator.from_config(str(users), env={}, kl_tokens=True))
    binary = tool_binary("terraform-1.8.5")
    for name, env in (("net/a", "prod"), ("app/b", "dev")):
        d = tmp_path / name.replace("/", "-")
        d.mkdir()
        ws = Workspace("terraform-1.8.5", binary, d, f"{server.url}/states/{name}", *ROOT)
        (d / "main.tf").write_text(config(ws.url, d / "out", env))
        ws.run("init", "-input=false", "-no-color")
        ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    return server


def ok(r: Any) -> Any:
    assert r.returncode == 0, r.stderr.decode()
    return r


def listed(run_kl, *args: str) -> list[tuple[str, str]]:
    rows = json.loads(ok(run_kl("resources", "--format", "json", *args)).stdout)
    return [(r["state"], r["address"]) for r in rows]


def test_inventory_duplicates_and_the_api_over_real_states(fleet, run_kl, db_url, tmp_path: Path) -> None:
    every = [("app/b", "local_file.same"), ("app/b", "null_resource.n"), ("app/b", "random_id.r"),
             ("net/a", "local_file.same"), ("net/a", "null_resource.n"), ("net/a", "random_id.r")]
    assert listed(run_kl) == every
    rows = json.loads(ok(run_kl("resources", "--format", "json", "--states", "net/*")).stdout)
    assert {r["address"]: (r["provider"], r["evidence"], r["status"], r["drift"]) for r in rows} == {
        "local_file.same": ("registry.terraform.io/hashicorp/local", "id", "ready", None),
        "null_resource.n": ("registry.terraform.io/hashicorp/null", "id", "ready", None),
        "random_id.r": ("registry.terraform.io/hashicorp/random", "id", "ready", None)}
    assert listed(run_kl, "--type", "local_*") == [("app/b", "local_file.same"), ("net/a", "local_file.same")]
    assert listed(run_kl, "--provider", "random") == [("app/b", "random_id.r"), ("net/a", "random_id.r")]
    assert listed(run_kl, "--where", "triggers.env=prod") == [("net/a", "null_resource.n")]
    assert listed(run_kl, "--where", "triggers.port=80", "--where", "triggers.env=dev") == [("app/b", "null_resource.n")]
    table = ok(run_kl("resources", "--address", "random_id.*")).stdout.decode()
    assert table.splitlines()[0].split() == ["STATE", "ADDRESS", "TYPE", "PROVIDER", "IDENTITY", "/", "ID", "STATUS", "DRIFT"]
    assert "2 instance(s)" in table

    # local_file's id is the hash of its content: the same in both states, with no provider
    # configuration stored for either, so a likely duplicate; random's ids differ. null 2.1.2's id
    # is math/rand's first number, which its Go seeds alike in every process unless the build
    # seeds it: equal ids there are the same evidence, and reported as such.
    ids = {(r["state"], r["type"]): r["id"] for r in json.loads(ok(run_kl("resources", "--format", "json")).stdout)}
    null_twice = ids[("app/b", "null_resource")] == ids[("net/a", "null_resource")]
    null_group = [("likely", "id", "null_resource", ["app/b", "net/a"])] if null_twice else []
    groups = json.loads(ok(run_kl("resources", "--duplicates", "--format", "json")).stdout)
    assert [(g["confidence"], g["evidence"], g["type"], [c["state"] for c in g["claims"]]) for g in groups] == [
        ("likely", "id", "local_file", ["app/b", "net/a"]), *null_group]
    # a group with a claim among --states comes whole, the other state's claim with it
    assert json.loads(ok(run_kl("resources", "--duplicates", "--format", "json", "--states", "app/*")).stdout) == groups
    (tmp_path / "local.json").write_text('{"note": "another account"}')
    ok(run_kl("provider", "configure", "hashicorp/local", "--state", "app/b", "--config", str(tmp_path / "local.json")))
    assert [g["type"] for g in json.loads(ok(run_kl("resources", "--duplicates", "--format", "json")).stdout)] == [
        g[2] for g in null_group]

    # the API: the same objects, a page at a time, of the states the caller may read
    admin = fleet.basic(*ROOT)
    got, cursor = [], None
    while True:
        page = admin.request("GET", "/api/v1/resources?limit=4" + (f"&cursor={cursor}" if cursor else ""))
        assert page.status == 200, page.text
        body = page.json()
        got += body["resources"]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert [(r["state"], r["address"]) for r in got] == every
    assert got == json.loads(ok(run_kl("resources", "--format", "json")).stdout)
    token = json.loads(ok(run_kl("token", "create", "ci-net", "--role", "read", "--states", "net/*",
                                 "--format", "json")).stdout)["token"]
    reader = fleet.with_auth(f"Bearer {token}")
    body = reader.request("GET", "/api/v1/resources").json()
    assert [(r["state"], r["address"]) for r in body["resources"]] == every[3:]
    assert reader.request("GET", "/api/v1/resources?states=app/**").json()["resources"] == []
    typed = reader.request("GET", "/api/v1/resources?type=null_resource&where=triggers.env%3Dprod").json()["resources"]
    assert [r["address"] for r in typed] == ["null_resource.n"]
    for query, fragment in (("where=triggers", "PATH=VALUE"), ("limit=0", "limit"), ("cursor=zz", "cursor"),
                            ("type=a%20b", "type glob")):
        bad = reader.request("GET", f"/api/v1/resources?{query}")
        assert bad.status == 400 and fragment in bad.text, (query, bad.text)


def test_the_docs_sql_cookbook_runs_against_the_inventory_view(fleet, db_url) -> None:
    import re

    from kit.fleet import q
    from kit.paths import REPO

    page = (REPO / "docs" / "inventory.md").read_text(encoding="utf-8")
    cookbook = page.split("## SQL cookbook", 1)[1].split("```sql", 1)[1].split("```", 1)[0]
    queries = [x.strip() for x in re.split(r";\s*\n", cookbook) if x.strip()]
    assert len(queries) == 3
    by_type = q(db_url, queries[0])
    assert {(r[0], r[1]) for r in by_type} == {("registry.terraform.io/hashicorp/null", "null_resource"),
                                                ("registry.terraform.io/hashicorp/local", "local_file"),
                                                ("registry.terraform.io/hashicorp/random", "random_id")}
    assert all(r[2] == 2 and r[3] == 2 for r in by_type)
    assert q(db_url, queries[1]) == []  # no bucket in these states
    assert q(db_url, queries[2]) == []  # nor a module.net


def test_the_readme_tour_sql_runs_against_its_views(fleet, db_url) -> None:
    import re

    from kit.fleet import q
    from kit.paths import REPO

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("### 7. Ask the database", 1)[1].split("```sql", 1)[1].split("```", 1)[0]
    queries = [x.strip() for x in re.split(r";\s*\n", block) if x.strip()]
    assert len(queries) == 2
    assert q(db_url, queries[0]) == []  # these states have no drift
    assert {(r[0], r[1]) for r in q(db_url, queries[1])} == {("registry.terraform.io/hashicorp/null", "null_resource"),
                                                              ("registry.terraform.io/hashicorp/local", "local_file"),
                                                              ("registry.terraform.io/hashicorp/random", "random_id")}


def _duplicate_pages(client: Any, query: str, limit: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = client.request("GET", f"/api/v1/resources?duplicates=1&limit={limit}{query}"
                                     + (f"&cursor={cursor}" if cursor else ""))
        assert page.status == 200, page.text
        body = page.json()
        assert len(body["duplicates"]) <= limit
        got += body["duplicates"]
        cursor = body["next_cursor"]
        if cursor is None:
            return got


def test_duplicates_over_the_api_are_paged_and_name_only_the_states_the_caller_may_read(fleet, run_kl, tmp_path: Path) -> None:
    # net/c: a copy of net/a's state, so that each of net/a's objects is claimed twice (by id: no
    # identities before Terraform 1.12), local_file's by app/b as well.
    copy = tmp_path / "copy.tfstate"
    copy.write_bytes(ok(run_kl("state", "pull", "net/a")).stdout)
    ok(run_kl("state", "import", "net/c", str(copy), "--source", "apply"))
    everything = json.loads(ok(run_kl("resources", "--duplicates", "--format", "json")).stdout)
    assert len(everything) >= 3 and any(len(g["claims"]) == 3 for g in everything)

    def same(groups: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((g["provider"], g["type"], g["confidence"], g["key"], json.dumps(g["claims"], sort_keys=True))
                      for g in groups)

    admin = fleet.basic(*ROOT)
    paged = _duplicate_pages(admin, "", limit=1)
    assert same(paged) == same(everything)  # every group once, across pages of one
    assert all(g["hidden_claims"] == 0 for g in paged)
    # null 2.1.2's ids may be equal in both states (see above): which groups hold a claim in app/b
    # is read from the data; local_file's always does.
    in_app = [g for g in paged if any(c["state"].startswith("app/") for c in g["claims"])]
    assert "local_file" in [g["type"] for g in in_app]
    assert _duplicate_pages(admin, "&states=app/*", limit=100) == in_app

    token = json.loads(ok(run_kl("token", "create", "ci-app", "--role", "read", "--states", "app/*",
                                 "--format", "json")).stdout)["token"]
    reader = fleet.with_auth(f"Bearer {token}")
    seen = _duplicate_pages(reader, "", limit=1)
    assert [(g["type"], g["key"]) for g in seen] == [(g["type"], g["key"]) for g in in_app]
    for group, full in zip(seen, in_app, strict=True):
        assert [c["state"] for c in group["claims"]] == ["app/b"]
        assert group["hidden_claims"] == len(full["claims"]) - 1
    local = next(g for g in seen if g["type"] == "local_file")
    assert local["hidden_claims"] == 2  # net/a and its copy net/c
    assert "net/" not in json.dumps(seen)
    assert _duplicate_pages(reader, "&states=net/**", limit=10) == []

    for query, fragment in (("type=local_file", "not type"), ("limit=1001", "limit"), ("cursor=zz", "cursor"),
                            ("drifted=1", "not drifted")):
        bad = admin.request("GET", f"/api/v1/resources?duplicates=1&{query}")
        assert bad.status == 400 and fragment in bad.text, (query, bad.text)
