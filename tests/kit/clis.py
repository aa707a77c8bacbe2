"""The Terraform / OpenTofu CLIs scripts/test-terraform.sh builds into CACHE/bin, and the wait for a
build still running in the background.

On a cold machine the six compiled CLIs take about 35 minutes of Go builds. scripts/test.sh has
scripts/setup-dev.sh start them in the background (KL_SETUP_CLIS=background), at the lowest CPU
priority, so they use what the test suite leaves idle; the tests that need one run last (the
``compiled_cli`` mark, tests/conftest.py) and wait here for their binary. The build writes its
PID, its log and, when it ends, its exit status under CACHE/bin (BACKGROUND_*)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kit.paths import CACHE

BIN = CACHE / "bin"
COMPILED = ("terraform-1.8.5", "terraform-1.12.2", "terraform-1.13.3", "tofu-1.6.3", "tofu-1.8.5", "tofu-1.12.6")
# Written by scripts/setup-dev.sh into BIN (the same names there).
BACKGROUND_PID = "background-build.pid"
BACKGROUND_LOG = "background-build.log"
BACKGROUND_STATUS = "background-build.status"
# A cold build of all six on two idle cores: about 35 minutes; behind a test run, longer.
WAIT_LIMIT_S = 3600.0


def _running(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def _log_tail(log: Path, lines: int = 15) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "(no log)"
    return "\n".join("  | " + line for line in text)


def compiled_cli(tool: str, *, bin_dir: Path = BIN, limit_s: float = WAIT_LIMIT_S, poll_s: float = 2.0) -> Path:
    """BIN_DIR/TOOL; while a background build runs, wait for it (the binary is moved in place whole,
    so it is complete once it exists). Fails saying what to run, or how the build failed."""
    path, log, status = bin_dir / tool, bin_dir / BACKGROUND_LOG, bin_dir / BACKGROUND_STATUS
    deadline = time.monotonic() + limit_s
    while not path.exists() and not status.exists() and _running(bin_dir / BACKGROUND_PID):
        if time.monotonic() >= deadline:
            pytest.fail(f"{path} is still building in the background after {limit_s:.0f} s; {log} ends:\n{_log_tail(log)}",
                        pytrace=False)
        time.sleep(poll_s)
    if path.exists():
        return path
    if status.exists():
        pytest.fail(f"{path} is missing: its background build ended with status {status.read_text().strip()}; "
                    f"{log} ends:\n{_log_tail(log)}", pytrace=False)
    pytest.fail(f"{path} is missing: run scripts/test-terraform.sh {tool} (a Go build; takes minutes)", pytrace=False)
