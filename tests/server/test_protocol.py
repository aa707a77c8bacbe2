"""The HTTP backend protocol against a real server and database, request by request."""
from __future__ import annotations

import base64
import hashlib
import json

import psycopg
import pytest

from kilolock import tfstate
from kit.pg import one_row


def _lock_info(lock_id: str, who: str = "alice@host", op: str = "OperationTypeApply") -> dict:
    return {"ID": lock_id, "Operation": op, "Info": "", "Who": who, "Version": "1.0.3",
            "Created": "2026-11-29T12:00:00.123456789Z", "Path": ""}


def _versions(db_url: str, name: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute(
            """SELECT v.serial, v.source, v.actor, v.encrypted FROM state_versions v JOIN states s ON s.id = v.state_id
               WHERE s.name = %s ORDER BY serial""", (name,)).fetchall()


def _events(db_url: str, name: str) -> list[tuple]:
    with psycopg.connect(db_url) as c:
        return c.execute(
            """SELECT e.event, e.lock_id, e.who, e.actor FROM lock_events e JOIN states s ON s.id = e.state_id
               WHERE s.name = %s ORDER BY e.created_at, e.event""", (name,)).fetchall()


def test_get_post_and_the_serial_rule(client, db_url, make_state):
    assert client.request("GET", "/states/demo").status == 204
    s1 = make_state(1, {"a": {"id": "1"}})
    r = client.request("POST", "/states/demo", s1, md5=True)
    assert r.status == 200, r.text
    got = client.request("GET", "/states/demo")
    assert got.status == 200
    assert got.body.decode() == tfstate.pretty_state(s1.decode())
    assert got.headers["content-md5"] == base64.b64encode(hashlib.md5(got.body).digest()).decode()

    retry = client.request("POST", "/states/demo", s1, md5=True)
    assert retry.status == 200 and "nothing written" in retry.text
    stale = client.request("POST", "/states/demo", make_state(1, {"a": {"id": "other"}}))
    assert stale.status == 409 and "does not advance" in stale.text
    foreign = client.request("PUT", "/states/demo", make_state(5, {"a": {"id": "1"}}, lineage="lineage-2"))
    assert foreign.status == 409 and "lineage" in foreign.text
    assert client.request("PUT", "/states/demo", make_state(2, {"b": {"id": "2"}})).status == 200
    assert _versions(db_url, "demo") == [(1, "apply", "anonymous", False), (2, "apply", "anonymous", False)]
    with psycopg.connect(db_url) as c:
        life = c.execute("SELECT address, create_serial, delete_serial FROM resources ORDER BY create_serial").fetchall()
    assert life == [("null_resource.a", 1, 2), ("null_resource.b", 2, None)]


def test_new_lineage_is_accepted_only_on_an_empty_state(client, make_state):
    assert client.request("POST", "/states/e", make_state(1, {})).status == 200
    r = client.request("POST", "/states/e", make_state(2, {"a": {"id": "1"}}, lineage="fresh"))
    assert r.status == 200, r.text


def test_content_md5_is_verified(client, db_url, make_state):
    body = make_state(1, {"a": {"id": "1"}})
    wrong = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    r = client.request("POST", "/states/m", body, headers={"Content-MD5": wrong})
    assert r.status == 400 and "does not match" in r.text
    assert client.request("POST", "/states/m", body, headers={"Content-MD5": "!!"}).status == 400
    assert _versions(db_url, "m") == []


def test_lock_protocol_and_audit(client, db_url, make_state):
    a, b = _lock_info("id-a"), _lock_info("id-b", who="bob@ci")
    assert client.request("LOCK", "/states/l", a, md5=True).status == 200
    assert client.request("LOCK", "/states/l", a).status == 200  # a retry by the holder
    conflict = client.request("LOCK", "/states/l", b)
    assert conflict.status == 423 and conflict.json()["ID"] == "id-a" and conflict.json()["Who"] == "alice@host"

    s1 = make_state(1, {"a": {"id": "1"}})
    assert client.request("POST", "/states/l", s1).status == 423
    assert client.request("POST", "/states/l?ID=id-b", s1).json()["ID"] == "id-a"
    assert client.request("POST", "/states/l?ID=id-a", s1).status == 200

    wrong = client.request("UNLOCK", "/states/l", b)
    assert wrong.status == 423 and wrong.json()["ID"] == "id-a"
    assert client.request("UNLOCK", "/states/l", a).status == 200
    assert client.request("UNLOCK", "/states/l", a).status == 200  # already unlocked: retry-safe
    late = client.request("POST", "/states/l?ID=id-a", make_state(2, {}))
    assert late.status == 409 and "not held" in late.text
    assert _events(db_url, "l") == [("lock", "id-a", "alice@host", "anonymous"), ("unlock", "id-a", "alice@host", "anonymous")]


def test_force_unlock_needs_permission_and_is_audited(start_server, db_url):
    from kilolock.server.auth import Authenticator

    srv = start_server(auth=Authenticator(token="user-token", admin_token="admin-token"))
    user, admin = srv.with_auth("Bearer user-token"), srv.with_auth("Bearer admin-token")
    assert user.request("LOCK", "/states/f", _lock_info("held")).status == 200
    denied = user.request("UNLOCK", "/states/f", b"")
    assert denied.status == 403 and "admin" in denied.text
    assert user.request("LOCK", "/states/f", _lock_info("other")).status == 423
    assert user.request("DELETE", "/states/f").status == 403  # history is dropped only by an admin
    forced = admin.request("UNLOCK", "/states/f", b"")
    assert forced.status == 200 and "held" in forced.text
    # OpenTofu's force-unlock: a LockInfo with only the ID, checked against the holder.
    assert user.request("LOCK", "/states/f", _lock_info("again")).status == 200
    assert user.request("UNLOCK", "/states/f", {"ID": "nope"}).status == 423
    assert user.request("UNLOCK", "/states/f", {"ID": "again"}).status == 200
    assert [(e[0], e[1], e[3]) for e in _events(db_url, "f")] == [
        ("lock", "held", "token"), ("force_unlock", "held", "token"), ("lock", "again", "token"), ("force_unlock", "again", "token")]


def test_force_unlock_allowed_by_config(start_server):
    srv = start_server(allow_force_unlock=True)
    assert srv.request("LOCK", "/states/g", _lock_info("x")).status == 200
    assert srv.request("UNLOCK", "/states/g").status == 200
    assert srv.request("LOCK", "/states/g", _lock_info("y")).status == 200


def test_basic_auth_from_users_file_and_actor(start_server, db_url, tmp_path, make_state):
    from kilolock.server.auth import Authenticator, hash_password

    users = tmp_path / "users"
    users.write_text(f"# kl serve users\nalice:{hash_password('s3cret', n=2**10)}\nroot:{hash_password('pw', n=2**10)}:admin\n")
    srv = start_server(auth=Authenticator.from_config(str(users), env={}))
    assert srv.request("GET", "/states/x").status == 401
    assert srv.basic("alice", "wrong").request("GET", "/states/x").status == 401
    assert srv.basic("mallory", "s3cret").request("GET", "/states/x").status == 401
    assert srv.with_auth("Bearer s3cret").request("GET", "/states/x").status == 401
    alice = srv.basic("alice", "s3cret")
    assert alice.request("POST", "/states/x", make_state(1, {})).status == 200
    assert alice.request("POST", "/states/x", make_state(2, {})).status == 200  # second check: the verified cache
    assert _versions(db_url, "x")[-1][2] == "alice"
    assert alice.request("LOCK", "/states/x", _lock_info("k")).status == 200
    assert alice.request("UNLOCK", "/states/x", b"").status == 403
    assert srv.basic("root", "pw").request("UNLOCK", "/states/x", b"").status == 200


@pytest.mark.parametrize("content", [
    "alice\n", "alice:plaintext\n", "alice:scrypt$3$8$1$AAAA$AAAA\n", "a:scrypt$1024$8$1$AAAA$AAAAAAAAAAAAAAAAAAAAAA==:root\n", "",
])
def test_malformed_users_file_is_one_line_error(tmp_path, content):
    from kilolock.server.auth import AuthConfigError, load_users

    f = tmp_path / "users"
    f.write_text(content)
    with pytest.raises(AuthConfigError) as e:
        load_users(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("path, fragment", [
    ("/states/..", "not allowed"), ("/states/a/../b", "not allowed"), ("/states/%2e%2e/x", "not allowed"),
    ("/states/a%00b", "control character"), ("/states/a%0Ab", "control character"), ("/states/", "empty"),
    ("/states/" + "x" * 300, "at most 255"), ("/states/%ff", "UTF-8"), ("/states/a//b", "not allowed"),
])
def test_bad_state_names(client, path, fragment):
    r = client.request("GET", path)
    assert r.status == 400 and fragment in r.text and r.text.count("\n") == 1


def test_bad_bodies_are_one_line_client_errors(start_server, make_state):
    srv = start_server(max_body=4096)
    big = srv.request("POST", "/states/b", b"{" + b" " * 5000 + b"}")
    assert big.status == 413 and "at most 4096" in big.text
    for body, fragment in ((b"not json", "not valid JSON"), (b'{"version": 4}', "serial"), (b"[1]", "JSON object")):
        r = srv.request("POST", "/states/b", body)
        assert r.status == 400 and fragment in r.text, r.text
    for body, fragment in ((b"{}", '"ID"'), (b'{"ID": ""}', '"ID"'), (b"nope", "not valid JSON"), (b'{"ID": "x", "Who": 3}', '"Who"')):
        r = srv.request("LOCK", "/states/b", body)
        assert r.status == 400 and fragment in r.text, r.text
    assert srv.request("GET", "/nowhere").status == 404
    assert srv.request("POST", "/api/v1/states").status == 405


def test_delete(client, db_url, make_state):
    client.request("POST", "/states/d", make_state(1, {"a": {}}))
    assert client.request("LOCK", "/states/d", _lock_info("z")).status == 200
    assert client.request("DELETE", "/states/d").status == 423
    assert client.request("DELETE", "/states/d?ID=z").status == 200
    assert client.request("GET", "/states/d").status == 204
    assert client.request("DELETE", "/states/d").status == 200


def test_encrypted_envelope_is_stored_opaque(client, db_url, run_kl):
    env1 = {"meta": {"key_provider.pbkdf2.k": "eyJzYWx0Ijoi"}, "encrypted_data": "QUJD", "encryption_version": "v0"}
    env2 = dict(env1, encrypted_data="REVG")
    assert client.request("POST", "/states/enc", env1, md5=True).status == 200
    assert client.request("POST", "/states/enc", env1).status == 200  # identical retry
    assert client.request("POST", "/states/enc", env2).status == 200
    assert _versions(db_url, "enc") == [(1, "apply", "anonymous", True), (2, "apply", "anonymous", True)]
    got = client.request("GET", "/states/enc")
    assert got.status == 200 and json.loads(got.body) == env2
    with psycopg.connect(db_url) as c:
        assert one_row(c, "SELECT count(*) FROM resources")[0] == 0
    r = run_kl("refresh", "enc")
    assert r.returncode == 1 and "OpenTofu-encrypted" in r.stderr.decode()


def _envelope(serial: int, data: str, lineage: str = "lin-1") -> bytes:
    # As OpenTofu 1.8 marshals it (Go's json.Marshal of its statedata+basedata structs): compact,
    # serial and lineage in the clear first; "<" is escaped as Go escapes it.
    meta = {"key_provider.pbkdf2.k": "eyJzYWx0IjoiPCJ9", "key_provider.pbkdf2.a": "e30="}
    return (f'{{"serial":{serial},"lineage":"{lineage}","meta":{json.dumps(dict(sorted(meta.items())), separators=(",", ":"))},'
            f'"encrypted_data":"{data}","encryption_version":"v0"}}').encode()


def test_an_envelope_with_serial_and_lineage_in_the_clear_is_stored_at_its_serial(client, db_url, make_state, run_kl):
    assert client.request("POST", "/states/enc", _envelope(3, "QUJD"), md5=True).status == 200
    got = client.request("GET", "/states/enc")
    assert got.body == _envelope(3, "QUJD")  # byte for byte, though jsonb keeps neither order nor spacing
    assert run_kl("state", "pull", "enc").stdout == _envelope(3, "QUJD")
    assert client.request("POST", "/states/enc", _envelope(3, "QUJD")).status == 200  # identical retry
    stale = client.request("POST", "/states/enc", _envelope(3, "REVG"))
    assert stale.status == 409 and "serial 3" in stale.text, stale.text
    other = client.request("POST", "/states/enc", _envelope(5, "REVG", lineage="lin-2"))
    assert other.status == 409 and "lineage lin-1" in other.text, other.text
    assert client.request("POST", "/states/enc", _envelope(5, "REVG")).status == 200
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT serial, lineage, encrypted FROM state_versions ORDER BY serial").fetchall() == [
            (3, "lin-1", True), (5, "lin-1", True)]
    # Back to plain state (OpenTofu's decryption fallback): the same serial and lineage rules.
    assert client.request("POST", "/states/enc", make_state(5, {"a": {"id": "1"}}, lineage="lin-1")).status == 409
    assert client.request("POST", "/states/enc", make_state(6, {"a": {"id": "1"}}, lineage="lin-1")).status == 200
    bad = client.request("POST", "/states/enc", _envelope(7, "REVG").replace(b'"serial":7', b'"serial":"7"'))
    assert bad.status == 400 and '"serial" must be a whole number' in bad.text, bad.text
    assert _versions(db_url, "enc") == [(3, "apply", "anonymous", True), (5, "apply", "anonymous", True),
                                        (6, "apply", "anonymous", False)]


def test_json_api(client, db_url, make_state):
    from kilolock import tfstate as tfs
    from kilolock.store import writes

    client.request("POST", "/states/api", make_state(1, {"a": {"id": "1", "triggers": {"k": "old"}, "pw": "hunter2"}}))
    client.request("LOCK", "/states/api", _lock_info("L"))
    # A refresh-sourced version that changed the object: drift, with the sensitive value masked.
    raw = make_state(2, {"a": {"id": "1", "triggers": {"k": "new"}, "pw": "hunter3"}})
    doc = json.loads(raw)
    doc["resources"][0]["instances"][0]["sensitive_attributes"] = [[{"type": "get_attr", "value": "pw"}]]
    raw = json.dumps(doc).encode()
    with psycopg.connect(db_url, autocommit=True) as c:
        writes.store_document(c, "api", tfs.parse_state(raw), raw, source="refresh", actor="kl")

    states = client.request("GET", "/api/v1/states").json()["states"]
    assert [(s["name"], s["serial"], s["lock"]["ID"]) for s in states] == [("api", 2, "L")]
    vers = client.request("GET", "/api/v1/states/api/versions").json()["versions"]
    assert [(v["serial"], v["source"], v["encrypted"]) for v in vers] == [(1, "apply", False), (2, "refresh", False)]
    drift = client.request("GET", "/api/v1/states/api/drift").json()
    changes = {c["path"]: (c["before"], c["after"]) for c in drift["drift"][0]["changes"]}
    assert changes['triggers["k"]'] == ("old", "new")
    assert changes["pw"] == ("(sensitive)", "(sensitive)")
    assert "hunter" not in json.dumps(drift)
    assert (drift["drift"][0]["first_detected"]["serial"], drift["open"]) == (2, 1)
    everything = client.request("GET", "/api/v1/states/api/drift?all=1").json()
    assert (everything["all"], everything["total"]) == (True, 1)
    assert client.request("GET", "/api/v1/states/nope/versions").status == 404
    assert client.request("GET", "/healthz").json() == {"status": "ok"}


def test_api_states_are_kl_state_list_with_each_lock(client, db_url, run_kl, make_state):
    """The API's list is `kl state list --format json`'s rows, each with its lock's LockInfo (None
    when unlocked): a state written twice, one never written (locked first, as Terraform does
    before its first write: no serial), and one unlocked."""
    assert client.request("POST", "/states/team/a", make_state(1, {"a": {"id": "1"}})).status == 200
    assert client.request("POST", "/states/team/a", make_state(2, {"a": {"id": "2"}})).status == 200
    assert client.request("POST", "/states/b", make_state(1, {})).status == 200
    # Times as isoformat writes them: a trailing zero of the microseconds kept, none at all on the second.
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("UPDATE state_versions v SET created_at = CASE s.name WHEN 'team/a' THEN timestamptz '2026-01-02 03:04:05.12+00' "
                  "ELSE timestamptz '2026-01-02 03:04:05+00' END FROM states s WHERE s.id = v.state_id")
    assert client.request("LOCK", "/states/team/a", _lock_info("LA")).status == 200
    assert client.request("LOCK", "/states/new", _lock_info("LN", who='bob "the" \\ builder')).status == 200

    reply = client.request("GET", "/api/v1/states")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json", reply.headers
    listed = json.loads(run_kl("state", "list", "--format", "json").stdout)["states"]
    locks = {"team/a": _lock_info("LA"), "new": _lock_info("LN", who='bob "the" \\ builder')}
    assert [s["name"] for s in listed] == ["b", "new", "team/a"] and listed[1]["serial"] is None
    assert reply.json() == {"version": 1, "states": [{**s, "lock": locks.get(s["name"])} for s in listed]}


def test_chunked_bodies(start_server, make_state):
    """Terraform's force-unlock sends its (empty) body chunked; states may come chunked too."""
    import http.client
    from urllib.parse import urlsplit

    srv = start_server(allow_force_unlock=True, max_body=2048)
    u = urlsplit(srv.url)

    def send(method: str, chunks: list[bytes]) -> tuple[int, bytes]:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
        c.request(method, "/states/ch", body=iter(chunks), encode_chunked=True, headers={"Transfer-Encoding": "chunked"})
        r = c.getresponse()
        out = r.status, r.read()
        c.close()
        return out

    body = make_state(1, {"a": {"id": "1"}})
    assert send("POST", [body[:10], body[10:]])[0] == 200
    assert srv.request("LOCK", "/states/ch", _lock_info("c")).status == 200
    assert send("UNLOCK", [])[0] == 200
    status, text = send("POST", [b"x" * 1500, b"y" * 1500])
    assert status == 413 and b"2048" in text


def test_keep_alive_and_unread_bodies(client, make_state):
    """Terraform reuses its connection; an answer sent before the body was read must close it, or
    the body would be parsed as the next request."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(client.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    conn.request("POST", "/states/k", body=make_state(1, {}))
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("Connection") is None
    r.read()
    conn.request("GET", "/states/k")  # same connection
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["serial"] == 1
    conn.request("POST", "/states/..", body=b'GET /states/k HTTP/1.1\r\n\r\n')
    r = conn.getresponse()
    assert r.status == 400 and r.getheader("Connection") == "close"
    r.read()
    conn.close()
