"""Writers racing each other on one state, and signals at random points of `kl refresh`.

The design (DESIGN.md, "Locking"): a refresh does not hold the state lock while it reads. By
default it records an observation of the version it read (no lock, Terraform's serial unchanged,
numbered per base: v7.1, v7.2, ...). With --commit its commit takes the lock and is a
compare-and-swap on the serial it started from. So of two committing runs started from the same
version exactly one commits serial+1 and the other fails with a message saying the state changed
(or was locked at that instant); nothing ever commits serial+2 on a version it did not read.
Terraform applies through `kl serve` hold the same lock for the whole apply.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from kit.faults import fake_state, observations, serials
from kit.invariants import event_count, reindex_mismatches, running_runs, state_locks, version_problems, wait_for
from kit.kl import kl_cmd, kl_env
from kit.paths import REPO
from kit.procs import default_signals, marked_pids, session_mark, settle_orphans

SEED = int(os.environ.get("KL_CHAOS_SEED", "20261129"))
# What a losing refresh may say: the state moved under it, or the lock was held at that instant.
LOSER = re.compile(r"changed while this run was in progress|is locked by .*(refresh not committed)?")


@pytest.fixture(autouse=True)
def no_orphan_providers():
    before = marked_pids(session_mark())
    yield
    left = settle_orphans(before, session_mark())
    assert not left, f"provider processes outlived the test: {sorted(left)}"


def _popen(args: list[str], cwd: Path | None = None, **env: str) -> subprocess.Popen:
    return subprocess.Popen(kl_cmd(*args), env=kl_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=str(cwd or REPO), preexec_fn=default_signals)  # noqa: PLW1509 - the tests signal them


def _runs(db_url: str, state: str = "prod") -> list[tuple]:
    """(status, from serial, what it wrote, error) of every refresh run, oldest first: what it wrote
    is Terraform's serial (an int) for a commit, the observation's label ("v7.3") for an observation."""
    with psycopg.connect(db_url) as c:
        return c.execute(
            """SELECT rr.status, f.serial,
                      CASE WHEN t.kind = 'observation' THEN to_jsonb('v' || t.serial || '.' || t.observation_number)
                           ELSE to_jsonb(t.serial) END,
                      rr.error_summary FROM refresh_runs rr
               JOIN states s ON s.id = rr.state_id JOIN state_versions f ON f.id = rr.from_version_id
               LEFT JOIN state_versions t ON t.id = rr.to_version_id WHERE s.name = %s ORDER BY rr.started_at""",
            (state,)).fetchall()


def _assert_invariants(db_url: str, state: str = "prod") -> None:
    assert version_problems(db_url, state) == []
    assert reindex_mismatches(db_url, state) == []
    assert running_runs(db_url) == [], "an audit row was left running"
    assert state_locks(db_url) == [], "the state was left locked"
    # One writer per serial: every committed refresh went from the serial it read to the next one;
    # every observation is of the serial it read, and each was recorded once.
    recorded = []
    for status, frm, to, err in _runs(db_url, state):
        if status == "succeeded" and isinstance(to, int):
            assert to == frm + 1, (frm, to)
        elif status == "succeeded" and to is not None:
            assert to.startswith(f"v{frm}."), (frm, to)
            recorded.append(to)
        if status != "succeeded":
            assert to is None, (status, frm, to, err)
    assert recorded == observations(db_url, state)


def _written(doc: dict, commit: bool) -> None:
    """A succeeded run's JSON: serial+1 with --commit (where what it read differs from that serial:
    else a confirmation, as without), else an observation of the serial it read."""
    if commit and doc["to_serial"] is not None:
        assert (doc["to_serial"], doc["observation"]) == (doc["from_serial"] + 1, None), doc
    else:
        assert doc["to_serial"] is None and doc["observation"].startswith(f"v{doc['from_serial']}."), doc


def _clean_failure(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kl: ") and "internal error" not in stderr, stderr
    return lines[0]


BUSY = re.compile(r"^kl: state 'prod' is being refreshed now by run \S+ \(.*\) \(since .*\); --lock-timeout DURATION waits for it$")


def test_two_refreshes_at_once_one_runs_the_other_refuses_or_waits(run_kl, db_url, fake_cache):
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="2")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_slow"])).returncode == 0
    first = _popen(["refresh", "prod", "--provider-search-path", str(cache), "--format", "json"])
    wait_for(lambda: event_count(events, "read") >= 2 or first.poll() is not None, 60, "the first run's reads")
    assert first.poll() is None, "the first run ended before the second started"
    # The second is refused before it reads anything: one line naming the live run, no audit row.
    second = run_kl("refresh", "prod", "--provider-search-path", str(cache), "--format", "json")
    assert second.returncode == 1 and second.stdout == b"", second
    assert BUSY.match(_clean_failure(second.stderr.decode())), second.stderr
    # A third waits for it and then refreshes: its observation is the next of the same version.
    third = _popen(["refresh", "prod", "--provider-search-path", str(cache), "--format", "json", "--lock-timeout", "60s"])
    outs = [p.communicate(timeout=60) for p in (first, third)]
    assert [p.returncode for p in (first, third)] == [0, 0], outs
    assert [(d["from_serial"], d["to_serial"], d["observation"]) for d in (json.loads(o) for o, _ in outs)] == [
        (1, None, "v1.1"), (1, None, "v1.2")]
    assert [r[:3] for r in _runs(db_url)] == [("succeeded", 1, "v1.1"), ("succeeded", 1, "v1.2")]
    assert serials(db_url) == [1] and observations(db_url) == ["v1.1", "v1.2"]
    _assert_invariants(db_url)


def test_two_committing_refreshes_at_once_the_waiter_commits_on_the_first(run_kl, db_url, fake_cache):
    """As above with --commit: the one that waited reads and commits on what the first committed."""
    make, events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="2")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo", "fake_slow"])).returncode == 0
    first = _popen(["refresh", "prod", "--provider-search-path", str(cache), "--format", "json", "--commit"])
    wait_for(lambda: event_count(events, "read") >= 2 or first.poll() is not None, 60, "the first run's reads")
    assert first.poll() is None, "the first run ended before the second started"
    second = _popen(["refresh", "prod", "--provider-search-path", str(cache), "--format", "json", "--commit",
                     "--lock-timeout", "60s"])
    outs = [p.communicate(timeout=60) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    assert [(d["from_serial"], d["to_serial"]) for d in (json.loads(o) for o, _ in outs)] == [(1, 2), (2, 3)]
    assert [r[:3] for r in _runs(db_url)] == [("succeeded", 1, 2), ("succeeded", 2, 3)]
    assert serials(db_url) == [1, 2, 3] and observations(db_url) == []
    _assert_invariants(db_url)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "observe"])
def test_refreshes_with_real_providers_racing_commit_one_serial_each(run_kl, db_url, commit):
    """With --commit, one serial per committing run; without, one observation each of the same
    version, numbered in turn, and Terraform's serial unmoved."""
    from kit.tfcli import PLUGIN_CACHE, tool_binary

    tool_binary("terraform-1.0.3")
    state = REPO / "tests" / "fixtures" / "states" / "varied.tfstate"
    assert run_kl("state", "import", "prod", str(state)).returncode == 0
    start = serials(db_url)[-1]
    extra = ["--commit"] if commit else []
    procs = [_popen(["refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "--format", "json", *extra])
             for _ in range(4)]
    outcomes = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        if not out:  # refused at its start: another run of the state was live
            assert p.returncode == 1 and BUSY.match(_clean_failure(err.decode())), err.decode()
            continue
        doc = json.loads(out)
        if p.returncode == 0:
            _written(doc, commit)
        else:
            assert commit, (doc, err.decode())  # an observation has nothing to lose a race for
            assert p.returncode == 1 and doc["status"] == "failed" and LOSER.search(doc["error"]), (doc, err.decode())
            _clean_failure(err.decode())
        outcomes.append((p.returncode, doc["from_serial"], doc["to_serial"] if commit else doc["observation"]))
    froms = [f for code, f, _ in outcomes if code == 0]
    assert len(froms) >= 1, outcomes
    if commit:
        # No two runs committed from the same version; the serials that exist are exactly the commits.
        committed = [f for code, f, to in outcomes if code == 0 and to is not None]
        assert len(committed) == len(set(committed)), outcomes
        assert serials(db_url) == list(range(start, start + 1 + len(committed))), outcomes
    else:
        # Every run observed the version imported, each observation its own number.
        assert serials(db_url) == [start], outcomes
        assert observations(db_url) == [f"v{start}.{n}" for n in range(1, len(froms) + 1)], outcomes
        assert sorted(to for code, _, to in outcomes if code == 0) == observations(db_url), outcomes
    _assert_invariants(db_url)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "observe"])
def test_signals_at_random_points_never_half_write(run_kl, db_url, fake_cache, commit):
    """SIGTERM/SIGINT after a random delay (seeded; KL_CHAOS_SEED replays a failure), around the
    commit of serial+1 (--commit) or the recording of an observation."""
    rng = random.Random(SEED)
    make, _events = fake_cache
    cache = make(FAKE_SLOW_SECONDS="1")
    assert run_kl("state", "import", "prod", "-", input=fake_state(["fake_echo"] * 3 + ["fake_slow"] * 2)).returncode == 0
    extra = ["--commit"] if commit else []
    # One undisturbed run sets the time scale, so the signals land before the run begins, during
    # the reads, around the commit and after the end, whatever the machine's speed.
    t0 = time.monotonic()
    assert run_kl("refresh", "prod", "--provider-search-path", str(cache), *extra).returncode == 0
    span = time.monotonic() - t0
    seen: dict[str, int] = {}
    for i in range(10):
        sig = rng.choice([signal.SIGTERM, signal.SIGINT])
        # From 0.3 s: earlier, the signal hits the interpreter's own start-up (site, which prints
        # Python's fatal-error traceback for a SIGINT there) before any kl code runs.
        delay = rng.uniform(0.3, 1.2 * span)
        runs_before, serials_before, observed_before = len(_runs(db_url)), serials(db_url), observations(db_url)
        p = _popen(["refresh", "prod", "--provider-search-path", str(cache), "--format", "json", *extra])
        time.sleep(delay)
        p.send_signal(sig)
        _out, err = p.communicate(timeout=60)
        err_text = err.decode()
        where = f"iteration {i} (seed {SEED}): {sig.name} after {delay:.2f}s -> exit {p.returncode}: {err_text.strip()}"
        assert "Traceback" not in err_text, where
        runs = _runs(db_url)[runs_before:]
        assert len(runs) <= 1, where
        after, observed = serials(db_url), observations(db_url)
        if not runs:  # the signal came before the run began: nothing may have been written
            assert after == serials_before and observed == observed_before, where
            # Before kl's handlers are in place the signal's default action applies (Python's
            # KeyboardInterrupt -> 130, or death by the signal itself).
            assert p.returncode in (130, -sig), where
            outcome = "before-run"
        else:
            status, frm, to, summary = runs[0]
            if status == "succeeded" and commit:  # it finished (or was committing) before the signal landed
                assert to == frm + 1 and after == serials_before + [to] and observed == observed_before, where
                # The signal landed after the run: during shutdown it may still end the process.
                assert p.returncode in (0, 130, -sig), where
                outcome = "succeeded"
            elif status == "succeeded":  # it finished (or was recording) before the signal landed
                assert after == serials_before and observed == observed_before + [to], where
                assert to == f"v{frm}.{len([o for o in observed if o.startswith(f'v{frm}.')])}", where
                assert p.returncode in (0, 130, -sig), where
                outcome = "succeeded"
            else:
                assert status == "cancelled" and to is None and after == serials_before, where
                assert observed == observed_before, where
                assert p.returncode == 128 + sig, where
                assert "interrupted (SIGINT)" in summary or "terminated (SIGTERM)" in summary, where
                _clean_failure(err_text)
                outcome = "cancelled"
        key = f"{sig.name}:{outcome}"
        seen[key] = seen.get(key, 0) + 1
    print(f"signal outcomes (seed {SEED}, run {span:.1f}s): {seen}")
    _assert_invariants(db_url)


# --- kl refresh racing a real Terraform apply through kl serve -----------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def kl_server(db_url: str):
    """`kl serve` as its own process on loopback, over the test's database; yields its base URL."""
    port = _free_port()
    proc = _popen(["serve", "--listen", f"127.0.0.1:{port}"])
    assert proc.stderr is not None  # _popen pipes it
    line = proc.stderr.readline().decode()
    if "http backend at" not in line:
        proc.kill()
        pytest.fail(f"kl serve did not start: {line}{proc.stderr.read().decode()}")
    yield f"http://127.0.0.1:{port}"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)


TF_LOSER = re.compile(r"Error acquiring the state lock|Failed to save state|409")


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "observe"])
def test_refresh_racing_terraform_apply_through_kl_serve(kl_server, db_url, tmp_path, commit):
    """With --commit the refresh and the apply contend for the lock; without, the refresh observes
    (refused at its start while the apply holds the lock), and its observation opens no drift when
    the apply wrote or still held the state meanwhile."""
    from kit.tfcli import PLUGIN_CACHE, Workspace, tool_binary

    rng = random.Random(SEED)
    ws = Workspace("terraform-1.0.3", tool_binary("terraform-1.0.3"), tmp_path, f"{kl_server}/states/prod")
    ws.write('resource "null_resource" "a" { triggers = { v = "0" } }\n')
    ws.run("init", "-input=false", "-no-color")
    ws.run("apply", "-auto-approve", "-input=false", "-no-color")
    tally: dict[str, int] = {}
    for i in range(1, 5):
        ws.write("".join(f'resource "null_resource" "{n}" {{ triggers = {{ v = "{i}" }} }}\n' for n in "ab"))
        refresh_first = rng.random() < 0.5
        delay = rng.uniform(0.0, 1.5)
        starters = [lambda: ws.start("apply", "-auto-approve", "-input=false", "-no-color"),
                    lambda: _popen(["refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "--format", "json",
                                    *(["--commit"] if commit else [])], cwd=ws.dir)]
        if refresh_first:
            starters.reverse()
        first = starters[0]()
        time.sleep(delay)
        second = starters[1]()
        tf, kl = (second, first) if refresh_first else (first, second)
        tf_out, tf_err = tf.communicate(timeout=300)
        kl_out, kl_err = kl.communicate(timeout=300)
        where = f"round {i} (seed {SEED}, refresh first={refresh_first}, delay {delay:.2f}s)"
        if tf.returncode != 0:
            assert TF_LOSER.search(tf_out + tf_err), f"{where}: terraform failed unexpectedly:\n{tf_out}\n{tf_err}"
        doc = json.loads(kl_out)
        if kl.returncode != 0:
            assert doc["status"] == "failed" and LOSER.search(doc["error"]), f"{where}: {doc}"
            _clean_failure(kl_err.decode())
        else:
            _written(doc, commit)
            if not commit and (doc["base_moved"] or doc["base_locked"]):
                assert doc["open"] == 0, f"{where}: an observation the apply overtook opened drift: {doc}"
        key = f"apply {'ok' if tf.returncode == 0 else 'refused'} / refresh {'ok' if kl.returncode == 0 else 'refused'}"
        tally[key] = tally.get(key, 0) + 1
    print(f"apply/refresh race outcomes (seed {SEED}): {tally}")
    _assert_invariants(db_url)
    # The state Terraform left is still Terraform's: it plans cleanly from what kl serves.
    r = ws.run("plan", "-detailed-exitcode", "-input=false", "-no-color", check=False)
    assert r.returncode in (0, 2), r.stdout + r.stderr
    with psycopg.connect(db_url) as c:
        sources = [s for (s,) in c.execute("SELECT source FROM state_versions WHERE kind = 'terraform' ORDER BY serial")]
    assert "apply" in sources and len(sources) >= 2
    if not commit:  # Terraform's versions are Terraform's own
        assert set(sources) == {"apply"}, sources

