"""A worker refreshing on a short schedule never gets in Terraform's way, and never reports what an
apply was changing as drift: real Terraform 1.8.5 through a real `kl serve` process runs
`plan -out`, waits, and applies the saved plan, round after round, while a real `kl worker`
refreshes the state on its schedule (observations), with a real webhook receiver on a channel for
every drift event.

Each round changes a local_file's content (a replacement: the file is deleted and written again),
so a refresh that reads while an apply changes it sees an object its base version does not have.
Every saved plan must apply (a refresh never moves Terraform's serial: no "Saved plan is stale"),
Terraform must never meet a lock error (an observation takes no lock), the worker must have
recorded observations while each plan waited, and no drift may be found for any of it: not a
record, not an event, not a webhook call. At the end a file deleted out of band must be announced
(drift.new), so the silence before it is not that of a broken pipeline.

CI size: 3 rounds, a 6 s wait between plan and apply, a 2 s schedule. The issue's full size (5
rounds, 20 s wait, 5 s schedule): KL_OBSERVE_LOOP=full. Offline: the local provider comes from the
filesystem mirror of scripts/test-providers.sh."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from kit.fleet import q, start_worker, stop, wait_for
from kit.kl import run_kl
from kit.klserve import KlServe
from kit.tfcli import Workspace, local_tf, tool_binary
from kit.webhook import Receiver

TOOL = "terraform-1.8.5"
STATE = "loop/app"
FULL = os.environ.get("KL_OBSERVE_LOOP") == "full"
ROUNDS, WAIT_S, EVERY = (5, 20.0, "5s") if FULL else (3, 6.0, "2s")
DRIFT_EVENTS = "drift.new,drift.updated,drift.resolved"


def _config(url: str, out: Path) -> str:
    return local_tf(url, f"""variable "round" {{
  default = "0"
}}
resource "local_file" "changing" {{
  filename = "{out / 'changing.txt'}"
  content  = "round-${{var.round}}"
}}
resource "local_file" "steady" {{
  filename = "{out / 'steady.txt'}"
  content  = "steady"
}}
""")


def _ok(r: Any) -> Any:
    assert r.returncode == 0, (r.stdout + r.stderr).decode()
    return r


def _current(db_url: str) -> tuple[str, int]:
    """Terraform's current version of the state: (id, serial)."""
    rows = q(db_url, "SELECT v.id, v.serial FROM state_versions v JOIN states s ON s.id = v.state_id "
                     "WHERE s.name = %s AND v.kind = 'terraform' ORDER BY v.serial DESC LIMIT 1", (STATE,))
    return str(rows[0][0]), int(rows[0][1])


def _observations_of(db_url: str, version_id: str) -> int:
    return int(q(db_url, "SELECT count(*) FROM state_versions WHERE base_version_id = %s AND kind = 'observation'",
                 (version_id,))[0][0])


def _runs_ended(db_url: str) -> int:
    return int(q(db_url, "SELECT count(*) FROM refresh_runs WHERE status <> 'running'")[0][0])


def _lock_trouble(output: str) -> bool:
    """An error about the lock (taking it, releasing it, a conflict). Not "Acquiring state lock",
    which Terraform prints whenever taking it is slow."""
    return any("error" in line.lower() and "lock" in line.lower() for line in output.splitlines())


def test_saved_plans_apply_while_a_worker_observes_on_a_schedule(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "files"
    out.mkdir()
    receiver = Receiver()
    serve = KlServe(db_url, "-q", env={"KL_SERVE_TOKEN": ""})
    worker = None
    try:
        ws = Workspace(TOOL, tool_binary(TOOL), tmp_path / "ws", f"{serve.http}/states/{STATE}")
        ws.dir.mkdir()
        (ws.dir / "main.tf").write_text(_config(ws.url, out))
        ws.run("init", "-input=false", "-no-color")
        ws.run("apply", "-auto-approve", "-input=false", "-no-color")
        # Providers run in the workspace: it has the local provider under .terraform/providers.
        _ok(run_kl("state", "set", STATE, "--workdir", str(ws.dir)))
        _ok(run_kl("notify", "add", "hooks", "--webhook", receiver.url, "--events", DRIFT_EVENTS))
        _ok(run_kl("schedule", "set", "--states", STATE, "--every", EVERY))
        worker = start_worker(db_url, "looper", log=tmp_path / "worker.log")

        started = time.monotonic()
        observed_while_waiting = []
        for n in range(1, ROUNDS + 1):
            plan = ws.run("plan", "-var", f"round={n}", "-out=p.plan", "-input=false", "-no-color", check=False)
            assert plan.returncode == 0 and not _lock_trouble(plan.stdout + plan.stderr), plan.stdout + plan.stderr
            planned_on, _ = _current(db_url)
            # The wait for approval is the scenario: the worker refreshes all through it. It ends
            # once WAIT_S has passed and a refresh run has ended since the plan.
            wait_ends, runs_before = time.monotonic() + WAIT_S, _runs_ended(db_url)
            wait_for("a refresh run while the plan waits", lambda b=runs_before: _runs_ended(db_url) > b,
                     timeout=WAIT_S + 120)
            time.sleep(max(0.0, wait_ends - time.monotonic()))
            observed_while_waiting.append(_observations_of(db_url, planned_on))

            applied = ws.run("apply", "-input=false", "-no-color", "p.plan", check=False)
            said = applied.stdout + applied.stderr
            assert applied.returncode == 0 and "Saved plan is stale" not in said, f"round {n}: the saved plan was refused:\n{said}"
            assert not _lock_trouble(said), f"round {n}: Terraform met a lock error:\n{said}"
            assert (out / "changing.txt").read_text() == f"round-{n}"
            assert observed_while_waiting[-1] > 0, f"round {n}: the worker observed nothing while the plan waited"
        loop_s = time.monotonic() - started

        # The last apply's version is observed too, as Terraform wrote it.
        last, serial = _current(db_url)
        wait_for("an observation of the last applied version", lambda: _observations_of(db_url, last) > 0, timeout=120)
        assert serial == 1 + ROUNDS  # the first apply, then one per round: nothing else took a serial

        # No false drift: nothing was ever opened (an opened-then-resolved record would have been
        # announced), so nothing was written to the outbox nor sent.
        assert q(db_url, "SELECT address, kind, resolved_how FROM drift_records") == []
        assert q(db_url, "SELECT kind, detail FROM notify_events WHERE kind LIKE 'drift.%%'") == []
        assert receiver.events() == []

        # The pipeline works: a file deleted behind Terraform's back is announced by the worker.
        (out / "steady.txt").unlink()
        got = receiver.wait_for(1, "drift.new", timeout=120)
        assert [a["address"] for e in got for a in e.json["addresses"]] == ["local_file.steady"], [e.json for e in got]

        runs = q(db_url, "SELECT status, count(*), array_agg(DISTINCT left(error_summary, 120)) FROM refresh_runs "
                         "GROUP BY status ORDER BY status")
        print(f"\nobserve loop ({'full' if FULL else 'CI'} size: {ROUNDS} rounds, {WAIT_S:g} s wait, every {EVERY}): "
              f"{loop_s:.1f} s; observations while each plan waited: {observed_while_waiting}; runs: {runs}")
    finally:
        if worker is not None:
            code, _ = stop(worker)
            assert code == 0, (tmp_path / "worker.log").read_text()
        serve.stop()
        receiver.close()
