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
