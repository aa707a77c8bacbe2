"""What a small refresh that changes nothing costs in SQL statements, counted as libpq sends them
(psycopg's pure-Python libpq binding, wrapped in the kl process by a site hook): on a few
instances the round trips to PostgreSQL are a large part of kl's time against Terraform's, and a
new lookup here and there would add up unseen."""
from __future__ import annotations

import json
from pathlib import Path

from kit.paths import PLUGIN_CACHE, REPO

# Loaded before kl by the interpreter's site hook: every statement libpq is asked to send, one line
# each (COPY data and cursor fetches' rows are not statements; FETCH and CLOSE are).
_SQL_SPY = """
import os
from psycopg.pq import pq_ctypes

def spying(name):
    real = getattr(pq_ctypes.PGconn, name)
    def send(self, command, *args, **kwargs):
        text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
        with open(os.environ["KL_TEST_SQL_SPY"], "a") as f:
            f.write(" ".join(text.split())[:160] + "\\n")
        return real(self, command, *args, **kwargs)
    setattr(pq_ctypes.PGconn, name, send)

for name in ("send_query", "send_query_params", "send_query_prepared", "exec_", "exec_params", "exec_prepared"):
    spying(name)
"""

# An unchanged refresh of the workspace's 10 instances (five providers), as `kl refresh -q` runs it:
# 80 statements before the schema check, the state's loading and the observation were cut down
# (a migration check in one statement, not four; the state's id looked up once before the commit's
# row lock; a small state's open attributes without a cursor; nothing compared, nor any temporary
# table made, for an observation that read every object back as it is), 57 after.
MAX_STATEMENTS = 74


def test_an_unchanged_small_refresh_sends_no_more_statements_than_it_needs(run_kl, db_url, workspace: Path,
                                                                          tmp_path: Path) -> None:
    r = run_kl("state", "import", "prod", str(workspace / "terraform.tfstate"), "--source", "apply")
    assert r.returncode == 0, r.stderr
    args = ("refresh", "prod", "--provider-search-path", str(PLUGIN_CACHE), "-q")
    for _ in range(2):  # the first may store what the providers' reads rewrite (private data); then steady
        r = run_kl(*args, cwd=workspace)
        assert r.returncode == 0, r.stderr
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SQL_SPY)
    spy = tmp_path / "sql.txt"
    r = run_kl(*args, "--format", "json", cwd=workspace,
               env={"PYTHONPATH": f"{hook}:{REPO}", "PSYCOPG_IMPL": "python", "KL_TEST_SQL_SPY": str(spy)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["status"], out["resources_checked"], out["resources_changed"]) == ("succeeded", 10, 0)
    sent = spy.read_text().splitlines()
    assert any(s.startswith("INSERT INTO refresh_runs") for s in sent)  # the spy saw the run's statements
    assert len(sent) <= MAX_STATEMENTS, f"{len(sent)} statements (at most {MAX_STATEMENTS}):\n" + "\n".join(sent)
