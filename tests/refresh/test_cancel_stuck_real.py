"""Cancellation when a provider call is stuck where StopProvider cannot reach it: the real local
provider reading a local_file whose file was replaced by a FIFO blocks in the read until someone
writes to it, whatever Stop says. SIGINT, SIGTERM, a second signal and --timeout must still end
the run: the providers are shut down after a short grace, the audit row says `cancelled`, nothing
is committed, and no provider process is left (tests/refresh/conftest.py checks that).

The tests wait for the process with a generous deadline and check how it ended, never how long
it took: before the fix, each of them hung until --rpc-timeout (10 minutes)."""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from kit.fleet import wait_for
from kit.kl import kl_cmd, kl_env
from kit.procs import default_signals
from kit.stuck import add_fifo_state, reads_stuck

DEADLINE = 60.0  # far beyond the grace and the shutdown after it, far below --rpc-timeout
# A grace no run in these tests may wait out: only a second signal ends it in time.
LONG_GRACE = "10m"


def start(db_url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(kl_cmd(*args), env=kl_env(KL_DATABASE_URL=db_url, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=default_signals)  # noqa: PLW1509 - the tests signal them


def ended(proc: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"kl did not end within {DEADLINE:g}s of the cancel:\n{(err or b'').decode()}") from None
    return proc.returncode, out.decode(), (err or b"").decode()


def runs(db_url: str) -> list[tuple[str, str, str, object]]:
    """(state, status, error_summary or "", to_version_id) of every refresh run, by state."""
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT s.name, rr.status, coalesce(rr.error_summary, ''), rr.to_version_id FROM refresh_runs rr "
                         "JOIN states s ON s.id = rr.state_id ORDER BY s.name, rr.started_at").fetchall()


def serials(db_url: str) -> list[tuple[str, int]]:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT s.name, v.serial FROM state_versions v JOIN states s ON s.id = v.state_id "
                         "ORDER BY 1, 2").fetchall()


@pytest.fixture
def stuck(db_url: str, tmp_path: Path) -> Path:
    """State "prod": one local_file whose file is a FIFO; returns the FIFO."""
    [fifo] = add_fifo_state(db_url, "prod", tmp_path / "ws", ["a"])
    return fifo


@pytest.mark.usefixtures("read_path")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_a_run_whose_provider_read_is_stuck(db_url, stuck, sig):
    proc = start(db_url, "refresh", "prod", "--format", "json")
    with reads_stuck([stuck]):
        proc.send_signal(sig)
        code, out, err = ended(proc)
    why = "interrupted (SIGINT)" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert code == 128 + sig, err
    result = json.loads(out)
    assert (result["status"], result["error"], result["to_serial"]) == ("cancelled", why, None), result
    assert err.strip() == f"kl: refresh cancelled: {why}"
    [(_, status, summary, to_version)] = runs(db_url)
    assert (status, to_version) == ("cancelled", None) and why in summary
    assert serials(db_url) == [("prod", 1)]


def test_a_second_sigint_ends_at_once_whatever_the_grace(db_url, stuck, tmp_path):
    log = tmp_path / "kl.log"
    with open(log, "wb") as err_file:
        # KL_LOG=info: the line that says the first signal was taken (two signals sent back to back
        # may reach the process as one).
        proc = subprocess.Popen(kl_cmd("refresh", "prod", "--format", "json"), stdout=subprocess.PIPE, stderr=err_file,
                                env=kl_env(KL_DATABASE_URL=db_url, KL_STOP_GRACE=LONG_GRACE, KL_LOG="info"),
                                preexec_fn=default_signals)  # noqa: PLW1509 - the tests signal them
    with reads_stuck([stuck]):
        proc.send_signal(signal.SIGINT)
        wait_for("the first SIGINT taken", lambda: "run cancelled (interrupted (SIGINT))" in log.read_text(),
                 timeout=DEADLINE)
        proc.send_signal(signal.SIGINT)
        code, out, _ = ended(proc)
    assert code == 130, log.read_text()
    assert json.loads(out)["status"] == "cancelled"
    [(_, status, summary, to_version)] = runs(db_url)
    assert (status, to_version) == ("cancelled", None) and "interrupted (SIGINT)" in summary
    assert serials(db_url) == [("prod", 1)]


def test_timeout_ends_a_run_whose_provider_read_is_stuck(db_url, stuck):
    proc = start(db_url, "refresh", "prod", "--format", "json", "--timeout", "2s")
    with reads_stuck([stuck]):
        code, out, err = ended(proc)
    assert code == 1, err
    result = json.loads(out)
    assert (result["status"], result["error"], result["to_serial"]) == ("cancelled", "timed out after 2s", None)
    [(_, status, summary, to_version)] = runs(db_url)
    assert (status, to_version) == ("cancelled", None) and "timed out after 2s" in summary
    assert serials(db_url) == [("prod", 1)]


def test_sigint_ends_every_stuck_state_of_refresh_all(db_url, tmp_path):
    fifos = [fifo for name in ("team/a", "team/b") for fifo in add_fifo_state(db_url, name, tmp_path / name, ["a"])]
    proc = start(db_url, "refresh", "--all", "--parallel-states", "2", "--format", "json")
    with reads_stuck(fifos):
        proc.send_signal(signal.SIGINT)
        code, out, err = ended(proc)
    assert code == 130, err
    assert json.loads(out)["cancelled"] == 2
    assert [(name, status, to) for name, status, _, to in runs(db_url)] == [("team/a", "cancelled", None),
                                                                            ("team/b", "cancelled", None)]
    assert serials(db_url) == [("team/a", 1), ("team/b", 1)]
