"""`kl drift ignore add` with globs that match nothing: a note on stderr naming the closest state or
address (the rule is stored all the same: it may come before its states), and an address glob not
written as Terraform writes addresses refused before anything is stored."""
from __future__ import annotations

import json

import pytest

from kit.states import NULL_PROVIDER


def keyed_state(serial: int) -> bytes:
    """local_file.config with for_each keys a and b, and null_resource.web."""
    return json.dumps({"version": 4, "terraform_version": "1.8.5", "serial": serial, "lineage": "l", "outputs": {}, "resources": [
        {"mode": "managed", "type": "local_file", "name": "config", "provider": NULL_PROVIDER,
         "instances": [{"index_key": k, "schema_version": 0, "attributes": {"id": k}, "sensitive_attributes": []}
                       for k in ("a", "b")]},
        {"mode": "managed", "type": "null_resource", "name": "web", "provider": NULL_PROVIDER,
         "instances": [{"schema_version": 0, "attributes": {"id": "w"}, "sensitive_attributes": []}]},
    ]}).encode()


@pytest.fixture
def demo(db_url, run_kl):
    r = run_kl("state", "import", "demo", "-", input=keyed_state(1))
    assert r.returncode == 0, r.stderr
    return db_url


def add(run_kl, states: str, address: str) -> tuple[int, str, str]:
    r = run_kl("drift", "ignore", "add", "--states", states, "--address", address)
    return r.returncode, r.stdout.decode(), r.stderr.decode()


def stored(run_kl) -> list[tuple[str, str]]:
    return [(x["states"], x["address"]) for x in json.loads(run_kl("drift", "ignore", "list", "--format", "json").stdout)["rules"]]


@pytest.mark.parametrize("address", ['local_file.config["b"]', "local_file.*", "**.null_resource.web", "local_file.config[*]",
                                     'local_file.config["?"]', "**"])
def test_globs_that_match_say_nothing(demo, run_kl, address):
    assert add(run_kl, "d*", address) == (0, "1\n", "")


def test_a_state_glob_that_matches_nothing_is_noted_with_the_closest_name(demo, run_kl):
    code, out, err = add(run_kl, "dmeo", "null_resource.web")
    assert (code, out) == (0, "1\n")
    assert err == ("kl: note: --states: no state matches 'dmeo'; did you mean 'demo'? (see `kl state list`); rule 1 "
                   "applies to those that appear (`kl drift ignore remove 1` undoes it)\n"), err
    code, _, err = add(run_kl, "ghost/*", "null_resource.web")
    assert code == 0 and err.startswith("kl: note: --states: no state matches 'ghost/*' (see `kl state list`); rule 2 "), err
    assert stored(run_kl) == [("dmeo", "null_resource.web"), ("ghost/*", "null_resource.web")]


def test_an_address_glob_that_matches_no_instance_is_noted_with_the_closest_address(demo, run_kl):
    code, out, err = add(run_kl, "demo", "null_resource.webb")
    assert (code, out) == (0, "1\n")
    assert err == ("kl: note: --address 'null_resource.webb' matches no instance of the states --states 'demo' matches; "
                   "did you mean 'null_resource.web'?; rule 1 applies to those that appear "
                   "(`kl drift ignore remove 1` undoes it)\n"), err
    code, _, err = add(run_kl, "demo", "aws_instance.*")
    assert code == 0 and "--address 'aws_instance.*' matches no instance of the states --states 'demo' matches; rule 2" in err, err


def test_an_instance_a_refresh_found_gone_still_counts_as_matched(demo, run_kl):
    # The object's lifecycle is closed by the refresh that found it gone; its open drift record names it.
    doc = json.loads(keyed_state(2))
    doc["resources"] = doc["resources"][:1]
    r = run_kl("state", "import", "demo", "-", "--source", "refresh", input=json.dumps(doc).encode())
    assert r.returncode == 0, r.stderr
    assert add(run_kl, "demo", "null_resource.web") == (0, "1\n", "")


SHAPE = ' (an address is names joined by ".", with instance keys [0] or ["key"])'


@pytest.mark.parametrize(("address", "message"), [
    ("local_file.config[b]", (": the instance key b at position 18 is not a number, so it is written quoted, as Terraform "
                             """prints it: 'local_file.config["b"]' (single quotes for the shell)""")),
    ('local_file.config["b"', ': the instance key at position 18 is not closed: expected "] after the quoted key'),
    ("local_file..config", ": expected a name at position 12, found '.'" + SHAPE),
    ("local_file.", ' ends with ".": a name must follow it'),
    ("local_file config", ": expected a name, . or [KEY] at position 11, found ' '" + SHAPE),
])
def test_an_address_glob_terraform_would_not_write_is_refused_and_nothing_stored(demo, run_kl, address, message):
    r = run_kl("drift", "ignore", "add", "--states", "demo", "--address", address)
    err = r.stderr.decode()
    assert r.returncode == 2 and err.splitlines()[0] == f"kl: drift ignore add: argument --address: address glob {address!r}{message}", err
    assert err.splitlines()[1].startswith("usage: kl drift ignore add ") and "Traceback" not in err
    assert stored(run_kl) == []


def test_kl_drift_states_names_the_closest_state_too(demo, run_kl):
    r = run_kl("drift", "--states", "dmeo")
    assert (r.returncode, r.stderr.decode()) == (1, "kl: no state matches 'dmeo'; did you mean 'demo'? (see `kl state list`)\n")
