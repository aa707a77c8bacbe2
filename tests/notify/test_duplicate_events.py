"""resource.duplicate: an object claimed by two states is announced once while the duplicate lasts,
found by the processes that poll (every kl process that opens the database), and again once it
ended and came back. The period between evaluations is passed by moving the channel's stamp back
(what an hour of waiting would do), never by sleeping."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from kit.fleet import q
from kit.webhook import Receiver


def ok(r: Any) -> Any:
    assert r.returncode == 0, r.stderr.decode()
    return r


def period_passed(db_url: str) -> None:
    q(db_url, "UPDATE notify_channels SET duplicates_checked_at = duplicates_checked_at - interval '1 day'")


def duplicates(receiver: Receiver) -> list[dict[str, Any]]:
    return [r.json for r in receiver.events("resource.duplicate")]


def test_a_duplicate_is_announced_once_while_it_lasts_and_again_when_it_comes_back(run_kl, db_url, receiver, make_state,
                                                                                  tmp_path: Path):
    def put(name: str, serial: int, objects: dict[str, dict[str, Any]]) -> None:
        path = tmp_path / f"{name.replace('/', '-')}-{serial}.tfstate"
        path.write_bytes(make_state(serial, objects, lineage=name))
        ok(run_kl("state", "import", name, str(path)))

    ok(run_kl("notify", "add", "hook", "--webhook", receiver.url, "--secret", "k", "--events", "resource.duplicate"))
    ok(run_kl("notify", "add", "elsewhere", "--webhook", receiver.url, "--states", "other/**"))
    put("team/a", 1, {"x": {"id": "42", "triggers": None}, "own": {"id": "1", "triggers": None}})
    put("team/b", 1, {"y": {"id": "42", "triggers": None}, "own": {"id": "2", "triggers": None}})
    period_passed(db_url)  # the processes above evaluated before b's claim was written
    ok(run_kl("notify", "list"))
    [doc] = duplicates(receiver)
    assert (doc["event"], doc["state"], doc["channel"], doc["command"]) == (
        "resource.duplicate", "team/a", "hook", "kl resources --duplicates")
    dup = doc["duplicate"]
    assert (dup["confidence"], dup["evidence"], dup["provider"], dup["type"], dup["key"]) == (
        "likely", "id", "registry.terraform.io/hashicorp/null", "null_resource", "42")
    assert [(c["state"], c["address"]) for c in dup["claims"]] == [("team/a", "null_resource.x"), ("team/b", "null_resource.y")]

    for _ in range(2):  # still there at later evaluations: nothing more
        period_passed(db_url)
        ok(run_kl("notify", "list"))
    assert len(duplicates(receiver)) == 1

    put("team/b", 2, {"own": {"id": "2", "triggers": None}})  # b's claim ends
    period_passed(db_url)
    ok(run_kl("notify", "list"))
    assert q(db_url, "SELECT count(*) FROM resource_duplicate_notices") == [(0,)]
    put("team/b", 3, {"y": {"id": "42", "triggers": None}, "own": {"id": "2", "triggers": None}})
    period_passed(db_url)
    ok(run_kl("notify", "list"))
    assert [d["duplicate"]["key"] for d in duplicates(receiver)] == ["42", "42"]
    assert len({r.headers["Idempotency-Key"] for r in receiver.events()}) == 2
    assert all(r.signed_by("k") and r.json["channel"] == "hook" for r in receiver.events())
