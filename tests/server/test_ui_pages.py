"""The web UI over plain HTTP: authentication, headers, masking, search, pagination and errors.
What a browser does with the pages is tests/server/test_ui_browser.py."""
from __future__ import annotations

import json
import re
from urllib.parse import quote, urlencode

import pytest

from kit.httpclient import Client
from kit.uistates import SECRETS, populate

TOKEN = "ui-test-token"


@pytest.fixture
def ui(start_server, conn) -> Client:
    from kilolock.server.auth import Authenticator

    populate(conn)
    return start_server(auth=Authenticator(token=TOKEN)).basic("viewer", TOKEN)


def page(ui: Client, path: str, **params: str | int) -> str:
    reply = ui.request("GET", path + ("?" + urlencode(params) if params else ""))
    assert reply.status == 200, f"{path} {params}: {reply.status} {reply.text[:500]}"
    assert reply.headers["content-type"] == "text/html; charset=utf-8"
    return reply.text


def test_an_unauthenticated_request_is_refused_with_a_basic_challenge(ui: Client) -> None:
    for path in ("/ui/", "/ui/state?name=team/prod", "/ui/static/style.css", "/ui"):
        reply = ui.with_auth(None).request("GET", path)
        assert reply.status == 401, path
        assert reply.headers["www-authenticate"] == 'Basic realm="kilolock"'
        assert "team/prod" not in reply.text
    assert ui.basic("viewer", "wrong").request("GET", "/ui/").status == 401


def test_every_page_sends_the_security_headers(ui: Client) -> None:
    for path in ("/ui/", "/ui/state?name=team%2Fprod", "/ui/diff?state=team%2Fprod&from=1&to=5", "/ui/nope",
                 "/ui/static/style.css"):
        reply = ui.request("GET", path)
        csp = reply.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src" not in csp and "frame-ancestors 'none'" in csp, path
        assert reply.headers["x-content-type-options"] == "nosniff"
        assert reply.headers["referrer-policy"] == "no-referrer"
        assert reply.headers["x-frame-options"] == "DENY"
    assert ui.request("GET", "/ui/").headers["cache-control"] == "no-store"


def test_pages_load_nothing_from_elsewhere_and_run_no_script(ui: Client) -> None:
    for path in ("/ui/", "/ui/state?name=team%2Fprod", "/ui/search?attr=port+%3D+80"):
        html = ui.request("GET", path).text
        assert "<script" not in html.lower()
        assert not re.search(r"""(src|href)=["'](https?:)?//""", html), path
        assert " style=" not in html and "<style" not in html, "inline styles would need 'unsafe-inline'"


def test_the_overview_lists_sorts_and_filters_states(ui: Client) -> None:
    html = page(ui, "/ui/")
    assert html.index("sandbox") < html.index("team/dev") < html.index("team/prod")
    assert "1 drifted" in html  # team/prod: alpha's tags (bravo's drift was cleared by the apply)
    by_drift = page(ui, "/ui/", sort="drift", order="desc")
    assert by_drift.index("team/prod") < by_drift.index("sandbox")
    only_team = page(ui, "/ui/", q="team/*")
    assert "team/prod" in only_team and "team/dev" in only_team and ">sandbox<" not in only_team
    word = page(ui, "/ui/", q="prod")
    assert "team/prod" in word and "team/dev" not in word
    assert ui.request("GET", "/ui/?sort=bogus").status == 400


def test_the_overview_paginates_with_query_parameters(ui: Client, conn) -> None:
    from kit.uistates import null, write

    for i in range(12):
        write(conn, f"many/s{i:02}", 1, [null("n", {"i": str(i)})], "import", "x")
    first = page(ui, "/ui/", q="many/*", per=5)
    assert "many/s00" in first and "many/s04" in first and "many/s05" not in first
    assert "1–5 of 12" in first and 'rel="next"' in first
    third = page(ui, "/ui/", q="many/*", per=5, page=3)
    assert "many/s10" in third and "many/s11" in third and "many/s09" not in third and 'rel="next"' not in third


def test_the_overview_is_planned_for_the_states_it_shows_every_time(conn) -> None:
    """A page's statements take what the viewer may see (its grants) as parameters. psycopg prepares a statement at its sixth run on a connection, and PostgreSQL then
    switches to a generic plan, blind to that array: on 10,000 states kl serve's overview by
    drift went from 60 ms to 12-16 s at the eleventh request on a pooled connection."""
    from kilolock import globs
    from kilolock.store import ui_queries

    populate(conn)
    readable = [globs.sql_regex("team/**"), globs.sql_regex("sandbox")]  # a viewer's grants
    for sort in ui_queries.OVERVIEW_SORTS:
        for _ in range(12):
            with conn.transaction():
                ui_queries.read_only_snapshot(conn)
                assert ui_queries.states_overview(conn, readable, None, sort, True, 50, 0).total == 3
    prepared = conn.execute("SELECT count(*), count(*) FILTER (WHERE generic_plans > 0) FROM pg_prepared_statements "
                            "WHERE cardinality(parameter_types) > 0").fetchone()
    assert prepared == (len(ui_queries.OVERVIEW_SORTS), 0), "(statements prepared, planned without their parameters)"


def version_row(html: str, serial: int) -> tuple[str, ...]:
    """(source, actor, +added, ~changed, -removed) of Terraform's version SERIAL's row on a state
    page, labelled vSERIAL as `kl state versions` labels it (an observation of it is vSERIAL.N)."""
    row = re.search(rf'<th scope="row">v{serial}</th><td>(\w+)</td><td>([\w-]+)</td>.*?</tr>', html, re.DOTALL)
    assert row, f"no row of version {serial}"
    counts = re.findall(r'title="(?:added|changed|removed)">([-+~]\d+)<', row.group(0))
    return (row.group(1), row.group(2), *counts)


def test_the_state_page_shows_versions_runs_drift_and_rules(ui: Client, conn) -> None:
    conn.execute("INSERT INTO drift_ignore_rules (states_glob, states_regex, address_glob, address_regex, reason) "
                 "VALUES ('team/**', '^team/.*$', 'cloud_server.zulu', '^cloud_server\\.zulu$', 'noisy')")
    html = page(ui, "/ui/state", name="team/prod")
    # v4 (apply): delta added, bravo back to its applied tags (changed); v3 (refresh): charlie removed
    assert version_row(html, 4) == ("apply", "bob", "+1", "~1", "-0")
    assert version_row(html, 3) == ("refresh", "kl-refresh", "+0", "~1", "-1")
    assert version_row(html, 1) == ("import", "alice", "+4", "~0", "-0")
    assert "Open drift (1)" in html and "cloud_server.alpha" in html
    assert "&#34;prod&#34;" in html and "&#34;qa&#34;" in html  # alpha's tags["env"], before and after
    assert "noisy" in html and "cloud_server.zulu" in html
    assert "<svg" in html and "Open drift over time" in html


def test_sensitive_values_never_reach_a_page(ui: Client) -> None:
    pages = [page(ui, "/ui/state", name=n) for n in ("team/prod", "team/dev", "sandbox")]
    pages += [page(ui, "/ui/diff", state="team/prod", **{"from": a, "to": b}) for a in range(1, 6) for b in range(1, 6)]
    pages += [page(ui, "/ui/diff", state="sandbox", **{"from": 7, "to": 8})]
    pages += [page(ui, "/ui/resource", state="team/prod", address=a)
              for a in ("cloud_server.alpha", "cloud_server.bravo", "cloud_server.charlie", "null_resource.legacy")]
    pages += [page(ui, "/ui/resource", state="sandbox", address="null_resource.legacy")]
    for html in pages:
        for secret in SECRETS:
            assert secret not in html
    diff = page(ui, "/ui/diff", state="team/prod", **{"from": 1, "to": 2})
    assert "password" in diff and "(sensitive)" in diff  # the change is shown, its value is not
    assert "8080" in diff  # alpha's port: not a secret
    sandbox = page(ui, "/ui/diff", state="sandbox", **{"from": 7, "to": 8})
    assert "no schema" in sandbox  # without a schema every value is masked, and the page says why


def test_search_by_attribute_value_type_address_and_provider(ui: Client) -> None:
    found = page(ui, "/ui/search", attr='tags["env"] = "dev"')
    assert "cloud_server.echo" in found and "team/dev" in found and "cloud_server.alpha" not in found
    port = page(ui, "/ui/search", attr="port = 443")
    assert "cloud_server.delta" in port and "1 result<" in port
    assert "cloud_server.alpha" in page(ui, "/ui/search", attr="port = 8080")
    assert "0 results" in page(ui, "/ui/search", attr="port = \"8080\"")  # a JSON string is not the number
    typed = page(ui, "/ui/search", type="null_resource")
    assert "sandbox" in typed and "team/prod" in typed and "cloud_server" not in typed.split("results", 1)[1]
    globbed = page(ui, "/ui/search", address="cloud_server.*", provider="example/cloud")
    assert "4 results" in globbed  # alpha, bravo, delta in team/prod, echo in team/dev
    assert "cloud_server.charlie" not in globbed  # deleted: search looks at current instances only


def test_search_links_its_instances_in_the_inventory_api(ui: Client) -> None:
    import html
    import re

    found = page(ui, "/ui/search", type="cloud_server", attr='tags["env"] = "dev"')
    [link] = re.findall(r'href="(/api/v1/resources\?[^"]*)"', found)
    reply = ui.request("GET", html.unescape(link))
    assert reply.status == 200, reply.text
    assert [(r["state"], r["address"]) for r in reply.json()["resources"]] == [("team/dev", "cloud_server.echo")]


def test_search_finds_a_value_inside_a_dynamic_attribute_by_its_schema_path(ui: Client, conn) -> None:
    from kit.uistates import server, write

    spec = {"value": {"metadata": {"name": "web", "replicas": 3}},
            "type": ["object", {"metadata": ["object", {"name": "string", "replicas": "number"}]}]}
    write(conn, "k8s", 1, [server("kilo", extra={"spec": spec}), server("lima", extra={"spec": {**spec, "value": {"metadata": {
        "name": "api", "replicas": 3}}}})], "import", "alice")
    web = page(ui, "/ui/search", attr='spec.metadata.name = "web"')
    assert "cloud_server.kilo" in web and "1 result<" in web
    both = page(ui, "/ui/search", attr="spec.metadata.replicas = 3")
    assert "cloud_server.kilo" in both and "cloud_server.lima" in both and "2 results" in both
    whole = page(ui, "/ui/search", attr='spec = {"metadata": {"name": "api", "replicas": 3}}')
    assert "cloud_server.lima" in whole and "1 result<" in whole
    # The wrapper is how the value is stored, not a path anyone writes.
    assert "0 results" in page(ui, "/ui/search", attr='spec.value.metadata.name = "web"')


def test_search_never_answers_about_a_secret(ui: Client) -> None:
    for attr in ('password = "hunter2-alpha-secret"', 'password = "nope"'):
        html = page(ui, "/ui/search", attr=attr)
        assert "0 results" in html and "cloud_server.alpha" not in html.split("results", 1)[1]


def test_the_types_a_search_skips_as_secret_are_named_only_where_the_viewer_has_them(start_server, conn, run_kl) -> None:
    import json

    from kilolock.server.auth import Authenticator

    populate(conn)
    r = run_kl("token", "create", "sandbox-viewer", "--role", "read", "--states", "sandbox", "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    admin = page(start_server(auth=Authenticator(token=TOKEN)).basic("viewer", TOKEN), "/ui/search", attr='password = "nope"')
    assert "Not searched in cloud_server" in admin
    server = start_server(auth=Authenticator.from_config(None, env={}, kl_tokens=True))
    # cloud_server's schema calls password sensitive, but the sandbox holds no cloud_server: its
    # viewer is told nothing of a type in states it may not read.
    viewer = page(server.basic("sandbox-viewer", json.loads(r.stdout)["token"]), "/ui/search", attr='password = "nope"')
    assert "0 results" in viewer and "Not searched" not in viewer and "cloud_server" not in viewer


def test_bad_input_is_one_line_on_an_error_page(ui: Client) -> None:
    for path, status, says in [
        ("/ui/search?attr=" + quote("tags[env] = 1"), 400, "expected [NUMBER]"),
        ("/ui/search?attr=" + quote("port = eighty"), 400, "not a JSON literal"),
        ("/ui/search?attr=port", 400, "PATH = VALUE"),
        ("/ui/state?name=nope", 404, "no state named"),
        ("/ui/diff?state=team%2Fprod&from=1&to=99", 404, "no version with serial 99"),
        ("/ui/resource?state=team%2Fprod&address=nope.x", 404, "never held"),
        ("/ui/state?name=team%2Fprod&vpage=zero", 400, "not a whole number"),
        ("/ui/elsewhere", 404, "no such page"),
    ]:
        reply = ui.request("GET", path)
        assert reply.status == status, (path, reply.status, reply.text[:300])
        assert says in reply.text, (path, reply.text[:2000])
    assert ui.request("POST", "/ui/", body=b"").status == 405


def test_the_lifecycle_timeline_says_what_happened_and_who(ui: Client) -> None:
    html = page(ui, "/ui/resource", state="team/prod", address="cloud_server.bravo")
    events = re.findall(r"<strong>(.*?)</strong> at serial (\d+)", html)
    assert events == [("changed by apply", "4"), ("drifted (seen by refresh)", "3"), ("changed by apply", "2"), ("imported", "1")]
    charlie = page(ui, "/ui/resource", state="team/prod", address="cloud_server.charlie")
    assert re.findall(r"<strong>(.*?)</strong> at serial (\d+)", charlie)[0] == ("deleted outside Terraform (seen by refresh)", "3")
    paged = page(ui, "/ui/resource", state="team/prod", address="cloud_server.bravo", per=2, page=2)
    assert re.findall(r"<strong>(.*?)</strong> at serial (\d+)", paged) == [("changed by apply", "2"), ("imported", "1")]


def test_a_token_sees_only_the_states_its_grants_let_it_read(start_server, conn, run_kl) -> None:
    import json

    from kilolock.server.auth import Authenticator

    populate(conn)
    r = run_kl("token", "create", "dev-viewer", "--role", "read", "--states", "team/dev", "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    server = start_server(auth=Authenticator.from_config(None, env={}, kl_tokens=True))
    viewer = server.basic("dev-viewer", json.loads(r.stdout)["token"])
    overview = page(viewer, "/ui/")
    assert "team/dev" in overview and "team/prod" not in overview and ">sandbox<" not in overview
    # A state it may not read answers as one that does not exist, on every page that names it.
    for path in ("/ui/state?name=team%2Fprod", "/ui/diff?state=team%2Fprod&from=1&to=2",
                 "/ui/resource?state=team%2Fprod&address=cloud_server.alpha"):
        reply = viewer.request("GET", path)
        assert reply.status == 404 and "alpha" not in reply.text, (path, reply.status)
    found = page(viewer, "/ui/search", type="cloud_server").split("results", 1)[1]
    assert "team/dev" in found and "team/prod" not in found
    assert page(viewer, "/ui/state", name="team/dev")


def test_the_drift_chart_counts_open_drift_at_each_version(ui: Client, conn) -> None:
    from kilolock.server.ui import svg
    from kilolock.store import states, ui_queries

    series = ui_queries.drift_series(conn, states.state_id(conn, "team/prod"), 200)
    # v3's refresh found bravo changed and charlie deleted; v4's apply resolved both; v5 found alpha
    assert [(p["serial"], p["open"]) for p in series] == [(1, 0), (2, 0), (3, 2), (4, 0), (5, 1)]
    chart = svg.drift_chart(series)
    assert chart.count("<circle") == 5 and 'role="img"' in chart and "<desc" in chart
    assert "(v1 to v5): 0 then 1, growing; at most 2 (v3)" in svg.summary(series)
    assert svg.summary([]) == "No versions yet." and "<polyline" not in svg.drift_chart([])
    html = page(ui, "/ui/state", name="team/prod")
    assert "0 then 1, growing; at most 2 (v3)" in html


def test_a_page_reads_in_one_read_only_snapshot(conn) -> None:
    import psycopg

    from kilolock.store import ui_queries

    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction), conn.transaction():
        ui_queries.read_only_snapshot(conn)
        conn.execute("INSERT INTO states (name) VALUES ('nope')")


def test_a_secret_marked_inside_a_dynamic_value_never_reaches_a_page(ui: Client, conn) -> None:
    from kit.uistates import PASSWORD_MARK, server, write

    pin_mark = [{"type": "get_attr", "value": "spec"}, {"type": "get_attr", "value": "pin"}]

    def secret_server(pin: str, replicas: int) -> dict:
        spec = {"value": {"pin": pin, "replicas": replicas}, "type": ["object", {"pin": "string", "replicas": "number"}]}
        res = server("mike", extra={"spec": spec})
        res["instances"][0]["sensitive_attributes"] = [PASSWORD_MARK, pin_mark]
        return res

    write(conn, "dyn", 1, [secret_server("pin-one-secret", 1)], "import", "alice")
    write(conn, "dyn", 2, [secret_server("pin-two-secret", 2)], "refresh", "kl-refresh")
    pages = [page(ui, "/ui/resource", state="dyn", address="cloud_server.mike"), page(ui, "/ui/state", name="dyn"),
             page(ui, "/ui/diff", state="dyn", **{"from": 1, "to": 2})]
    for html in pages:
        assert "pin-one-secret" not in html and "pin-two-secret" not in html
    assert "replicas" in pages[2]  # the change beside it is shown
    assert "0 results" in page(ui, "/ui/search", attr='spec.pin = "pin-two-secret"')


def test_the_drift_chart_counts_what_the_open_drift_badge_counts(ui: Client, conn, run_kl) -> None:
    from kilolock.store import states, ui_queries
    from kit.uistates import server, write

    write(conn, "team/noisy", 1, [server("kilo"), server("lima")], "import", "alice")
    write(conn, "team/noisy", 2, [server("kilo", env="qa"), server("lima", env="qa")], "refresh", "kl-refresh")
    r = run_kl("drift", "ignore", "add", "--states", "team/noisy", "--address", "cloud_server.lima", "--reason", "flaps")
    assert r.returncode == 0, r.stderr.decode()
    html = page(ui, "/ui/state", name="team/noisy")
    # Two records open, one hidden by the rule: the badge, the chart and kl drift say 1.
    assert "1 drifted" in html and "Open drift (1)" in html
    assert "Open drift at the last 2 versions (v1 to v2): 0 then 1, growing; at most 1 (v2)." in html
    assert "Not counted: 1 hidden by ignore rules." in html and "+1 hidden by ignore rules" in html
    series = ui_queries.drift_series(conn, states.state_id(conn, "team/noisy"), 200)
    header = ui_queries.state_header(conn, "team/noisy")
    assert series[-1]["open"] == header["open_drift"] == 1 and header["ignored_drift"] == 1
    assert "1 drifted" in page(ui, "/ui/", q="noisy")
    # A resolved record counts where it was open, whatever rules say now (they hide open drift only).
    write(conn, "team/noisy", 3, [server("kilo"), server("lima")], "apply", "bob")
    series = ui_queries.drift_series(conn, states.state_id(conn, "team/noisy"), 200)
    assert [(p["serial"], p["open"]) for p in series] == [(1, 0), (2, 2), (3, 0)]
    assert "Not counted" not in page(ui, "/ui/state", name="team/noisy")


def test_drift_a_refresh_found_is_dated_by_the_observations_kl_drift_names(ui: Client, conn) -> None:
    # Since refreshes record observations, the serial alone (Terraform's, v1) no longer says which
    # refresh found the drift: the page names the versions as kl drift does (v1.1, v1.2).
    from kilolock import tfstate
    from kilolock.store import states, ui_queries, versions, writes
    from kit.uistates import document, server, write

    write(conn, "seen", 1, [server("kilo")], "import", "alice")
    base = versions.current_version(conn, states.state_id(conn, "seen"))
    assert base is not None
    raw = document(1, [server("kilo", env="qa")])
    for _ in range(2):
        writes.record_observation(conn, "seen", tfstate.parse_state(raw), raw, base=base,
                                  touched={("cloud_server.kilo", "")}, same_as_base=False, actor="kl-refresh")
    html = page(ui, "/ui/state", name="seen")
    assert "First seen at v1.1 (" in html and ", still there at v1.2." in html, html
    # The chart moves with the refreshes that found the drift, not only with Terraform's versions.
    series = ui_queries.drift_series(conn, states.state_id(conn, "seen"), 200)
    assert [(p["label"], p["open"]) for p in series] == [("v1", 0), ("v1.1", 1), ("v1.2", 1)]
    assert "Open drift at the last 3 versions (v1 to v1.2): 0 then 1, growing; at most 1 (v1.1)." in html
    # The instance's own page dates its drift record the same way.
    assert "<td>v1.1, " in page(ui, "/ui/resource", state="seen", address="cloud_server.kilo")


def runs_serials(html: str) -> list[str]:
    """The Serials cell of each refresh run on a state page, newest first, as text."""
    runs = html.split('<h2 id="runs">', 1)[1].split("</table>", 1)[0]
    cells = re.findall(r"<td>(\d+ → .*?)</td>", runs)
    return [re.sub(r"<[^>]+>", "", c) for c in cells]


def test_a_dry_run_is_labelled_in_the_runs_list(ui: Client, run_kl, make_state, tmp_path) -> None:
    from kit.paths import PLUGIN_CACHE

    search = ("--provider-search-path", str(PLUGIN_CACHE))
    r = run_kl("state", "import", "nulls", "-", "--source", "apply", input=make_state(9, {"a": {"id": "1", "triggers": None}}))
    assert r.returncode == 0, r.stderr.decode()
    dry = run_kl("refresh", "nulls", *search, "--dry-run")  # the real null provider
    assert dry.returncode == 0, dry.stderr.decode()
    assert runs_serials(page(ui, "/ui/state", name="nulls")) == ["9 → dry run"]
    # A refresh records an observation of v9 (Terraform's serial stays 9), and so does --commit
    # when it finds nothing different from v9.
    real = run_kl("refresh", "nulls", *search)
    assert real.returncode == 0, real.stderr.decode()
    assert runs_serials(page(ui, "/ui/state", name="nulls")) == ["9 → v9.1 (observed)", "9 → dry run"]
    committed = run_kl("refresh", "nulls", *search, "--commit")
    assert committed.returncode == 0, committed.stderr.decode()
    assert runs_serials(page(ui, "/ui/state", name="nulls")) == ["9 → v9.2 (observed)", "9 → v9.1 (observed)", "9 → dry run"]
    # A run that fails commits nothing either, and is not a dry run.
    failed = run_kl("refresh", "nulls", "--provider-search-path", str(tmp_path))  # no provider there
    assert failed.returncode != 0
    assert runs_serials(page(ui, "/ui/state", name="nulls")) == [
        "9 → (not committed)", "9 → v9.2 (observed)", "9 → v9.1 (observed)", "9 → dry run"]


def test_provider_addresses_are_shown_as_users_write_them(ui: Client) -> None:
    found = page(ui, "/ui/search", type="null_resource").split("results", 1)[1]
    text = found.replace("<wbr>", "")  # where a line may wrap: not part of the text
    assert re.findall(r"<code[^>]*>([^<]*hashicorp[^<]*)</code>", text) == ["registry.terraform.io/hashicorp/null"] * 2
    assert "provider[" not in found
    resource = page(ui, "/ui/resource", state="team/prod", address="cloud_server.alpha").replace("<wbr>", "")
    assert ">registry.terraform.io/example/cloud</code>" in resource and "provider[" not in resource


def test_attribute_paths_wrap_between_steps_not_inside_names(ui: Client, conn) -> None:
    from kilolock.server.ui import render
    from kit.uistates import server, write

    spec = {"value": {"metadata": {"name": "web"}}, "type": ["object", {"metadata": ["object", {"name": "string"}]}]}
    write(conn, "k8s", 1, [server("kilo", extra={"spec": spec})], "import", "alice")
    spec2 = {**spec, "value": {"metadata": {"name": "api"}}}
    write(conn, "k8s", 2, [server("kilo", extra={"spec": spec2}, env="qa")], "refresh", "kl-refresh")
    html = page(ui, "/ui/state", name="k8s")
    assert '<code class="path">spec.<wbr>metadata.<wbr>name</code>' in html
    assert '<code class="path">tags<wbr>[&#34;env&#34;]</code>' in html
    resource = page(ui, "/ui/resource", state="k8s", address="cloud_server.kilo")
    assert '<code class="path">spec.<wbr>metadata.<wbr>name</code>' in resource
    # Nothing lets a path break anywhere else (a mid-word break was what a phone showed).
    css = render.static("style.css")
    assert css is not None
    rules = [r for r in css.decode().split("}") if "overflow-wrap: anywhere" in r]
    assert not any("path" in r or ".changes" in r for r in rules), rules


def versions_rows(html: str) -> list[tuple[str, str]]:
    """(label, changes) of each row of a state page's versions table, newest first."""
    table = html.split('<table class="versions">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r'<th scope="row">([^<]+)</th>.*?</td><td>.*?</td><td>.*?</td>\s*<td>(.*?)</td>', table, re.DOTALL)
    return [(label, re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", changes)).strip()) for label, changes in rows]


def test_confirmations_are_folded_into_one_row_as_kl_state_versions_folds_them(ui: Client, run_kl, make_state) -> None:
    from kit.paths import PLUGIN_CACHE

    search = ("--provider-search-path", str(PLUGIN_CACHE))
    for serial in (3, 4):
        r = run_kl("state", "import", "quiet", "-", "--source", "apply",
                   input=make_state(serial, {"a": {"id": "1", "triggers": None}}))
        assert r.returncode == 0, r.stderr.decode()
        for _ in range(3 if serial == 3 else 1):
            refreshed = run_kl("refresh", "quiet", *search)  # the real null provider: nothing differs
            assert refreshed.returncode == 0, refreshed.stderr.decode()
    cli = run_kl("state", "versions", "quiet", "--format", "json")
    assert cli.returncode == 0, cli.stderr.decode()
    assert [v["confirms"] for v in json.loads(cli.stdout)["versions"]] == [False, True, True, True, False, True]
    rows = versions_rows(page(ui, "/ui/state", name="quiet"))
    # A run of confirmations never spans a Terraform version: v4's one is a row of its own.
    assert rows == [("v4.1", "confirmed unchanged"), ("v4", "+0 ~0 -0"),
                    ("v3.1-v3.3", "confirmed unchanged ×3"), ("v3", "+1 ~0 -0")]
    assert "Versions (4)" in page(ui, "/ui/state", name="quiet")
    second = page(ui, "/ui/state", name="quiet", per=2, vpage=2)
    assert versions_rows(second) == rows[2:]


def test_discovery_shows_each_scope_and_a_runs_objects_naming_only_readable_states(start_server, conn, run_kl) -> None:
    import json

    from kilolock.server.auth import Authenticator
    from kilolock.store import discovery_runs as dr

    populate(conn)
    source = "registry.terraform.io/kilolock/testfw"
    everyone = dr.begin(conn, dr.Scope(source, "", None, "testfw_thing", {"prefix": "x-"}), None, "t")
    claims = [{"state": "team/dev", "address": "cloud_server.alpha", "deposed": ""},
              {"state": "team/prod", "address": "cloud_server.alpha", "deposed": ""}]
    dr.finish(conn, everyone, [dr.Found({"id": "x-<1>"}, "thing x-1", "unmanaged", []),
                               dr.Found({"id": "alpha"}, "thing alpha", "managed twice", claims)], status="succeeded")
    prods = dr.begin(conn, dr.Scope(source, "", "team/prod", "testfw_thing", {}), None, "t")
    dr.finish(conn, prods, [], status="failed", error="provider exited")

    admin = start_server(auth=Authenticator(token=TOKEN)).basic("viewer", TOKEN)
    overview = page(admin, "/ui/discovery")
    assert f"/ui/discovery?run={everyone}" in overview and f"/ui/discovery?run={prods}" in overview
    assert "1 unmanaged" in overview and "(1 new)" in overview and "provider exited" in overview
    listed = page(admin, "/ui/discovery", run=everyone)
    assert "x-\\u003c1\\u003e" in listed and "<1>" not in listed  # an identity is data, escaped
    assert "managed twice" in listed and "team/prod" in listed and "in states you may not read" not in listed

    r = run_kl("token", "create", "dev-viewer", "--role", "read", "--states", "team/dev", "--format", "json")
    assert r.returncode == 0, r.stderr.decode()
    server = start_server(auth=Authenticator.from_config(None, env={}, kl_tokens=True))
    viewer = server.basic("dev-viewer", json.loads(r.stdout)["token"])
    overview = page(viewer, "/ui/discovery")
    assert f"run={everyone}" in overview and f"run={prods}" not in overview and "provider exited" not in overview
    listed = page(viewer, "/ui/discovery", run=everyone)
    assert "team/dev" in listed and "team/prod" not in listed and "1 in states you may not read" in listed
    assert viewer.request("GET", f"/ui/discovery?run={prods}").status == 404
    assert viewer.request("GET", "/ui/discovery?run=not-a-uuid").status == 404
