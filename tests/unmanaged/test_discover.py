"""kl discover against the framework test provider (tests/testprovider, terraform-plugin-framework
v1.19), whose list resource lists every JSON file of its directory with the identity a read returns.

Terraform 1.12.2 (the first with resource identity) creates two objects in state "tf-one" and
records their identities; two more objects are created behind its back (files written directly);
state "tf-two" imports one of Terraform's objects a second time. kl discover must then report
exactly the objects made behind Terraform's back as unmanaged, the imported one as managed twice.
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

from kit.clis import compiled_cli
from kit.fleet import q, start_worker, stop, wait_for
from kit.kl import kl_cmd, kl_env
from kit.paths import PLUGIN_CACHE
from kit.procs import assert_no_new_providers, default_signals, provider_pids
from kit.providers import our_provider
from kit.tfworkspace import terraform_env
from kit.webhook import Receiver

TERRAFORM = "terraform-1.12.2"
PROVIDER = """
terraform {
  required_providers {
    testfw = { source = "registry.terraform.io/kilolock/testfw", version = "0.1.0" }
  }
}
"""
ONE_TF = PROVIDER + """
resource "testfw_thing" "a" { id = "t-a" }
resource "testfw_thing" "b" { id = "t-b" }
"""
TWO_TF = PROVIDER + """
import {
  to = testfw_thing.dup
  id = "t-a"
}
resource "testfw_thing" "dup" { id = "t-a" }
"""


def _identity(id_: str) -> dict[str, str]:
    return {"id": id_, "region": "local"}


def _tf(ws: Path, remote: Path, *args: str) -> None:
    env = {**terraform_env(), "KL_TESTPROVIDER_DIR": str(remote)}
    r = subprocess.run([str(compiled_cli(TERRAFORM)), *args, "-input=false", "-no-color"], cwd=ws, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"terraform {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both workspaces applied, and the remote directory they share."""
    our_provider("testfw")
    root = tmp_path_factory.mktemp("discover")
    remote = root / "remote"
    for name, main_tf in (("one", ONE_TF), ("two", TWO_TF)):
        ws = root / name
        ws.mkdir()
        (ws / "main.tf").write_text(main_tf)
        _tf(ws, remote, "init")
        _tf(ws, remote, "apply", "-auto-approve")
    return root


class Kl:
    def __init__(self, run_kl: Any, root: Path) -> None:
        self.run_kl, self.root, self.remote = run_kl, root, root / "remote"

    def __call__(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return self.run_kl(*args, cwd=self.root)

    def ok(self, *args: str) -> str:
        r = self(*args)
        assert r.returncode == 0, r.stderr.decode()
        return str(r.stdout.decode())

    def discover(self, *extra: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.ok("discover", "kilolock/testfw", "--type", "testfw_thing",
                                                 "--provider-search-path", str(PLUGIN_CACHE), "--format", "json", *extra))
        return out

    def behind_terraforms_back(self, *ids: str) -> None:
        for id_ in ids:
            (self.remote / f"{id_}.json").write_text(json.dumps({"id": id_, "name": "made by hand"}))


@pytest.fixture
def kl(run_kl: Any, db_url: str, applied: Path, tmp_path: Path) -> Kl:
    root = tmp_path / "discover"
    shutil.copytree(applied, root, symlinks=True)
    k = Kl(run_kl, root)
    for name in ("one", "two"):
        k.ok("state", "import", f"tf-{name}", str(root / name / "terraform.tfstate"), "--source", "apply")
    config = root / "testfw.json"
    config.write_text(json.dumps({"dir": str(k.remote)}))
    k.ok("provider", "configure", "kilolock/testfw", "--config", str(config))
    return k


def _by_id(out: dict[str, Any]) -> dict[str, tuple[str, list[tuple[str, str]], bool]]:
    return {o["identity"]["id"]: (o["match"], sorted((c["state"], c["address"]) for c in o["claims"]), o["new"])
            for o in out["objects"]}


def test_the_objects_made_behind_terraforms_back_are_unmanaged_and_one_imported_twice_is_managed_twice(kl: Kl) -> None:
    state = json.loads((kl.root / "one" / "terraform.tfstate").read_text())
    assert [i["identity"] for r in state["resources"] for i in r["instances"]] == [_identity("t-a"), _identity("t-b")]
    kl.behind_terraforms_back("x-1", "x-2")

    out = kl.discover()

    assert _by_id(out) == {
        "t-a": ("managed twice", [("tf-one", "testfw_thing.a"), ("tf-two", "testfw_thing.dup")], False),
        "t-b": ("managed", [("tf-one", "testfw_thing.b")], False),
        "x-1": ("unmanaged", [], True),
        "x-2": ("unmanaged", [], True),
    }
    assert [o["identity"] for o in out["objects"]] == [_identity(i) for i in ("t-a", "t-b", "x-1", "x-2")]
    assert out["objects"][1]["claims"] == [{"state": "tf-one", "address": "testfw_thing.b", "deposed": "",
                                            "evidence": "identity"}]
    assert out["run"]["status"] == "succeeded"
    assert out["run"]["counts"] == {"listed": 4, "managed": 1, "unmanaged": 2, "managed_twice": 1, "new_unmanaged": 2}


def test_an_instance_stored_without_an_identity_claims_the_object_whose_identity_has_its_id(kl: Kl) -> None:
    # Terraform before 1.12 stores no identity: the identity index matches it by its id attribute,
    # and the claim says the evidence is that weaker one.
    kl.behind_terraforms_back("x-3")
    old = {"version": 4, "terraform_version": "1.11.4", "serial": 1, "lineage": "before-identities", "outputs": {},
           "resources": [{"mode": "managed", "type": "testfw_thing", "name": "old",
                          "provider": 'provider["registry.terraform.io/kilolock/testfw"]',
                          "instances": [{"schema_version": 1, "attributes": {"id": "x-3"}, "sensitive_attributes": []}]}]}
    (kl.root / "old.tfstate").write_text(json.dumps(old))
    kl.ok("state", "import", "tf-old", str(kl.root / "old.tfstate"), "--source", "apply")

    out = kl.discover()

    x3 = next(o for o in out["objects"] if o["identity"]["id"] == "x-3")
    assert x3["match"] == "managed"
    assert x3["claims"] == [{"state": "tf-old", "address": "testfw_thing.old", "deposed": "", "evidence": "id"}]
    assert _by_id(out)["t-b"][0] == "managed"  # an identity still matches by identity only


def test_only_objects_not_unmanaged_in_the_previous_run_are_new(kl: Kl) -> None:
    kl.behind_terraforms_back("x-1")
    assert _by_id(kl.discover())["x-1"] == ("unmanaged", [], True)
    kl.behind_terraforms_back("x-2")
    found = _by_id(kl.discover())
    assert (found["x-1"], found["x-2"]) == (("unmanaged", [], False), ("unmanaged", [], True))
    # Another list config is another scope: what it lists is compared with its own runs.
    assert _by_id(kl.discover("--list-config", '{"prefix": "x-"}')) == {
        "x-1": ("unmanaged", [], True), "x-2": ("unmanaged", [], True)}


def test_the_limit_is_the_providers_and_results_show_the_latest_run(kl: Kl) -> None:
    kl.behind_terraforms_back("x-1")
    out = kl.discover("--limit", "2")
    assert [o["display_name"] for o in out["objects"]] == ["thing t-a", "thing t-b"]
    assert out["run"]["limit"] == 2

    text = kl.ok("discover", "--results")
    assert "registry.terraform.io/kilolock/testfw testfw_thing: 2 listed: 1 managed, 0 unmanaged (0 new), 1 managed twice" in text
    assert "tf-one:testfw_thing.a, tf-two:testfw_thing.dup" in text
    assert json.loads(kl.ok("discover", "--results", "--format", "json"))["run"]["id"] == out["run"]["id"]
    assert "thing t-b" in kl.ok("discover", "--run", out["run"]["id"])
    r = kl("discover", "--run", "42")
    assert r.returncode == 2
    assert r.stderr.decode().splitlines()[0] == ("kl: discover: argument --run: '42' is not a run id "
                                                 "(kl discover --results --format json shows one)")


def test_a_provider_that_cannot_list_gets_one_line_and_a_failed_run(kl: Kl) -> None:
    r = kl("discover", "hashicorp/null", "--type", "null_resource", "--provider-search-path", str(PLUGIN_CACHE))
    assert r.returncode == 1
    assert r.stderr.decode().splitlines() == [
        ("kl: provider registry.terraform.io/hashicorp/null 2.1.2 cannot list null_resource (it lists no type: "
         "listing needs plugin protocol 5.10/6.10 (Terraform 1.14) and a list resource)")]
    run = json.loads(kl.ok("discover", "--results", "--format", "json"))["run"]
    assert (run["status"], run["source"], run["error"]) == ("failed", "registry.terraform.io/hashicorp/null",
                                                            r.stderr.decode().strip().removeprefix("kl: "))


@pytest.mark.parametrize(("args", "code", "line"), [
    (["--list-config", "[1]"], 2, "kl: --list-config must be a JSON object (the list block's attributes)"),
    (["--list-config", "{"], 2, "kl: --list-config: "),
    (["--list-config", '{"color": "red"}'], 1, "kl: --list-config does not fit the list schema of testfw_thing: "),
    (["--type", "testfw_other"], 1, ("kl: provider registry.terraform.io/kilolock/testfw 0.1.0 cannot list testfw_other "
                                     "(the types it lists: testfw_thing)")),
])
def test_a_wrong_list_config_or_type_is_one_line(kl: Kl, args: list[str], code: int, line: str) -> None:
    type_ = [] if "--type" in args else ["--type", "testfw_thing"]
    r = kl("discover", "kilolock/testfw", *type_, "--provider-search-path", str(PLUGIN_CACHE), *args)
    err = r.stderr.decode().splitlines()
    assert (r.returncode, len(err)) == (code, 1), r.stderr.decode()
    assert err[0].startswith(line)
    assert "Traceback" not in r.stderr.decode()


def _slow_listing(kl: Kl) -> subprocess.Popen[bytes]:
    """kl discover in the background, its listing in flight (each object takes a second)."""
    kl.behind_terraforms_back(*(f"x-{i:03d}" for i in range(200)))
    proc = subprocess.Popen(kl_cmd("discover", "kilolock/testfw", "--type", "testfw_thing", "--provider-search-path",
                                   str(PLUGIN_CACHE)), env={**kl_env(), "KL_TESTPROVIDER_READ_DELAY_MS": "1000"},
                            cwd=kl.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_signals)  # noqa: PLW1509 - the test signals it
    mark = kl.remote / ".listing-started"
    deadline = time.monotonic() + 60
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mark.exists(), proc.communicate(timeout=30)
    return proc


def _slots_held(kl: Kl) -> int:
    [limit] = json.loads(kl.ok("provider", "limits", "--format", "json"))["limits"]
    return int(limit["held"])


def test_a_listing_holds_one_of_the_providers_fleet_wide_slots(kl: Kl) -> None:
    kl.ok("provider", "limit", "kilolock/testfw", "--max-in-flight", "3")
    proc = _slow_listing(kl)
    deadline = time.monotonic() + 60
    while _slots_held(kl) != 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _slots_held(kl) == 1
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert _slots_held(kl) == 0  # given back as the process ended


def test_ctrl_c_cancels_the_listing_ends_the_provider_and_records_the_run(kl: Kl, db_url: str) -> None:
    before = provider_pids()
    proc = _slow_listing(kl)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = err.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kl: discovery cancelled: interrupted (SIGINT); recorded as run "), lines
    run = json.loads(kl.ok("discover", "--results", "--format", "json"))["run"]
    assert (run["status"], run["error"], run["id"]) == ("cancelled", "interrupted (SIGINT)", lines[0].rsplit(" ", 1)[1])
    assert_no_new_providers(before)


def test_sigterm_cancels_the_listing_as_ctrl_c_does_and_exits_143(kl: Kl, db_url: str) -> None:
    before = provider_pids()
    proc = _slow_listing(kl)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    lines = err.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kl: discovery cancelled: terminated (SIGTERM); recorded as run "), lines
    run = json.loads(kl.ok("discover", "--results", "--format", "json"))["run"]
    assert (run["status"], run["error"], run["id"]) == ("cancelled", "terminated (SIGTERM)", lines[0].rsplit(" ", 1)[1])
    assert_no_new_providers(before)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_only_new_unmanaged_objects_notify_resource_unmanaged(kl: Kl, receiver: Receiver) -> None:
    kl.ok("notify", "add", "hook", "--webhook", receiver.url.removesuffix("/hook") + "/hook", "--events", "resource.unmanaged,drift.new",
          "--secret", "s3cret")
    kl.ok("notify", "add", "chat", "--webhook", receiver.url.removesuffix("/hook") + "/chat", "--format", "slack", "--states", "tf-one",
          "--events", "resource.unmanaged")
    kl.ok("notify", "add", "elsewhere", "--webhook", receiver.url.removesuffix("/hook") + "/elsewhere", "--states", "other/**",
          "--events", "resource.unmanaged")
    # resource.unmanaged is opt-in: a channel that names no event hears none of it.
    kl.ok("notify", "add", "defaults", "--webhook", receiver.url.removesuffix("/hook") + "/defaults")
    kl.behind_terraforms_back("x-1")
    first = kl.discover()
    kl.discover()  # x-1 again: nothing new
    kl.behind_terraforms_back("x-2")
    third = kl.discover()
    # A run with tf-one's provider config is heard by the channels of tf-one only.
    by_state = kl.discover("--state", "tf-one")

    got = {path: [r.json for r in receiver.requests if r.path == path] for path in ("/hook", "/chat", "/elsewhere", "/defaults")}
    hook = got["/hook"]
    assert [(e["event"], e["run_id"], e["state"], e["discovery"]["new_unmanaged"],
             [o["identity"]["id"] for o in e["discovery"]["objects"]]) for e in hook] == [
        ("resource.unmanaged", first["run"]["id"], None, 1, ["x-1"]),
        ("resource.unmanaged", third["run"]["id"], None, 1, ["x-2"]),
        ("resource.unmanaged", by_state["run"]["id"], "tf-one", 2, ["x-1", "x-2"])]
    assert hook[0]["discovery"] == {"source": "registry.terraform.io/kilolock/testfw", "alias": None, "type": "testfw_thing",
                                    "new_unmanaged": 1, "objects": [{"identity": _identity("x-1"), "display_name": "thing x-1"}]}
    assert hook[0]["command"] == f"kl discover --results --run {first['run']['id']}"
    assert all(r.signed_by("s3cret") for r in receiver.requests if r.path == "/hook")
    assert [e["text"] for e in got["/chat"]] == [
        "Kilolock: new unmanaged objects: 1 testfw_thing of registry.terraform.io/kilolock/testfw"] * 2 + [
        "Kilolock: new unmanaged objects: 2 testfw_thing of registry.terraform.io/kilolock/testfw (provider config of tf-one)"]
    assert len(got["/elsewhere"]) == 2  # the runs without a state, not tf-one's
    assert got["/defaults"] == []


# ---------------------------------------------------------------- discovery scheduled for the fleet's workers

def _discover_schedule(kl: Kl, *extra: str) -> int:
    return int(kl.ok("schedule", "set", "--discover", "kilolock/testfw", "--type", "testfw_thing",
                     "--provider-search-path", str(PLUGIN_CACHE), "--every", "1h", *extra))


def _discovery_runs(db_url: str) -> list[tuple[Any, ...]]:
    """(status, actor, error, new unmanaged) of every discovery run, oldest first."""
    return q(db_url, "SELECT status, actor, error, new_unmanaged FROM discovery_runs ORDER BY started_at")


@pytest.mark.parametrize(("args", "line"), [
    (["--every", "1h"], "kl: kl schedule set needs --states GLOB (to refresh) or --discover SOURCE --type TYPE (to discover)"),
    (["--discover", "kilolock/testfw", "--every", "1h"], "kl: --discover needs --type TYPE (the resource type to list)"),
    (["--discover", "kilolock/testfw", "--type", "testfw_thing", "--states", "**", "--every", "1h"],
     "kl: --states and --discover do not go together: a schedule refreshes states or runs one discovery"),
    (["--states", "**", "--type", "testfw_thing", "--every", "1h"],
     "kl: --type goes with --discover SOURCE, not with --states (a refresh schedule)"),
    (["--discover", "kilolock/testfw", "--type", "testfw_thing", "--list-config", "[1]", "--every", "1h"],
     "kl: --list-config must be a JSON object (the list block's attributes)"),
])
def test_a_discovery_schedule_refuses_flags_that_do_not_go_together_in_one_line(run_kl: Any, db_url: str, args: list[str],
                                                                                 line: str) -> None:
    r = run_kl("schedule", "set", *args)
    assert (r.returncode, r.stderr.decode().splitlines()) == (2, [line])
    assert q(db_url, "SELECT count(*) FROM fleet_schedules") == [(0,)]


def test_discovery_schedules_are_listed_and_removed_like_refresh_schedules(kl: Kl, db_url: str) -> None:
    first = _discover_schedule(kl, "--list-config", '{"prefix": "x-"}', "--limit", "5", "--jitter", "10m")
    second = int(kl.ok("schedule", "set", "--discover", "kilolock/testfw", "--type", "testfw_thing", "--state", "tf-one",
                       "--cron", "@daily"))
    r = kl("schedule", "set", "--discover", "kilolock/testfw", "--type", "testfw_thing", "--state", "nope", "--every", "1h")
    assert r.returncode == 1 and len(r.stderr.decode().splitlines()) == 1 and "nope" in r.stderr.decode()

    listed = json.loads(kl.ok("schedule", "list", "--format", "json"))["schedules"]
    assert [(s["id"], s["kind"], s["states"], s["matching_states"], s["every_s"], s["cron"], s["jitter_s"])
            for s in listed] == [(first, "discover", None, None, 3600.0, None, 600.0),
                                 (second, "discover", None, None, None, "@daily", 0.0)]
    assert listed[0]["discovery"] == {"source": "registry.terraform.io/kilolock/testfw", "alias": "", "state": None,
                                      "type": "testfw_thing", "list_config": {"prefix": "x-"}, "limit": 5,
                                      "search_paths": [str(PLUGIN_CACHE)]}
    assert listed[1]["discovery"]["state"] == "tf-one"
    text = kl.ok("schedule", "list")
    assert "--discover registry.terraform.io/kilolock/testfw --type testfw_thing --list-config '{\"prefix\": \"x-\"}' --limit 5" in text
    assert kl.ok("schedule", "remove", str(second)).startswith(
        f"removed schedule {second}: --discover registry.terraform.io/kilolock/testfw --type testfw_thing --state tf-one, ")
    assert [s["id"] for s in json.loads(kl.ok("schedule", "list", "--format", "json"))["schedules"]] == [first]


def test_a_worker_runs_a_scheduled_discovery_and_new_unmanaged_objects_notify_once(kl: Kl, db_url: str,
                                                                                   receiver: Receiver) -> None:
    kl.ok("notify", "add", "hook", "--webhook", receiver.url, "--events", "resource.unmanaged")
    kl.behind_terraforms_back("x-1")
    schedule = _discover_schedule(kl)
    worker = start_worker(db_url, "disco")
    try:
        wait_for("the scheduled discovery", lambda: _discovery_runs(db_url) == [("succeeded", ANY, None, 1)])
        kl.behind_terraforms_back("x-2")
        q(db_url, "UPDATE fleet_schedules SET next_run_at = now() WHERE id = %s", (schedule,))
        runs = wait_for("the schedule's second discovery", lambda: (r := _discovery_runs(db_url))[1:] and r[1][0] != "running" and r)
        assert [(status, new) for status, _, _, new in runs] == [("succeeded", 1), ("succeeded", 1)]
        q(db_url, "UPDATE fleet_schedules SET next_run_at = now() WHERE id = %s", (schedule,))
        runs = wait_for("the third", lambda: (r := _discovery_runs(db_url))[2:] and r[2][0] != "running" and r)
        assert runs[2][0] == "succeeded" and runs[2][3] == 0  # nothing new: x-1 and x-2 were unmanaged before
        wait_for("two deliveries", lambda: len(receiver.requests) >= 2)
    finally:
        code, out = stop(worker)
    assert code == 0, out
    # What kl discover would have found, recorded as its runs are: seen by --results (and so by the UI,
    # kl status and /metrics, which read the same rows).
    latest = json.loads(kl.ok("discover", "--results", "--format", "json"))
    assert _by_id(latest)["x-1"] == ("unmanaged", [], False) and _by_id(latest)["t-a"][0] == "managed twice"
    assert latest["run"]["counts"] == {"listed": 4, "managed": 1, "unmanaged": 2, "managed_twice": 1, "new_unmanaged": 0}
    assert [[o["identity"]["id"] for o in r.json["discovery"]["objects"]] for r in receiver.requests] == [["x-1"], ["x-2"]]
    assert q(db_url, "SELECT count(*) FROM notify_events WHERE kind = 'resource.unmanaged'") == [(2,)]
    jobs = q(db_url, "SELECT kind, status, schedule_id, discovery_run_id IS NOT NULL FROM fleet_jobs ORDER BY id")
    assert jobs == [("discover", "succeeded", schedule, True)] * 3
    assert "discover registry.terraform.io/kilolock/testfw testfw_thing: succeeded 4 listed, 2 unmanaged" in out


def test_a_worker_that_dies_mid_discovery_is_taken_over_and_its_run_does_not_stay_running(kl: Kl, db_url: str) -> None:
    kl.ok("provider", "limit", "kilolock/testfw", "--max-in-flight", "1")
    kl.behind_terraforms_back(*(f"x-{i:03d}" for i in range(200)))
    _discover_schedule(kl)
    slow = start_worker(db_url, "slow", env={"KL_TESTPROVIDER_READ_DELAY_MS": "1000"})
    try:
        wait_for("the listing", lambda: (kl.remote / ".listing-started").exists() and _slots_held(kl) == 1, timeout=60)
        job = q(db_url, "SELECT id, discovery_run_id::text FROM fleet_jobs WHERE status = 'running'")
        assert len(job) == 1 and job[0][1] is not None  # linked to its run as the run began
        slow.kill()
        slow.communicate(timeout=30)
        (kl.remote / ".listing-started").unlink()
        last_beat = q(db_url, "SELECT heartbeat_at FROM fleet_jobs WHERE id = %s FOR UPDATE", (job[0][0],))[0][0]
        other = start_worker(db_url, "other")
        try:
            wait_for("the job done by another worker", lambda: q(
                db_url, "SELECT 1 FROM fleet_jobs WHERE id = %s AND status = 'succeeded'", (job[0][0],)), timeout=60)
        finally:
            code, out = stop(other)
        assert code == 0, out
    finally:
        stop(slow, signal.SIGKILL)
    dead = q(db_url, "SELECT status, error, finished_at, started_at FROM discovery_runs WHERE id = %s", (job[0][1],))[0]
    assert dead[:2] == ("failed", "worker slow stopped heartbeating (lease expired); its run was taken over")
    # Nothing is known to have happened after the last heartbeat, unless the run began after it
    # (the worker died before its next beat): then it ends as it began.
    assert dead[2] == max(dead[3], last_beat), (dead, last_beat)
    assert [r[0] for r in _discovery_runs(db_url)] == ["failed", "succeeded"]
    assert q(db_url, "SELECT attempts FROM fleet_jobs") == [(2,)]
    assert "took over job" in out and _slots_held(kl) == 0


def test_a_stopping_worker_cancels_its_discovery_after_the_grace_period_and_queues_it_again(kl: Kl, db_url: str) -> None:
    before = provider_pids()
    kl.behind_terraforms_back(*(f"x-{i:03d}" for i in range(200)))
    _discover_schedule(kl)
    worker = start_worker(db_url, "w1", "--grace", "1s", env={"KL_TESTPROVIDER_READ_DELAY_MS": "1000"})
    try:
        wait_for("the listing", lambda: (kl.remote / ".listing-started").exists(), timeout=60)
        running = json.loads(kl.ok("fleet", "status", "--format", "json"))["workers"][0]["running"]
        assert [r["state"] for r in running] == ["discover registry.terraform.io/kilolock/testfw testfw_thing"]
    finally:
        code, out = stop(worker)
    assert code == 0, out
    assert "cancelled at shutdown; queued again" in out
    [(status, _, error, _)] = _discovery_runs(db_url)
    assert (status, error) == ("cancelled", "worker w1 stopping (grace period of 1s over)")
    assert q(db_url, "SELECT status, attempts, error FROM fleet_jobs") == [("queued", 0, "worker w1 stopped during the run")]
    assert_no_new_providers(before)
