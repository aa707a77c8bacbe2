"""The operator-facing scripts run as written (they use the .venv made by scripts/setup-dev.sh)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_script(path: str, timeout: float = 300) -> subprocess.CompletedProcess:
    if not (REPO / ".venv" / "bin" / "python").exists():
        pytest.fail("the scripts need .venv: run scripts/setup-dev.sh", pytrace=False)
    env = {k: v for k, v in os.environ.items() if k not in ("KL_DATABASE_URL", "KL_DATA_DIR")}
    return subprocess.run(["bash", str(REPO / path)], capture_output=True, text=True, timeout=timeout, env=env)


def test_smoke_script():
    r = run_script("scripts/smoke.sh")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "smoke: OK" in r.stdout


def test_drift_demo_finds_the_same_drift_both_ways():
    r = run_script("examples/big-state/drift-demo.sh")
    assert r.returncode == 0, r.stdout + r.stderr
    raw_part, kl_part = r.stdout.split("== b. Kilolock")
    assert "local_file.app_config\tdeleted" in raw_part and "local_file.app_config\tdeleted" in kl_part
    assert "timings: raw files + jq" in kl_part


def test_demo_is_quiet_and_ends_with_commands_that_work_as_printed(db_url, tmp_path):
    """scripts/demo.sh where setup has run (as in CI): a few short lines, and its closing lines are
    commands a user can paste, from any directory, on the state it made."""
    from kit.paths import CACHE

    env = {k: v for k, v in os.environ.items() if k != "KL_DATA_DIR"}
    env.update(KL_DATABASE_URL=db_url, KL_DEMO_DIR=str(tmp_path / "demo"), KL_TEST_CACHE=str(CACHE))
    r = subprocess.run(["bash", str(REPO / "scripts" / "demo.sh")], capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert 'local_file.config["b"]' in r.stdout and "deleted" in r.stdout, out
    assert len(out.splitlines()) < 50, out
    closing = r.stdout[r.stdout.index("Run kl yourself"):].splitlines()[1:]
    drift_cmd, refresh_cmd = (line.split("#")[0].strip() for line in closing[:2])
    assert drift_cmd.startswith(str(REPO / ".venv" / "bin" / "kl")), closing

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shell = {"cwd": elsewhere, "env": env, "capture_output": True, "text": True, "timeout": 120}
    refreshed = subprocess.run(["bash", "-c", refresh_cmd], **shell)  # deletes out/a.conf, then refreshes
    assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
    drift = subprocess.run(["bash", "-c", drift_cmd], **shell)
    assert drift.returncode == 0, drift.stdout + drift.stderr
    assert 'local_file.config["a"]' in drift.stdout and 'local_file.config["b"]' in drift.stdout, drift.stdout


def _setup_with_fake_go(tmp_path: Path, go_exit: int) -> tuple[subprocess.CompletedProcess, Path]:
    """scripts/setup-dev.sh narrowed as the demo narrows it, with a `go` that prints what a cold
    `go install` prints and exits GO_EXIT (on success it leaves the binary go install would)."""
    from kit.paths import TERRAFORM

    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "go").write_text("#!/bin/sh\n"
                                 "for i in 1 2 3; do echo \"go: downloading example.com/m$i v1.0.$i\" >&2; done\n"
                                 f"[ {go_exit} = 0 ] && printf '#!/bin/sh\\n' > \"$GOBIN/terraform-provider-local\"\n"
                                 f"exit {go_exit}\n")
    (fake_bin / "go").chmod(0o755)
    cache = tmp_path / "cache"
    (cache / "bin").mkdir(parents=True)
    (cache / "bin" / "terraform-1.0.3").symlink_to(TERRAFORM)
    log = tmp_path / "logs" / "setup.log"
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "KL_TEST_CACHE": str(cache),
           "KL_SETUP_EXTRAS": "", "KL_SETUP_PROVIDERS": "local", "KL_SETUP_TERRAFORMS": "terraform-1.0.3",
           "KL_SETUP_LOG": str(log)}
    r = subprocess.run(["bash", str(REPO / "scripts" / "setup-dev.sh")], capture_output=True, text=True, timeout=900, env=env)
    return r, log


def test_setup_log_takes_the_installers_noise(tmp_path):
    r, log = _setup_with_fake_go(tmp_path, go_exit=0)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "go: downloading" not in r.stdout + r.stderr
    assert "go: downloading example.com/m1 v1.0.1" in log.read_text()
    assert "test-providers: local" in r.stderr and r.stderr.rstrip().endswith("setup: ready"), r.stderr
    assert all(line.startswith(("setup: ", "test-providers: ")) for line in r.stderr.splitlines()), r.stderr


def test_setup_failure_shows_the_logs_tail_and_path(tmp_path):
    r, log = _setup_with_fake_go(tmp_path, go_exit=1)
    assert r.returncode != 0
    assert f"setup: failed; the last lines of {log}:" in r.stderr, r.stderr
    assert "  | go: downloading example.com/m3 v1.0.3" in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith(f"setup: full output: {log}"), r.stderr
