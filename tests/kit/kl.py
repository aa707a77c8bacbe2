"""`python -m kilolock` as a user runs it, from the checkout under test (PYTHONPATH = the repository)."""
from __future__ import annotations

import os
import subprocess
import sys

from kit.paths import REPO


def kl_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("KL_DEBUG", None)
    env.update(extra)
    return env


def kl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kilolock", *args]


NO_DATABASE = "postgresql:///kl-test-asked-for-no-database?host=/nonexistent-kl-test-socket-dir"


def run_kl(*args: str, input: bytes | None = None, env: dict[str, str] | None = None, timeout: float = 120,
           cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run kl with the test's environment (KL_DATABASE_URL) plus ENV; output captured."""
    full_env = dict(os.environ)
    full_env.pop("KL_DEBUG", None)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    if "KL_DATABASE_URL" not in full_env and "KL_DATA_DIR" not in full_env:
        # Neither a test database (db_url) nor a data dir of the test's own: kl would fall back to
        # the machine's embedded database, shared with every other run. Point it at nothing, so
        # such a test fails on its first query instead of reading another run's states.
        full_env["KL_DATABASE_URL"] = NO_DATABASE
    return subprocess.run(kl_cmd(*args), input=input, capture_output=True,
                          env=full_env, timeout=timeout, cwd=str(cwd or REPO))
