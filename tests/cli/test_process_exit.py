"""How `python -m kilolock` ends: an interrupt while still importing is kl's one line, and the fast
exit (kilolock.cli.exit_process, which skips the interpreter's teardown) still flushes every byte
and runs the exit handlers."""
from __future__ import annotations

import os
import subprocess
import sys

from kit.kl import NO_DATABASE
from kit.paths import REPO

# Runs kl as `python -m kilolock` does, with a finder that raises KeyboardInterrupt when the CLI
# package is first imported: what a Ctrl-C (or the chaos runner's SIGINT) during start-up does.
_INTERRUPT_DURING_IMPORT = """
import runpy, sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "kilolock.cli":
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, Interrupt())
sys.argv = ["kl", "version"]
runpy.run_module("kilolock", run_name="__main__", alter_sys=True)
"""

# An exit handler that writes after kl's output, and kl output that is still buffered when main
# returns (stdout to a pipe is block-buffered).
_EXIT_HANDLER = """
import atexit, runpy, sys
atexit.register(lambda: print("exit handler ran", file=sys.stderr))
sys.argv = ["kl", "version"]
runpy.run_module("kilolock", run_name="__main__", alter_sys=True)
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_an_interrupt_while_importing_is_one_line_and_exit_130() -> None:
    r = _python(_INTERRUPT_DURING_IMPORT)
    assert r.returncode == 130
    assert r.stderr == "kl: interrupted\n"


def test_the_fast_exit_flushes_output_and_runs_exit_handlers() -> None:
    r = _python(_EXIT_HANDLER)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("kilolock") and r.stdout.endswith("\n"), r.stdout
    assert r.stderr == "exit handler ran\n"


# kl run by a Python that lacks its dependencies (the system python3 in a checkout, where
# `python3 -m kilolock` finds the package but not psycopg): a None in sys.modules makes the import
# fail exactly as a missing package does.
_WITHOUT_PSYCOPG = """
import runpy, sys
sys.modules["psycopg"] = None
sys.argv = ["kl", "state", "list"]
runpy.run_module("kilolock", run_name="__main__", alter_sys=True)
"""


def test_a_python_without_kls_dependencies_is_told_which_python_to_use() -> None:
    r = subprocess.run([sys.executable, "-c", _WITHOUT_PSYCOPG], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "KL_DATABASE_URL": NO_DATABASE})
    assert r.returncode == 1, r
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert "internal error" not in r.stderr and "psycopg" in r.stderr and sys.executable in r.stderr, r.stderr
    assert ".venv/bin/activate" in r.stderr, r.stderr
