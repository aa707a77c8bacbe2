"""examples/ci: the scripts the GitHub Actions workflow and the GitLab CI job call, run here as those
jobs run them, against a real state in a real store (a Terraform-applied workspace, refreshed with
the real null and local providers from its .terraform/providers), and the GitLab note posted to a
local HTTP server standing in for GitLab's API. The YAML files are read as the CI systems read
them, and every script they call exists."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.kl import kl_env, run_kl
from kit.paths import LOCAL_V, PLUGIN_CACHE, REPO, TERRAFORM
from kit.procs import assert_no_new_providers, provider_pids
from kit.tfworkspace import terraform

CI = REPO / "examples" / "ci"
TWO = 'local_file.f["two"]'

CONFIG = f"""
terraform {{
  required_providers {{
    null  = {{ source = "hashicorp/null", version = "2.1.2" }}
    local = {{ source = "hashicorp/local", version = "{LOCAL_V}" }}
  }}
}}
resource "null_resource" "n" {{
  count    = 2
  triggers = {{ index = count.index }}
}}
resource "local_file" "f" {{
  for_each = toset(["one", "two"])
  filename = "${{path.module}}/out/${{each.key}}.txt"
  content  = "hello ${{each.key}}"
}}
"""


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for path, script in ((TERRAFORM, "scripts/test-terraform.sh"),
                         (PLUGIN_CACHE / "registry.terraform.io/hashicorp/local" / LOCAL_V, "scripts/test-providers.sh")):
        if not path.exists():
            pytest.fail(f"{path} is missing: run {script}", pytrace=False)
    ws = tmp_path_factory.mktemp("ci-tf")
    (ws / "main.tf").write_text(CONFIG)
    terraform(ws, "init")
    terraform(ws, "apply", "-auto-approve")
    return ws


@pytest.fixture
def repo(applied: Path, tmp_path: Path, db_url: str) -> Path:
    """A CI job's checkout: the Terraform configuration under infra/prod (its providers installed by
    `terraform init`), and state prod imported into the store from its apply."""
    checkout = tmp_path / "checkout"
    shutil.copytree(applied, checkout / "infra" / "prod", symlinks=True)
    r = run_kl("state", "import", "prod", str(checkout / "infra" / "prod" / "terraform.tfstate"), "--source", "apply")
    assert r.returncode == 0, r.stderr
    return checkout


@pytest.fixture(autouse=True)
def no_orphan_providers() -> Iterator[None]:
    before = provider_pids()
    yield
    assert_no_new_providers(before)


def drift_report(checkout: Path, state: str = "prod", providers: str = "infra/prod/.terraform/providers",
                 **env: str) -> tuple[int, str, str]:
    """examples/ci/drift-report.sh as the jobs call it, from the checkout's root; KL is this checkout's kl."""
    full_env = kl_env(KL=shlex.join([sys.executable, "-m", "kilolock"]), **env)
    r = subprocess.run(["sh", str(CI / "drift-report.sh"), state, "--workdir", "infra/prod",
                        "--provider-search-path", providers],
                       cwd=checkout, env=full_env, capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


def test_no_drift_exits_0_with_the_report_in_the_step_summary(repo: Path, tmp_path: Path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    code, out, err = drift_report(repo, GITHUB_STEP_SUMMARY=str(summary))
    report = (repo / "kl-drift.md").read_text()
    assert code == 0, err
    serial = json.loads((repo / "infra" / "prod" / "terraform.tfstate").read_text())["serial"]
    assert report.startswith(f"### Refresh of `prod`: succeeded (v{serial}, dry run, nothing recorded)\n"), report
    assert "4 checked, 0 changed, 0 failed" in report and "**`" not in report, report
    assert summary.read_text() == "earlier step\n" + report
    assert out == ""


def test_drift_exits_2_and_the_report_names_it(repo: Path, db_url: str):
    (repo / "infra" / "prod" / "out" / "two.txt").unlink()
    code, _, err = drift_report(repo)
    report = (repo / "kl-drift.md").read_text()
    assert code == 2, err
    assert f"**`{TWO}`**: deleted" in report and "The object no longer exists." in report, report
    assert "1 changed" in report, report
    # --dry-run: the check recorded nothing; kl drift still has nothing open.
    r = run_kl("drift", "prod", "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["drift"] == [], r.stdout


def test_an_error_exits_1_and_the_report_says_why(repo: Path, tmp_path: Path):
    summary = tmp_path / "summary.md"
    code, _, err = drift_report(repo, "prdo", GITHUB_STEP_SUMMARY=str(summary))
    report = (repo / "kl-drift.md").read_text()
    assert code == 1
    assert report.startswith("### Drift check of `prdo` failed (exit 1)\n\n```\nkl: "), report
    assert "prdo" in err and "'prod'" in report, report  # kl's own line: no such state, did you mean prod
    assert summary.read_text() == report


def test_a_refresh_that_fails_exits_1_after_its_own_report(repo: Path, tmp_path: Path):
    # A job that forgot `terraform init`: no provider anywhere kl looks (the workdir's
    # .terraform/providers and ~/.terraform.d/plugin-cache included): kl's refresh report, then why
    # the check failed.
    shutil.rmtree(repo / "infra" / "prod" / ".terraform")
    code, _, err = drift_report(repo, providers="nowhere", HOME=str(tmp_path))
    report = (repo / "kl-drift.md").read_text()
    assert code == 1, err
    assert report.startswith("### Refresh of `prod`: failed"), report
    assert "\n### Drift check of `prod` failed (exit 1)\n" in report and "kl: refresh failed" in report, report


def test_a_kl_that_does_not_run_is_an_error_not_drift(repo: Path, tmp_path: Path):
    # The default KL, `python3 kl.pyz`, in a job that did not fetch kl.pyz: python3 exits 2 for a
    # file it cannot open, which is the drift exit code. Without a report it is kl that failed.
    summary = tmp_path / "summary.md"
    env = kl_env(KL=shlex.join([sys.executable, str(tmp_path / "kl.pyz")]), GITHUB_STEP_SUMMARY=str(summary))
    r = subprocess.run(["sh", str(CI / "drift-report.sh"), "prod"], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=300)
    report = (repo / "kl-drift.md").read_text()
    assert r.returncode == 1, r.stderr
    assert report.startswith("### Drift check of `prod` failed (exit 2)\n"), report
    assert "kl.pyz" in report and summary.read_text() == report, report


class _GitLab:
    """Stands in for GitLab's REST API: records each request, answers as GitLab does (201 and the note)."""

    def __init__(self, status: int = 201) -> None:
        self.requests: list[dict[str, Any]] = []
        calls = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                calls.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                reply = json.dumps({"id": 901, "body": "..."}).encode() if status == 201 else b'{"message":"403 Forbidden"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/api/v4"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def gitlab() -> Iterator[_GitLab]:
    g = _GitLab()
    yield g
    g.close()


def mr_note(report: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CI_")}
    full_env.update(env)
    return subprocess.run([sys.executable, str(CI / "gitlab-mr-note.py"), str(report)], env=full_env,
                          capture_output=True, text=True, timeout=120)


def test_gitlab_job_posts_the_drift_report_as_a_merge_request_note(repo: Path, gitlab: _GitLab):
    (repo / "infra" / "prod" / "out" / "two.txt").unlink()
    code, _, err = drift_report(repo)
    assert code == 2, err
    report = repo / "kl-drift.md"
    r = mr_note(report, CI_API_V4_URL=gitlab.api, CI_PROJECT_ID="acme/infra", CI_MERGE_REQUEST_IID="7",
                KL_GITLAB_TOKEN="glpat-test-token")
    assert (r.returncode, r.stdout, r.stderr) == (0, "gitlab-mr-note: posted note 901 on merge request !7\n", "")
    [request] = gitlab.requests
    assert request["path"] == "/api/v4/projects/acme%2Finfra/merge_requests/7/notes"
    assert request["headers"]["private-token"] == "glpat-test-token"
    assert request["headers"]["content-type"] == "application/json"
    assert json.loads(request["body"]) == {"body": report.read_text()}
    assert TWO in json.loads(request["body"])["body"]


def test_gitlab_note_outside_a_merge_request_posts_nothing(tmp_path: Path, gitlab: _GitLab):
    report = tmp_path / "kl-drift.md"
    report.write_text("### Refresh of `prod`: succeeded\n")
    r = mr_note(report, CI_API_V4_URL=gitlab.api, CI_PROJECT_ID="42", KL_GITLAB_TOKEN="t")
    assert r.returncode == 0 and "nothing posted" in r.stdout, r.stderr
    assert gitlab.requests == []


def test_gitlab_note_refused_or_misconfigured_is_one_line_and_exit_1(tmp_path: Path):
    report = tmp_path / "kl-drift.md"
    report.write_text("### Refresh of `prod`: succeeded\n")
    refusing = _GitLab(status=403)
    try:
        r = mr_note(report, CI_API_V4_URL=refusing.api, CI_PROJECT_ID="42", CI_MERGE_REQUEST_IID="3", KL_GITLAB_TOKEN="t")
    finally:
        refusing.close()
    assert r.returncode == 1 and r.stderr.startswith("gitlab-mr-note: GitLab answered 403 ") and r.stderr.count("\n") == 1
    r = mr_note(report, CI_API_V4_URL="http://127.0.0.1:9/api/v4", CI_PROJECT_ID="42", CI_MERGE_REQUEST_IID="3")
    assert (r.returncode, r.stderr) == (1, ("gitlab-mr-note: KL_GITLAB_TOKEN not set (KL_GITLAB_TOKEN: a project access "
                                            "token with the api scope)\n"))


def _run_lines(doc: Any) -> list[str]:
    """Every shell line of a workflow or job: GitHub's `run` steps, GitLab's script sections."""
    if isinstance(doc, dict):
        found = []
        for key, value in doc.items():
            if key == "run" and isinstance(value, str):
                found.append(value)
            elif key in ("script", "before_script", "after_script") and isinstance(value, list):
                found += [str(v) for v in value]
            else:
                found += _run_lines(value)
        return found
    if isinstance(doc, list):
        return [line for item in doc for line in _run_lines(item)]
    return []


@pytest.mark.parametrize("name", ["github-drift.yml", "gitlab-drift.yml"])
def test_the_ci_files_parse_and_call_the_scripts_tested_here(name: str):
    doc = yaml.safe_load((CI / name).read_text())
    lines = "\n".join(_run_lines(doc))
    assert "sh examples/ci/drift-report.sh " in lines, lines
    for word in lines.split():
        if word.startswith("examples/"):
            assert (REPO / word).is_file(), word
    if name.startswith("github"):
        # YAML 1.1 reads the key `on` as true: GitHub reads it as on.
        assert set(doc[True]) == {"schedule", "pull_request", "workflow_dispatch"}
        assert doc["jobs"]["drift"]["steps"]
    else:
        job = doc["kl-drift"]
        assert "python3 examples/ci/gitlab-mr-note.py kl-drift.md" in job["script"]
        assert job["allow_failure"] == {"exit_codes": [2]} and job["artifacts"]["paths"] == ["kl-drift.md"]
