"""The operator-facing scripts run as written (they use the .venv made by scripts/setup-dev.sh)."""
from __future__ import annotations

import os
import subprocess
import time
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
    # An attribute the provider reads back, changed behind Terraform's back: its before and after.
    assert 'testsdk_thing.server["web-1"]: changed' in r.stdout, out
    assert 'tags["size"]: "small" → "large"' in r.stdout, out
    assert 'testsdk_thing.server["web-2"]' not in r.stdout, out
    assert len(out.splitlines()) < 60, out  # two providers' refresh lines and kl status: no installer noise
    setup_log = (tmp_path / "demo" / "setup.log").read_text().splitlines()
    assert setup_log[-1] == "setup: ready" and "setup: providers: local testsdk ready" in setup_log[-3], setup_log[-8:]
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
    accept_cmd = closing[2].split("#")[0].strip()
    accepting = subprocess.run(["bash", "-c", accept_cmd], **shell)
    assert accepting.returncode == 0, accepting.stdout + accepting.stderr
    assert "would accept demo" not in accepting.stdout and "would accept v" in accepting.stdout, accepting.stdout


def _fake_go(tmp_path: Path, go_exit: int, terraform_exit: int = 0) -> Path:
    """A `go` that prints what a cold `go install` prints and exits GO_EXIT; on success it leaves
    the binary go install would. `go install` of Terraform takes 3 s and exits TERRAFORM_EXIT."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "go").write_text("#!/bin/sh\n"
                                 "for a; do last=$a; done; module=${last%@*}\n"
                                 "for i in 1 2 3; do echo \"go: downloading example.com/m$i v1.0.$i\" >&2; done\n"
                                 f"code={go_exit}\n"
                                 f"case $module in */hashicorp/terraform) sleep 3; code={terraform_exit};; esac\n"
                                 "[ $code = 0 ] && printf '#!/bin/sh\\n' > \"$GOBIN/${module##*/}\"\n"
                                 "exit $code\n")
    (fake_bin / "go").chmod(0o755)
    return fake_bin


def _fake_cache(tmp_path: Path, *compiled: str) -> Path:
    from kit.paths import TERRAFORM

    cache = tmp_path / "cache"
    (cache / "bin").mkdir(parents=True)
    (cache / "bin" / "terraform-1.0.3").symlink_to(TERRAFORM)
    for tool in compiled:
        (cache / "bin" / tool).write_text("#!/bin/sh\n")
        (cache / "bin" / tool).chmod(0o755)
    return cache


def _setup_with_fake_go(tmp_path: Path, go_exit: int) -> tuple[subprocess.CompletedProcess, Path]:
    """scripts/setup-dev.sh narrowed as the demo narrows it, with a fake `go` (_fake_go)."""
    fake_bin, cache = _fake_go(tmp_path, go_exit), _fake_cache(tmp_path)
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
    logged = log.read_text().splitlines()
    assert "go: downloading example.com/m1 v1.0.1" in logged
    # The log ends with what each step did, not with the last installer's noise.
    tail = logged[logged.index("setup: PostgreSQL server binaries: present (0 s)"):]
    assert [line.split(":")[1].strip() for line in tail] == [
        "PostgreSQL server binaries", "chromium, chromium-driver", "pgbouncer", "zsh, fish", ".venv", "providers",
        "Terraform/OpenTofu CLIs", "ready"], tail
    assert "setup: providers: local ready" in tail[5], tail
    # Narrowed as the demo narrows it (no test extra): no browser, pooler or shells installed for tests it does not run.
    assert tail[1:4] == [f"setup: {step}: not needed (no test extra) (0 s)" for step in
                         ("chromium, chromium-driver", "pgbouncer", "zsh, fish")], tail
    assert "test-providers: local" in r.stderr and r.stderr.rstrip().endswith("setup: ready"), r.stderr
    assert all(line.startswith(("setup: ", "test-providers: ")) for line in r.stderr.splitlines()), r.stderr


def test_setup_failure_shows_the_logs_tail_and_path(tmp_path):
    r, log = _setup_with_fake_go(tmp_path, go_exit=1)
    assert r.returncode != 0
    assert f"setup: failed; the last lines of {log}:" in r.stderr, r.stderr
    assert "  | go: downloading example.com/m3 v1.0.3" in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith(f"setup: full output: {log}"), r.stderr


def _setup_in_background_mode(tmp_path: Path, terraform_exit: int) -> tuple[subprocess.CompletedProcess, Path]:
    """setup-dev.sh as scripts/test.sh runs it, with every CLI in place but Terraform 1.8.5."""
    fake_bin = _fake_go(tmp_path, 0, terraform_exit)
    cache = _fake_cache(tmp_path, "terraform-1.12.2", "terraform-1.13.3", "tofu-1.6.3", "tofu-1.8.5", "tofu-1.12.6")
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "KL_TEST_CACHE": str(cache),
           "KL_SETUP_EXTRAS": "", "KL_SETUP_PROVIDERS": "local", "KL_SETUP_CLIS": "background"}
    env.pop("KL_SETUP_TERRAFORMS", None)
    r = subprocess.run(["bash", str(REPO / "scripts" / "setup-dev.sh")], capture_output=True, text=True, timeout=900, env=env)
    return r, cache / "bin"


def test_setup_builds_a_missing_compiled_cli_in_the_background_and_its_tests_wait_for_it(tmp_path):
    from kit.clis import compiled_cli

    r, bin_dir = _setup_in_background_mode(tmp_path, terraform_exit=0)
    assert r.returncode == 0, r.stderr
    assert "setup: building terraform-1.8.5 in the background" in r.stderr and r.stderr.rstrip().endswith("setup: ready")
    assert not (bin_dir / "terraform-1.8.5").exists()  # setup did not wait for the build
    assert compiled_cli("terraform-1.8.5", bin_dir=bin_dir, limit_s=120, poll_s=0.1) == bin_dir / "terraform-1.8.5"
    deadline = time.monotonic() + 30
    while (bin_dir / "background-build.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (bin_dir / "background-build.status").read_text().strip() == "0"
    assert not (bin_dir / "background-build.pid").exists()


def test_a_failed_background_build_fails_the_tests_that_wait_with_its_log(tmp_path):
    from kit.clis import compiled_cli

    r, bin_dir = _setup_in_background_mode(tmp_path, terraform_exit=1)
    assert r.returncode == 0, r.stderr  # the failure belongs to the tests that need the CLI
    with pytest.raises(pytest.fail.Exception) as failed:
        compiled_cli("terraform-1.8.5", bin_dir=bin_dir, limit_s=120, poll_s=0.1)
    message = str(failed.value)
    assert "its background build ended with status 1" in message and "go: downloading example.com/m3" in message, message
