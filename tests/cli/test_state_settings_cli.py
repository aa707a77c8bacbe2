"""`kl state set/show/unlock`, the lock in `kl status`, and how `kl refresh` merges stored settings
with its flags (issue 12), as separate processes against a real database."""
from __future__ import annotations

import json

import psycopg

from kilolock.store import locks, states
from kit.pg import one_row


def err_line(r) -> str:
    """The one `kl:` line (a usage error adds the command's usage line after it)."""
    lines = r.stderr.decode().splitlines()
    assert lines and "Traceback" not in r.stderr.decode(), lines
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("usage: kl ")), lines
    return lines[0].strip()


def test_set_show_and_unset_settings(db_url, run_kl, make_state, tmp_path):
    assert run_kl("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}})).returncode == 0
    empty = json.loads(run_kl("state", "show", "prod", "--format", "json").stdout)
    assert empty == {"version": 1, "state": "prod", "updated_at": None, "updated_by": None,
                     "settings": {"workdir": None, "provider_search_paths": None, "provider_parallelism": None, "actor": None,
                                  "encryption": None, "store_decrypted_attributes": False}}
    text = run_kl("state", "show", "prod").stdout.decode()
    assert "workdir:              (not set: providers run in kl's directory and no deletion is committed)" in text

    (tmp_path / "tf").mkdir()
    r = run_kl("state", "set", "prod", "--workdir", "tf", "--provider-search-path", "/opt/a", "--provider-search-path", "b",
               "--provider-parallelism", "4", "--actor", "cron@ops", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().startswith("prod: settings stored\n") and r.stderr == b""
    shown = json.loads(run_kl("state", "show", "prod", "--format", "json").stdout)
    # Relative paths are made absolute where `kl state set` ran: every later run reads the same ones.
    assert shown["settings"] == {"workdir": str(tmp_path / "tf"), "provider_search_paths": ["/opt/a", str(tmp_path / "b")],
                                 "provider_parallelism": 4, "actor": "cron@ops", "encryption": None,
                                 "store_decrypted_attributes": False}
    assert shown["updated_by"].endswith("@cli") and shown["updated_at"]
    text = run_kl("state", "show", "prod").stdout.decode()
    assert f"workdir:              {tmp_path / 'tf'}\n" in text and "provider parallelism: 4\n" in text

    # One setting changes, the others stay; --unset removes one.
    assert run_kl("state", "set", "prod", "--provider-parallelism", "2").returncode == 0
    assert run_kl("state", "set", "prod", "--unset", "actor", "--unset", "provider-search-path").returncode == 0
    shown = json.loads(run_kl("state", "show", "prod", "--format", "json").stdout)["settings"]
    assert shown == {"workdir": str(tmp_path / "tf"), "provider_search_paths": None, "provider_parallelism": 2, "actor": None,
                     "encryption": None, "store_decrypted_attributes": False}

    # auto (0011) is stored as a word, a number as a number; unset means auto.
    assert run_kl("state", "set", "prod", "--provider-parallelism", "auto").returncode == 0
    assert json.loads(run_kl("state", "show", "prod", "--format", "json").stdout)["settings"]["provider_parallelism"] == "auto"
    assert "provider parallelism: auto\n" in run_kl("state", "show", "prod").stdout.decode()
    assert run_kl("state", "set", "prod", "--unset", "provider-parallelism").returncode == 0
    assert "provider parallelism: (not set: auto)\n" in run_kl("state", "show", "prod").stdout.decode()

    # A workdir that this host lacks is stored (it is the refreshing host's path), with a note.
    r = run_kl("state", "set", "prod", "--workdir", "/srv/nowhere")
    assert r.returncode == 0 and err_line(r) == "note: /srv/nowhere is not a directory on this host; a refresh here would fail"


def test_set_refuses_what_it_cannot_store(db_url, run_kl, make_state):
    r = run_kl("state", "set", "ghost", "--workdir", "/tmp")
    assert r.returncode == 1 and err_line(r) == "kl: no state named 'ghost' (see `kl state list`)"
    assert run_kl("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}})).returncode == 0
    r = run_kl("state", "set", "prod")
    assert r.returncode == 2 and "nothing to change" in err_line(r)
    r = run_kl("state", "set", "prod", "--actor", "x", "--unset", "actor")
    assert r.returncode == 2 and err_line(r) == "kl: kl state set: --actor and --unset actor together; give one"
    for bad in (["--unset", "colour"], ["--provider-parallelism", "0"], ["--provider-parallelism", "automatic"]):
        r = run_kl("state", "set", "prod", *bad)
        assert r.returncode == 2, (bad, r.stderr)
        err_line(r)
    assert json.loads(run_kl("state", "show", "prod", "--format", "json").stdout)["updated_at"] is None


def test_status_shows_the_lock_id_and_unlock_needs_it(db_url, run_kl, make_state):
    assert run_kl("state", "import", "prod", "-", input=make_state(1, {"a": {"id": "1"}})).returncode == 0
    info = locks.lock_info("OperationTypeApply", "alice@laptop", "1.0.3")
    with psycopg.connect(db_url, autocommit=True) as c:
        locks.acquire(c, states.state_id(c, "prod"), "prod", info, "alice")
    text = run_kl("status", "prod").stdout.decode()
    assert f"locked:       by alice@laptop (OperationTypeApply, since {info['Created']}), lock ID {info['ID']}\n" in text
    assert json.loads(run_kl("status", "prod", "--format", "json").stdout)["lock"] == info

    r = run_kl("state", "unlock", "prod", "--lock-id", "not-it")
    assert r.returncode == 1
    assert err_line(r) == (f"kl: state 'prod' is locked by alice@laptop (OperationTypeApply, lock {info['ID']}, since {info['Created']}); "
                           "its lock ID is not not-it; nothing unlocked")
    assert run_kl("state", "unlock", "prod").returncode == 2  # the ID is the confirmation: required
    r = run_kl("state", "unlock", "prod", "--lock-id", info["ID"], "--actor", "ops")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == (f"prod: unlocked lock {info['ID']} held by alice@laptop (OperationTypeApply, since {info['Created']})\n")
    assert "locked:       no" in run_kl("status", "prod").stdout.decode()
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT event, lock_id, who, actor FROM lock_events ORDER BY created_at DESC LIMIT 1").fetchone() == (
            "force_unlock", info["ID"], "alice@laptop", "ops")
    r = run_kl("state", "unlock", "prod", "--lock-id", info["ID"])
    assert r.returncode == 0 and r.stdout == b"prod: not locked; nothing unlocked\n"
    r = run_kl("state", "unlock", "ghost", "--lock-id", "x")
    assert r.returncode == 1 and err_line(r) == "kl: no state named 'ghost' (see `kl state list`)"


def test_refresh_uses_stored_settings_and_flags_win_for_one_run(db_url, run_kl, make_state, tmp_path):
    # A state with no managed instances: the run reaches the commit without any provider.
    assert run_kl("state", "import", "prod", "-", input=make_state(1, {})).returncode == 0
    assert run_kl("state", "set", "prod", "--actor", "cron@ops", "--workdir", str(tmp_path / "gone")).returncode == 0
    r = run_kl("refresh", "prod", "--format", "json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "failed" and out["to_serial"] is None
    assert out["error"] == (f"workdir {tmp_path / 'gone'} of state 'prod' does not exist on this host; nothing was refreshed "
                            "(`kl state set prod --workdir DIR` changes it, --workdir DIR overrides it for one run)")
    assert err_line(r) == f"kl: refresh failed: {out['error']}"
    # --workdir and --actor override the stored ones for this run only.
    r = run_kl("refresh", "prod", "--format", "json", "--workdir", str(tmp_path), "--actor", "me@laptop")
    assert r.returncode == 0, r.stderr
    r = run_kl("refresh", "prod", "--format", "json", "--workdir", ".", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with psycopg.connect(db_url) as c:
        actors = [a for (a,) in c.execute("SELECT actor FROM refresh_runs ORDER BY started_at")]
        assert actors == ["cron@ops", "me@laptop", "cron@ops"]
        assert [s for (s,) in c.execute("SELECT status FROM refresh_runs ORDER BY started_at")] == ["failed", "succeeded", "succeeded"]
    assert json.loads(run_kl("state", "show", "prod", "--format", "json").stdout)["settings"]["workdir"] == str(tmp_path / "gone")


def test_refresh_lock_timeout_and_dry_run_on_a_locked_state(db_url, run_kl, make_state):
    assert run_kl("state", "import", "prod", "-", input=make_state(1, {})).returncode == 0
    info = locks.lock_info("OperationTypeApply", "alice@laptop", "1.0.3")
    with psycopg.connect(db_url, autocommit=True) as c:
        locks.acquire(c, states.state_id(c, "prod"), "prod", info, "alice")
    r = run_kl("refresh", "prod", "--lock-timeout", "1s", "--format", "json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["error"].endswith("waited 1s (--lock-timeout)") and info["ID"] in out["error"]
    r = run_kl("refresh", "prod", "--lock-timeout", "1d", "--dry-run", "--format", "json")
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["status"] == "succeeded" and out["to_serial"] is None, r.stderr
    with psycopg.connect(db_url) as c:
        assert one_row(c, "SELECT count(*) FROM state_versions")[0] == 1
        assert one_row(c, "SELECT lock_id FROM state_locks")[0] == info["ID"]
    for bad in ("5", "1w", "1d3x"):
        r = run_kl("refresh", "prod", "--lock-timeout", bad)
        assert r.returncode == 2 and "invalid duration" in err_line(r), bad


def test_the_lock_wait_progress_line_is_rewritten_then_cleared(capsys):
    from kilolock.cli.refreshcmd import _Progress

    p = _Progress()
    p.lock_wait({"ID": "abc", "Who": "alice@laptop", "Operation": "OperationTypeApply"}, 3.2, 300)
    p.lock_wait({"ID": "abc", "Who": "alice@laptop", "Operation": "OperationTypeApply"}, 65, 300)
    p.end()
    err = capsys.readouterr().err
    assert err == ("\r\x1b[Kwaiting for the lock held by alice@laptop (OperationTypeApply, lock ID abc): 3s of 5m00s"
                   "\r\x1b[Kwaiting for the lock held by alice@laptop (OperationTypeApply, lock ID abc): 1m05s of 5m00s"
                   "\r\x1b[K")
